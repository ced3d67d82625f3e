//===- Compare.cpp - Alignment of tensors and the error ratio -------------===//
#include "Diagnoser.h"

#include "ekka/Align/Transforms.h"
#include "ekka/Support/Error.h"
#include "ekka/Support/Progress.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

using namespace llvm;

namespace ekka {
namespace detail {

std::optional<double> Diagnoser::ratio(const TensorRecord *A, const TensorRecord *B,
                                       const TensorRecord *C, int64_t TargetCall) {
  if (!A || !B)
    return std::nullopt;
  // A module's output is the next one's input: the same three tensors
  // compared again give the same ratio. Remembered when the target's
  // values depend on the tensors alone (no steps merged, no shards).
  bool Memo = !MergeSteps && Peers.empty();
  std::tuple<int64_t, int64_t, int64_t> Key;
  if (Memo) {
    const TensorRecord *PA = producer(T, A), *PB = producer(R, B),
                       *PC = C ? producer(*F, C) : nullptr;
    Memo = PA && PB && (!C || PC);
    if (Memo) {
      Key = {PA->Id, PB->Id, PC ? PC->Id : -1};
      if (auto It = Ratios.find(Key); It != Ratios.end())
        return It->second;
    }
  }
  // The layout: the one swap the shapes force, else, where they leave it
  // open, a mapping rule's, what the component's earlier calls validated,
  // or as it is unless a backed search validates a swap.
  bool Aligned = !A->Shape.empty() && !B->Shape.empty() && !sharded(A, B->Shape) &&
                 !(MergeSteps && LaterSteps.count(TargetCall));
  std::optional<std::pair<int, int>> Forced;
  if (Aligned)
    Forced = transposition(A->Shape, B->Shape);
  bool Open = Aligned && !Forced && layoutOpen(A, B);
  // The component, as its layouts are remembered (named only when needed:
  // this is the comparison's every call).
  std::string Component = Forced || Open ? layoutKey(A) : std::string();
  if (Forced && !Component.empty())
    Learned.try_emplace(Component, Forced); // what the shapes said, for its open calls
  std::pair<int64_t, int64_t> Pair{A->Id, B->Id};
  LayoutChoice Choice;
  bool Settled = false;
  if (Open) {
    if (auto It = Layouts.find(Pair); It != Layouts.end()) {
      Choice = It->second;
      Settled = true;
    } else if (auto S = settledLayout(A)) {
      Choice = *S;
      Settled = true;
    }
    Current = Choice.Swap;
  }
  // A reference view read in its memory order, where only that meets the
  // target's layout.
  RefSwap = memoryOrder(A, B);
  auto Compare = [&] {
    std::optional<double> Out;
    if (!RefSwap)
      Out = ratioFromBytes(A, B, C, TargetCall);
    if (!Out)
      Out = ratioOf(targetValues(A, TargetCall, RefSwap ? swapped(B->Shape, *RefSwap) : B->Shape),
                    A->Type, B, C);
    return Out;
  };
  auto Out = Compare();
  if (Open && !Settled) {
    if (!elevated(Out)) {
      if (!Component.empty())
        Learned.try_emplace(Component, std::nullopt); // as it is, validated
    } else if (!Component.empty() && !SearchFailed.count(Component)) {
      // Departs as it is: a swap the strides back, validated on samples,
      // then on every element.
      LayoutChoice Found = searchLayout(A, B, C);
      std::optional<double> Swapped;
      if (Found.Swap) {
        Current = Found.Swap;
        Swapped = Compare();
      }
      if (Swapped && !elevated(Swapped)) {
        Choice = Found;
        Out = Swapped;
        Learned.try_emplace(Component, Found.Swap);
      } else {
        SearchFailed.insert(Component); // its later calls are not searched again
      }
    }
    Layouts[Pair] = Choice;
  }
  if (Open && Choice.Swap && !Choice.How.empty() && A->Role == "output")
    Chosen.try_emplace(A->Id, Choice);
  Current.reset();
  RefSwap.reset();
  if (Memo)
    Ratios[Key] = Out;
  return Out;
}

std::optional<std::pair<int, int>> Diagnoser::memoryOrder(const TensorRecord *A,
                                                          const TensorRecord *B) const {
  if (A->Shape.empty() || B->Shape.empty())
    return std::nullopt;
  auto Swap = viewSwap(B->Shape, B->Strides);
  // One step of several joined along the tokens ([24, heads, dim] of a
  // prefill against [1, heads, 27, dim], a view of [1, 27, heads, dim]:
  // Gemma-3's q_norm): its other dimensions are the view's memory order's,
  // not its shape's, and the tokens differ, which the shapes alone do not
  // tell apart from a layout as it is.
  if (Swap) {
    Dims SA = squeezeLeading(A->Shape), SB = squeezeLeading(B->Shape),
         Memory = squeezeLeading(swapped(B->Shape, *Swap));
    if (SA.size() > 1 && SA.size() == Memory.size() && SA.size() == SB.size() &&
        SA[0] != Memory[0] && std::equal(SA.begin() + 1, SA.end(), Memory.begin() + 1) &&
        !std::equal(SA.begin() + 1, SA.end(), SB.begin() + 1))
      return Swap;
  }
  // Comparable as laid out (the common case, decided first): nothing to do.
  if (sameFeatures(A->Shape, B->Shape) || transposition(A->Shape, B->Shape))
    return std::nullopt;
  if (!Swap)
    return std::nullopt;
  Dims Memory = swapped(B->Shape, *Swap);
  if (!sameFeatures(A->Shape, Memory) && !transposition(A->Shape, Memory))
    return std::nullopt;
  return Swap;
}

bool Diagnoser::layoutOpen(const TensorRecord *A, const TensorRecord *B) const {
  return squeezeLeading(A->Shape) == squeezeLeading(B->Shape) &&
         !transpositions(A->Shape, B->Shape).empty();
}

std::string Diagnoser::layoutKey(const TensorRecord *A) const {
  if (A->Owner != TensorOwner::ModuleCall)
    return "";
  const ModuleCallRecord *M = T.CallById.lookup(A->OwnerId);
  if (!M)
    return "";
  return starred(M->Path).first + "\n" + A->Role + "\n" + std::to_string(A->Index);
}

std::optional<Diagnoser::LayoutChoice> Diagnoser::settledLayout(const TensorRecord *A) const {
  Dims S = squeezeLeading(A->Shape);
  if (auto It = RuleLayouts.find(A->OwnerId);
      It != RuleLayouts.end() && A->Owner == TensorOwner::ModuleCall && A->Role == "output") {
    auto [I, J] = It->second;
    if (size_t(J) < S.size() && S[size_t(I)] == S[size_t(J)])
      return LayoutChoice{It->second, "by the mapping"};
    return LayoutChoice{};
  }
  if (auto It = Learned.find(layoutKey(A)); It != Learned.end())
    return LayoutChoice{It->second, "as the component's earlier calls"};
  return std::nullopt;
}

/// Whether tensor \p X's recorded strides show it as a transposed view
/// (viewSwap) of dimensions \p I and \p J of its shape, leading ones
/// squeezed (HF's `.transpose(1, 2)` of [1, T, H, D]).
static bool stridesSwap(const TensorRecord *X, int I, int J) {
  auto Swap = viewSwap(X->Shape, X->Strides);
  int Lead = int(X->Shape.size() - squeezeLeading(X->Shape).size());
  return Swap && *Swap == std::make_pair(Lead + I, Lead + J);
}

Diagnoser::LayoutChoice Diagnoser::searchLayout(const TensorRecord *A, const TensorRecord *B,
                                                const TensorRecord *C) {
  if (A->Stats && B->Stats) {
    double NA = std::sqrt(A->Stats->SumSq), NB = std::sqrt(B->Stats->SumSq);
    if (!(std::abs(NA - NB) <= 0.05 * std::max(NA, NB)))
      return {};
  }
  auto XT = T.values(A), XR = R.values(B);
  std::optional<Elements> YR;
  if (F && C)
    YR = F->values(C);
  if (!XT || !XR || XT->size() != XR->size() || XT->empty())
    return {};
  // Evenly spread elements, the same for every candidate.
  size_t N = XR->size(), Samples = std::min<size_t>(N, 4096);
  auto Sample = [&](const Elements &X) {
    Elements Out(Samples);
    for (size_t K = 0; K < Samples; ++K)
      Out[K] = X[K * N / Samples];
    return Out;
  };
  Elements SR = Sample(*XR), SY = YR && YR->size() == N ? Sample(*YR) : Elements();
  Dims S = squeezeLeading(A->Shape);
  std::optional<std::pair<int, int>> Found;
  for (auto [I, J] : transpositions(A->Shape, B->Shape)) {
    // Only what one of the two programs did in memory.
    if (!stridesSwap(A, I, J) && !stridesSwap(B, I, J))
      continue;
    auto V = transpose(*XT, S, I, J);
    if (!V)
      continue;
    auto Ratio = ratioValues(Sample(*V), A->Type, SR, B->Type, SY);
    if (!Ratio || elevated(Ratio))
      continue;
    if (Found)
      return {}; // two layouts agree: the values do not decide
    Found = std::make_pair(I, J);
  }
  if (!Found)
    return {};
  return {Found, "found by a search (a transposed view by the strides) validated on sums "
                 "and sampled elements"};
}

std::optional<double> Diagnoser::ratioOf(std::optional<std::vector<double>> XT, DType TargetType,
                                         const TensorRecord *B, const TensorRecord *C) {
  auto XR = R.values(B);
  if (XR && RefSwap)
    XR = transpose(*XR, B->Shape, RefSwap->first, RefSwap->second);
  if (!XT || !XR)
    return std::nullopt;
  std::optional<Elements> YR;
  if (F && C) {
    YR = F->values(C);
    // The FP32 run of the same program: the same view.
    if (YR && RefSwap)
      YR = C->Shape == B->Shape ? transpose(*YR, C->Shape, RefSwap->first, RefSwap->second)
                                : std::nullopt;
  }
  return joinedRatio(*XT, TargetType, *XR, YR ? ArrayRef<double>(*YR) : std::nullopt, B->Type);
}

std::optional<double> Diagnoser::joinedRatio(ArrayRef<double> XT, DType TargetType,
                                             ArrayRef<double> XR, ArrayRef<double> YR,
                                             DType RefType) {
  // The steps joined into XT, each alone: where an output of a call was
  // joined along its rows, in the reference's own order.
  JoinedSteps Joined = std::move(LastJoined);
  LastJoined = JoinedSteps();
  if (Joined.A && Joined.A->Role == "output" && !RefSwap &&
      Joined.Rows.size() > 1 && XT.size() == XR.size()) {
    int64_t Total = 0;
    for (const auto &[Step, Rows] : Joined.Rows)
      Total += Rows;
    if (Total > 0 && XT.size() % size_t(Total) == 0) {
      size_t Row = XT.size() / size_t(Total), Off = 0;
      bool WithY = YR.size() == XT.size();
      std::vector<std::pair<int64_t, double>> Steps;
      // The whole's sums are the steps' added: one pass for both, unless a
      // value is not finite (each ratio is then taken element by element).
      RatioSums Whole;
      for (const auto &[Step, Rows] : Joined.Rows) {
        size_t Len = size_t(Rows) * Row;
        auto Part = [&](ArrayRef<double> X) { return X.slice(Off, Len); };
        ArrayRef<double> PT = Part(XT), PR = Part(XR), PY = WithY ? Part(YR) : ArrayRef<double>();
        Off += Len;
        if (Len == 0)
          continue;
        RatioSums S = ratioSums(PT, PR, PY);
        Whole += S;
        auto Ratio = S.Finite ? std::optional(ratioFromSums(S, WithY, TargetType, RefType))
                              : ratioValues(PT, TargetType, PR, RefType, PY);
        if (Ratio)
          Steps.emplace_back(Step, *Ratio);
      }
      // The first output's are the call's; a later output's (a fused
      // norm's residual) raise them where they are larger.
      std::vector<std::pair<int64_t, double>> &Call = StepRatios[Joined.Call];
      if (Joined.A->Index == 0 || Call.empty())
        Call = std::move(Steps);
      else
        for (auto &[Step, Ratio] : Call)
          for (const auto &[Other, R] : Steps)
            if (Other == Step)
              Ratio = std::max(Ratio, R);
      if (Whole.Finite && Off == XT.size())
        return ratioFromSums(Whole, WithY, TargetType, RefType);
    }
  }
  return ratioValues(XT, TargetType, XR, RefType, YR);
}

double Diagnoser::ratioFromSums(const RatioSums &S, bool WithFP32, DType TargetType,
                                DType RefType) const {
  if (WithFP32) {
    double Den = std::max(std::sqrt(S.RY), unitRoundoff(RefType) * std::sqrt(S.YY));
    return std::sqrt(S.TY) / (Den + 1e-30);
  }
  if (S.TR == 0)
    return 0.0;
  return std::sqrt(S.TR) /
         (O.NoiseUnits * std::max(unitRoundoff(RefType), unitRoundoff(TargetType)) *
              std::sqrt(S.RR) +
          1e-30);
}

std::optional<double> Diagnoser::ratioFromBytes(const TensorRecord *A, const TensorRecord *B,
                                                const TensorRecord *C, int64_t TargetCall) {
  if (MergeSteps && LaterSteps.count(TargetCall))
    return std::nullopt;
  if (A->Shape.empty() || B->Shape.empty() || sharded(A, B->Shape) || layoutOf(A, B->Shape))
    return std::nullopt;
  auto XT = T.rawBytes(A), XR = R.rawBytes(B);
  std::optional<StringRef> YR;
  if (C && F) {
    YR = F->rawBytes(C);
    if (!YR)
      return std::nullopt;
  }
  int64_t N = numElements(B->Shape);
  if (!XT || !XR || N <= 0 || numElements(A->Shape) != N || (C && numElements(C->Shape) != N))
    return std::nullopt;
  auto S = ratioSums(A->Type, *XT, B->Type, *XR, C ? C->Type : DType::F32, YR ? *YR : StringRef(),
                     size_t(N));
  if (!S || !S->Finite)
    return std::nullopt;
  // Bytes that are not the ones their statistics were computed from: read
  // again as values, which says so (Side::matchesStats).
  if (!T.matchesSum(*T.source(A), S->ST, size_t(N)) ||
      !R.matchesSum(*R.source(B), S->SR, size_t(N)) ||
      (YR && !F->matchesSum(*F->source(C), S->SY, size_t(N))))
    return std::nullopt;
  return ratioFromSums(*S, YR.has_value(), A->Type, B->Type);
}

std::optional<double> Diagnoser::ratioValues(ArrayRef<double> XT, DType TargetType,
                                             ArrayRef<double> XR, DType RefType,
                                             ArrayRef<double> YR) const {
  if (XT.size() != XR.size() || XT.empty())
    return std::nullopt;
  if (YR.size() != XT.size())
    YR = {};
  // The common case, every value finite: all sums in one pass.
  if (RatioSums S = ratioSums(XT, XR, YR); S.Finite)
    return ratioFromSums(S, !YR.empty(), TargetType, RefType);
  // A NaN or infinity where the reference has none (or the reverse) is a
  // divergence whatever the scale: R = infinity.
  if (std::isinf(distance(XT, XR)))
    return std::numeric_limits<double>::infinity();
  if (!YR.empty()) {
    double Floor = unitRoundoff(RefType) * norm(YR);
    double Den = std::max(distance(XR, YR), Floor);
    if (std::isinf(Den))
      Den = Floor; // the reference's own NaNs: measure against roundoff
    return distance(XT, YR) / (Den + 1e-30);
  }
  double Den = O.NoiseUnits * std::max(unitRoundoff(RefType), unitRoundoff(TargetType)) * norm(XR);
  double Num = distance(XT, XR);
  if (Num == 0)
    return 0.0;
  return Num / (Den + 1e-30);
}

std::optional<double> Diagnoser::callRatio(const ModuleCallRecord &TC, const ModuleCallRecord &RC,
                                           const ModuleCallRecord *FC, StringRef Role,
                                           bool *AllCompared, bool *ResidualPair) {
  std::optional<double> Worst;
  if (AllCompared)
    *AllCompared = true;
  RoleTensors TT = roleTensors(T, TC.Id, Role), RT = roleTensors(R, RC.Id, Role);
  RoleTensors FT = FC ? roleTensors(*F, FC->Id, Role) : RoleTensors();
  // Only integer inputs (token ids, positions) on both sides: nothing
  // floating flows in, nothing to depart (the root's ids are checked
  // first, as inputs).
  if (Role == "input" && TT.empty() && RT.empty() && T.ByCall.count(TC.Id))
    return 0.0;
  bool Summed = false;
  int64_t First = 0;
  if (Role == "output")
    StepRatios.erase(TC.Id); // this comparison's, output by output
  if (auto Pair = residualPairRatio(TC, Role, TT, RT, FT, Summed)) {
    if (ResidualPair)
      *ResidualPair = Summed;
    Worst = Pair;
    First = 2; // the pair stood for the reference's first tensor
  }
  for (const auto &[Index, X] : TT) {
    if (Index < First)
      continue;
    int64_t RefIndex = Index - (First ? 1 : 0);
    if (auto Ratio = ratio(X, at(RT, RefIndex), at(FT, RefIndex), TC.Id))
      Worst = std::max(Worst.value_or(0), *Ratio);
    else if (AllCompared && Role == "input")
      *AllCompared = false;
  }
  if (Role == "output" && !First)
    if (auto Residual = residualOutputRatio(TC, RC, FC, TT, RT))
      Worst = std::max(Worst.value_or(0), *Residual);
  return Worst;
}

std::optional<double> Diagnoser::residualOutputRatio(const ModuleCallRecord &TC,
                                                     const ModuleCallRecord &RC,
                                                     const ModuleCallRecord *FC,
                                                     const RoleTensors &TT,
                                                     const RoleTensors &RT) {
  const TensorRecord *A = at(TT, 0), *B = at(TT, 1), *Ref = at(RT, 0);
  if (TT.size() != 2 || !A || !B || !Ref || A->Shape != B->Shape || at(RT, 1))
    return std::nullopt;
  // A fused add + norm, a call of no children: its inputs (hidden,
  // residual) add up to the reference norm's input, and so must the
  // residual it returns. (A decoder layer's pair that did not add up to
  // the reference's output is no norm's.)
  if (TargetParents.count(TC.Id))
    return std::nullopt;
  RoleTensors TI = roleTensors(T, TC.Id, "input"), RI = roleTensors(R, RC.Id, "input");
  RoleTensors FI = FC ? roleTensors(*F, FC->Id, "input") : RoleTensors();
  bool Summed = false;
  if (!residualPairRatio(TC, "input", TI, RI, FI, Summed) || !Summed)
    return std::nullopt;
  const TensorRecord *Sum = at(RI, 0);
  if (!Sum || Sum->Shape != Ref->Shape)
    return std::nullopt;
  return ratio(B, Sum, at(FI, 0), TC.Id);
}

std::vector<const TensorRecord *> Diagnoser::uncomparedInputs(const ComponentRatio &C) {
  std::vector<const TensorRecord *> Out;
  const ModuleCallRecord *RC = refCall(C.CallId);
  if (!RC)
    return Out;
  RoleTensors TT = roleTensors(T, C.CallId, "input"), RT = roleTensors(R, RC->Id, "input");
  for (const auto &[Index, X] : TT)
    if (!ratio(X, at(RT, Index), nullptr, C.CallId))
      Out.push_back(X);
  return Out;
}

std::vector<const TensorRecord *> Diagnoser::inputsNotCompared(const ComponentRatio &C) {
  if (refCall(C.CallId))
    return uncomparedInputs(C);
  std::vector<const TensorRecord *> Out;
  for (const auto &[Index, X] : roleTensors(T, C.CallId, "input"))
    Out.push_back(X);
  return Out;
}

const TensorRecord *Diagnoser::departingInput(const ComponentRatio &C) {
  const ModuleCallRecord *RC = refCall(C.CallId);
  RoleTensors TT = roleTensors(T, C.CallId, "input");
  if (RC) {
    RoleTensors RT = roleTensors(R, RC->Id, "input");
    RoleTensors FT;
    if (const ModuleCallRecord *FC = fp32Call(RC))
      FT = roleTensors(*F, FC->Id, "input");
    for (const auto &[Index, X] : TT)
      if (elevated(ratio(X, at(RT, Index), at(FT, Index), C.CallId)))
        return X;
  }
  return TT.empty() ? nullptr : TT.begin()->second;
}

Diagnoser::RoleTensors Diagnoser::roleTensors(const Side &S, int64_t Call, StringRef Role) {
  RoleTensors Out;
  auto C = S.ByCall.find(Call);
  if (C == S.ByCall.end())
    return Out;
  auto R = C->second.find(Role.str());
  if (R == C->second.end())
    return Out;
  if (Role != "input")
    return R->second;
  int64_t N = 0;
  for (const auto &[Index, X] : R->second)
    if (unitRoundoff(X->Type) != 0 && !additiveMask(S, X))
      Out[N++] = X;
  return Out;
}

bool Diagnoser::additiveMask(const Side &S, const TensorRecord *X) {
  // An additive attention mask: zeros where a token may attend, the
  // dtype's lowest (or -inf) where not. Each engine builds its own for its
  // own layout of the batch (a paged engine's spans the step's tokens and
  // every cached one), so it is no data to compare; what it does shows in
  // the attention's output.
  const TensorRecord *P = producer(S, X);
  const std::optional<TensorStats> &St = P ? P->Stats : X->Stats;
  // (fp16's lowest is -65504; no activation of a real model sits there
  // with a maximum of exactly zero.)
  return X->Shape.size() == 4 && St && St->Max == 0 && (St->Min <= -6e4 || St->InfCount > 0);
}

std::optional<double> Diagnoser::residualPairRatio(const ModuleCallRecord &TC, StringRef Role,
                                                   const RoleTensors &TT, const RoleTensors &RT,
                                                   const RoleTensors &FT, bool &Summed) {
  const TensorRecord *A = at(TT, 0), *B = at(TT, 1), *Ref = at(RT, 0);
  if (!A || !B || !Ref)
    return std::nullopt;
  if (A->Shape != B->Shape || unitRoundoff(A->Type) == 0 || unitRoundoff(Ref->Type) == 0)
    return std::nullopt;
  // The reference has no second tensor of that shape in that place.
  if (const TensorRecord *Ref1 = at(RT, 1); Ref1 && Ref1->Shape == Ref->Shape)
    return std::nullopt;
  if (Role == "output" && TT.size() != 2)
    return std::nullopt;
  const TensorRecord *Fp = at(FT, 0);
  auto First = targetValues(A, TC.Id, Ref->Shape);
  JoinedSteps Rows = LastJoined; // the steps' rows, the same for both
  auto Second = targetValues(B, TC.Id, Ref->Shape);
  LastJoined = JoinedSteps(); // the first alone is no reading of each step
  std::optional<double> Alone = ratioOf(First, A->Type, Ref, Fp), Sum;
  if (First && Second && First->size() == Second->size()) {
    std::vector<double> Added = *First;
    for (size_t I = 0; I < Added.size(); ++I)
      Added[I] += (*Second)[I];
    LastJoined = Rows; // the sum is: each step's share of it
    Sum = ratioOf(std::move(Added), A->Type, Ref, Fp);
  }
  // Only the sum is a reading of its own; when the first tensor alone is
  // closer, the tensors are compared one by one as usual (so that a second
  // input that matches nothing still counts as not compared), and they say
  // each step's.
  Summed = Sum && (!Alone || *Sum < *Alone);
  if (!Summed && Role == "output")
    StepRatios.erase(TC.Id);
  return Summed ? Sum : std::nullopt;
}

std::optional<std::vector<double>> Diagnoser::targetValues(const TensorRecord *A, int64_t Call,
                                                           const Dims &RefShape) {
  LastJoined = JoinedSteps();
  // A tensor-parallel shard: gathered from the ranks first.
  bool Gather = sharded(A, RefShape);
  if (RefShape.empty() || A->Shape.empty()) // a scalar (a loss, a scale): as it is
    return T.values(A);
  int64_t Ranks = int64_t(Peers.size() + 1), RefFeatures = tokenMajor(RefShape).back();
  int64_t Local = Gather ? RefFeatures / Ranks : RefFeatures;
  auto Values = [&](const TensorRecord *X) { return Gather ? gathered(X, Local) : T.values(X); };
  auto Steps = LaterSteps.find(Call);
  if (!MergeSteps || Steps == LaterSteps.end()) {
    auto V = Values(A);
    // A layout the reference transposes ([tokens, heads, dim] against
    // [1, heads, tokens, dim]): the one swap the shapes leave, if any.
    if (V && !Gather)
      if (auto Swap = layoutOf(A, RefShape))
        return transpose(*V, squeezeLeading(A->Shape), Swap->first, Swap->second);
    return V;
  }
  std::vector<const TensorRecord *> Parts = {A};
  for (const ModuleCallRecord *Later : Steps->second)
    if (const TensorRecord *X = T.tensor(Later->Id, A->Role, A->Index))
      Parts.push_back(X);
  size_t Rank = A->Shape.size();
  // [tokens, hidden] meets [1, tokens, hidden]: a serving engine flattens
  // the batch of one sequence.
  Dims Ref = RefShape;
  while (Ref.size() > Rank && Ref.front() == 1)
    Ref.erase(Ref.begin());
  // A head reshape ([tokens, heads * dim] against [tokens, heads, dim]):
  // both sides as [tokens, features].
  bool Reshaped = Rank != Ref.size() || Gather;
  if (Reshaped) {
    Ref = tokenMajor(Ref);
    Rank = Ref.size();
  }
  auto ShapeOf = [&](const TensorRecord *X) {
    Dims S = Reshaped ? rowsOf(X->Shape, Local) : X->Shape;
    if (Gather && S.size() == 2)
      S[1] *= Ranks;
    return S;
  };
  if (Rank != Ref.size() || ShapeOf(A).size() != Rank)
    return std::nullopt;
  std::optional<size_t> Dim;
  for (size_t D = 0; D < Rank && !Dim; ++D) {
    int64_t Sum = 0;
    bool Others = true;
    for (const TensorRecord *X : Parts) {
      Dims S = ShapeOf(X);
      if (S.size() != Rank)
        return std::nullopt;
      Sum += S[D];
      for (size_t E = 0; E < Rank; ++E)
        Others &= E == D || S[E] == Ref[E];
    }
    if (Others && Sum == Ref[D])
      Dim = D;
  }
  if (!Dim)
    return std::nullopt; // the steps do not add up to the reference: not comparable
  std::vector<std::vector<double>> Merged;
  std::vector<Dims> Shapes;
  for (const TensorRecord *X : Parts) {
    auto V = Values(X);
    if (!V)
      return std::nullopt;
    Merged.push_back(std::move(*V));
    Shapes.push_back(ShapeOf(X));
  }
  // Joined in blocks, one per step (the dimensions before the tokens' are
  // ones): each step's share can be compared alone.
  for (size_t I = 0; I < Parts.size(); ++I) {
    const ModuleCallRecord *M = T.CallById.lookup(Parts[I]->OwnerId);
    if (!M || llvm::any_of(ArrayRef<int64_t>(Shapes[I]).take_front(*Dim),
                           [](int64_t D) { return D != 1; }))
      break;
    LastJoined.A = A;
    LastJoined.Call = Call;
    LastJoined.Rows.emplace_back(M->Step, Shapes[I][*Dim]);
  }
  if (LastJoined.Rows.size() != Parts.size())
    LastJoined = JoinedSteps();
  auto Out = concatenate(Merged, Shapes, int(*Dim));
  // Requests served together (a batch, interleaved step by step) against a
  // reference that ran them one after another: the rows put in its order.
  int64_t Rows = 0;
  for (const Dims &S : Shapes)
    Rows += S[*Dim];
  auto Order = RowOrders.find(Rows);
  if (Out && Order != RowOrders.end() &&
      llvm::all_of(ArrayRef<int64_t>(Shapes[0]).take_front(*Dim),
                   [](int64_t D) { return D == 1; })) {
    size_t Width = Out->size() / size_t(Rows);
    Elements Reordered(Out->size());
    for (size_t R = 0; R < Order->second.size(); ++R)
      std::copy_n(Out->begin() + Order->second[R] * Width, Width,
                  Reordered.begin() + R * Width);
    LastJoined = JoinedSteps(); // a step's rows are no longer one block
    return Reordered;
  }
  return Out;
}

void Diagnoser::groupSteps() {
  auto Steps = [](const Side &S) {
    int64_t Max = 0;
    for (const ModuleCallRecord &M : S.Calls)
      Max = std::max(Max, M.Step);
    return Max;
  };
  MergeSteps = Steps(R) == 1 && Steps(T) > 1;
  if (!MergeSteps)
    return;
  for (const ModuleCallRecord &M : T.Calls) {
    if (M.Step == 1)
      continue;
    auto [Step, Path, Occurrence] = T.KeyOf.lookup(M.Id);
    auto First = T.ByKey.find(std::make_tuple(int64_t(1), Path, Occurrence));
    if (First != T.ByKey.end())
      LaterSteps[First->second->Id].push_back(&M);
  }
}

std::vector<const TensorRecord *> Diagnoser::peerTensors(const TensorRecord *X) const {
  std::vector<const TensorRecord *> Out;
  if (Peers.empty() || !X || X->Owner != TensorOwner::ModuleCall)
    return Out;
  auto Key = T.KeyOf.lookup(X->OwnerId);
  for (Side *P : Peers) {
    auto It = P->ByKey.find(Key);
    const TensorRecord *Y =
        It == P->ByKey.end() ? nullptr : P->tensor(It->second->Id, X->Role, X->Index);
    if (!Y)
      return {};
    Out.push_back(Y);
  }
  return Out;
}

bool Diagnoser::replicated(const TensorRecord *X) const {
  auto Ps = peerTensors(X);
  const TensorRecord *A = producer(T, X);
  for (size_t I = 0; I < Ps.size(); ++I) {
    const TensorRecord *B = producer(*Peers[I], Ps[I]);
    if (!A || !B || !A->Stats || !B->Stats)
      continue;
    auto Same = [](double X, double Y) { return X == Y || (X != X && Y != Y); };
    if (!Same(A->Stats->Sum, B->Stats->Sum) || !Same(A->Stats->SumSq, B->Stats->SumSq) ||
        !Same(A->Stats->Min, B->Stats->Min) || !Same(A->Stats->Max, B->Stats->Max))
      return false;
  }
  return true;
}

bool Diagnoser::sharded(const TensorRecord *X, const Dims &RefShape) const {
  if (Peers.empty() || !X || X->Shape.empty() || RefShape.empty() ||
      unitRoundoff(X->Type) == 0) // ids and positions are never shards
    return false;
  // Features only: the tokens may be one of several steps' share.
  int64_t Ranks = int64_t(Peers.size() + 1), Features = tokenMajor(RefShape).back();
  return Features % Ranks == 0 && !rowsOf(X->Shape, Features / Ranks).empty() &&
         !peerTensors(X).empty();
}

std::optional<std::vector<double>> Diagnoser::gathered(const TensorRecord *X, int64_t Local) const {
  auto Ps = peerTensors(X);
  // A complex tensor's values are its parts, two per element: the shards'
  // rows are not what the shape says. Not gathered (not compared).
  if (partType(X->Type) != X->Type)
    return std::nullopt;
  auto V = T.values(X);
  if (!V || Ps.empty())
    return std::nullopt;
  std::vector<Elements> Values;
  Values.push_back(std::move(*V));
  for (size_t I = 0; I < Ps.size(); ++I) {
    auto W = Peers[I]->values(Ps[I]);
    if (!W)
      return std::nullopt;
    Values.push_back(std::move(*W));
  }
  return gatherShards(Values, Local, GatherParts);
}

} // namespace detail
} // namespace ekka
