//===- Side.cpp - Loading, joining and reading one trace ------------------===//
#include "Side.h"

#include "ekka/Align/Transforms.h"
#include "ekka/Analysis/Diagnosis.h"
#include "ekka/Analysis/TensorMath.h"
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

Error Side::load(TraceReader &R) {
  Reader = &R;
  Stages = {&R};
  if (Error E = append(R, 0))
    return E;
  return index();
}

Error Side::loadStages(ArrayRef<TraceReader *> Readers) {
  Reader = Readers.front();
  Stages.assign(Readers.begin(), Readers.end());
  for (size_t I = 0; I < Readers.size(); ++I)
    if (Error E = append(*Readers[I], int64_t(I)))
      return E;
  std::map<std::pair<int64_t, std::string>, int64_t> LastStage;
  for (const ModuleCallRecord &M : Calls)
    LastStage[{M.Step, M.Path}] = std::max(LastStage[{M.Step, M.Path}], M.Id >> StageShift);
  std::map<std::pair<int64_t, std::string>, int64_t> Kept; // -> the kept call's id
  for (const ModuleCallRecord &M : Calls)
    if ((M.Id >> StageShift) == LastStage[{M.Step, M.Path}])
      Kept.try_emplace({M.Step, M.Path}, M.Id);
  // Where each call sorts: its stage and place; a kept call takes the
  // place of its module's first entry (a parent before its children).
  using Place = std::tuple<int64_t, int64_t, int64_t>; // step, stage, seq
  std::map<int64_t, Place> PlaceOf;
  DenseMap<int64_t, int64_t> Replaced;
  std::vector<ModuleCallRecord> Joined;
  for (ModuleCallRecord &M : Calls) {
    Place Here{M.Step, M.Id >> StageShift, M.Seq};
    bool Dropped = (M.Id >> StageShift) != LastStage[{M.Step, M.Path}];
    int64_t Id = Dropped ? Kept[{M.Step, M.Path}] : M.Id;
    auto [It, New] = PlaceOf.try_emplace(Id, Here);
    if (!New)
      It->second = std::min(It->second, Here);
    if (Dropped)
      Replaced[M.Id] = Id;
    else
      Joined.push_back(std::move(M));
  }
  for (ModuleCallRecord &M : Joined)
    if (M.ParentId)
      if (auto It = Replaced.find(*M.ParentId); It != Replaced.end())
        M.ParentId = It->second;
  // What a dropped call ran directly (ops, kernels) belongs to the kept
  // call now, for the drill-down; its own tensors do not (they would mix
  // with the kept call's inputs and outputs).
  auto Reattach = [&](std::optional<int64_t> &Call) {
    if (Call)
      if (auto It = Replaced.find(*Call); It != Replaced.end())
        Call = It->second;
  };
  for (OpRecord &O : Ops)
    Reattach(O.ModuleCallId);
  for (KernelRecord &K : Kernels)
    Reattach(K.ModuleCallId);
  std::stable_sort(Joined.begin(), Joined.end(),
                   [&](const ModuleCallRecord &A, const ModuleCallRecord &B) {
                     return PlaceOf[A.Id] < PlaceOf[B.Id];
                   });
  for (size_t I = 0; I < Joined.size(); ++I)
    Joined[I].Seq = int64_t(I);
  Calls = std::move(Joined);
  return index();
}

Error Side::append(TraceReader &R, int64_t Stage) {
  int64_t Off = Stage << StageShift;
  auto Shift = [Off](std::optional<int64_t> &Id) {
    if (Id)
      *Id += Off;
  };
  auto C = R.moduleCalls();
  if (!C)
    return C.takeError();
  auto T = R.tensors();
  if (!T)
    return T.takeError();
  auto O = R.ops();
  if (!O)
    return O.takeError();
  auto K = R.kernels();
  if (!K)
    return K.takeError();
  if (Error E = R.checkReferences(*C, *O, *K, *T))
    return E;
  for (ModuleCallRecord &M : *C) {
    M.Id += Off;
    Shift(M.ParentId);
  }
  for (TensorRecord &X : *T) {
    X.Id += Off;
    X.OwnerId += Off;
    Shift(X.SourceId);
  }
  for (OpRecord &X : *O) {
    X.Id += Off;
    X.Seq += Off;
    Shift(X.ModuleCallId);
  }
  for (KernelRecord &X : *K) {
    X.Id += Off;
    X.Seq += Off;
    Shift(X.OpId);
    Shift(X.ModuleCallId);
  }
  // The rows are moved, not copied: a first stage's vectors become the
  // side's, a later one's join them, in room that at least doubles when it
  // grows (reserving just enough for each would move every row held so
  // far again at each of many stages).
  auto Join = [](auto &Into, auto &&Rows) {
    if (Into.empty()) {
      Into = std::move(Rows);
      return;
    }
    if (size_t Needed = Into.size() + Rows.size(); Into.capacity() < Needed)
      Into.reserve(std::max(Needed, 2 * Into.capacity()));
    std::move(Rows.begin(), Rows.end(), std::back_inserter(Into));
    Rows = {};
  };
  Join(Calls, std::move(*C));
  Join(Tensors, std::move(*T));
  Join(Ops, std::move(*O));
  Join(Kernels, std::move(*K));
  return Error::success();
}

int64_t Side::joinSteps() {
  int64_t Steps = 1;
  for (const ModuleCallRecord &M : Calls)
    Steps = std::max(Steps, M.Step);
  if (Steps < 2)
    return 1;
  // Each step's tokens: its root's first integer input's elements.
  std::map<int64_t, int64_t> Tokens;
  for (const ModuleCallRecord &M : Calls)
    if (!M.ParentId && !Tokens.count(M.Step))
      for (int64_t I = 0; const TensorRecord *X = tensor(M.Id, "input", I); ++I)
        if (unitRoundoff(X->Type) == 0 && !X->Shape.empty()) {
          int64_t N = 1;
          for (int64_t D : X->Shape)
            N *= D;
          Tokens[M.Step] = N;
          break;
        }
  // Every later step's calls are the first step's again.
  std::map<int64_t, std::vector<int64_t>> Later; // first step's call -> later steps' alike
  for (const ModuleCallRecord &M : Calls) {
    if (M.Step == 1)
      continue;
    auto [Step, Path, Occurrence] = KeyOf.lookup(M.Id);
    auto First = ByKey.find(std::make_tuple(int64_t(1), Path, Occurrence));
    if (First == ByKey.end())
      return 1;
    Later[First->second->Id].push_back(M.Id);
  }
  struct JoinedTensor {
    int64_t Call;
    std::string Role;
    int64_t Index;
    TensorRecord Record;
    std::vector<const TensorRecord *> Parts;
    int Dim;
  };
  std::vector<JoinedTensor> Made;
  int64_t NextId = -1;
  for (const ModuleCallRecord &M : Calls) {
    if (M.Step != 1)
      continue;
    auto It = ByCall.find(M.Id);
    if (It == ByCall.end())
      continue;
    const std::vector<int64_t> &Others = Later[M.Id];
    for (auto &[Role, ByIndex] : It->second)
      for (auto &[Index, X] : ByIndex) {
        std::vector<const TensorRecord *> Parts = {X};
        for (int64_t L : Others) {
          const TensorRecord *Y = tensor(L, Role, Index);
          if (!Y || Y->Shape.size() != X->Shape.size() || Y->Type != X->Type)
            break;
          Parts.push_back(Y);
        }
        JoinedTensor J{M.Id, Role, Index, *X, Parts, -1};
        J.Record.Id = NextId--;
        J.Record.SourceId.reset();
        if (Parts.size() != Others.size() + 1 || X->Shape.empty()) {
          J.Record.Shard.clear(); // not comparable: not the whole of it
          J.Record.Stats.reset();
          Made.push_back(std::move(J));
          continue;
        }
        // The tokens' dimension: where the steps' extents differ, else
        // the one with each step's token count.
        for (size_t D = 0; D < X->Shape.size() && J.Dim < 0; ++D) {
          bool Differ = false, Others = true;
          for (const TensorRecord *Y : Parts)
            Differ |= Y->Shape[D] != X->Shape[D];
          for (const TensorRecord *Y : Parts)
            for (size_t E = 0; E < X->Shape.size(); ++E)
              Others &= E == D || Y->Shape[E] == X->Shape[E];
          if (Differ && Others)
            J.Dim = int(D);
        }
        // Else the one with each step's token count; of several (as many
        // heads as tokens), the one the memory holds outermost.
        bool ByDifference = J.Dim >= 0;
        for (size_t D = 0; D < X->Shape.size() && !ByDifference; ++D) {
          bool Each = true;
          for (const TensorRecord *Y : Parts) {
            const ModuleCallRecord *Owner = CallById.lookup(Y->OwnerId);
            Each &= Owner && Tokens.count(Owner->Step) && Y->Shape[D] == Tokens[Owner->Step];
          }
          if (Each && (J.Dim < 0 || (X->Strides.size() == X->Shape.size() &&
                                     X->Strides[D] > X->Strides[size_t(J.Dim)])))
            J.Dim = int(D);
        }
        // Else rows of the same count in every step (the logits of each
        // request's last prompt token and decode steps): the first
        // dimension past the leading ones, short of the features, or the
        // one before the features where all are ones.
        for (size_t D = 0; D + 1 < X->Shape.size() && J.Dim < 0; ++D)
          if (X->Shape[D] != 1)
            J.Dim = int(D);
        if (J.Dim < 0 && X->Shape.size() >= 2)
          J.Dim = int(X->Shape.size()) - 2;
        if (J.Dim < 0) {
          J.Record.Shard.clear();
          J.Record.Stats.reset();
          Made.push_back(std::move(J));
          continue;
        }
        int64_t Extent = 0;
        bool Stats = true;
        TensorStats Sum;
        Sum.Min = std::numeric_limits<double>::infinity();
        Sum.Max = -Sum.Min;
        for (const TensorRecord *Y : Parts) {
          Extent += Y->Shape[size_t(J.Dim)];
          Stats &= Y->Stats.has_value();
          if (Y->Stats) {
            Sum.Sum += Y->Stats->Sum;
            Sum.SumSq += Y->Stats->SumSq;
            Sum.Min = std::min(Sum.Min, Y->Stats->Min);
            Sum.Max = std::max(Sum.Max, Y->Stats->Max);
            Sum.NanCount += Y->Stats->NanCount;
            Sum.InfCount += Y->Stats->InfCount;
          }
        }
        J.Record.Shape[size_t(J.Dim)] = Extent;
        J.Record.Stats = Stats ? std::optional<TensorStats>(Sum) : std::nullopt;
        // Strides as the first part's memory order has them (a transposed
        // view stays one), for the joined extent.
        if (X->Strides.size() == X->Shape.size()) {
          std::vector<size_t> Order(X->Shape.size());
          for (size_t D = 0; D < Order.size(); ++D)
            Order[D] = D;
          std::stable_sort(Order.begin(), Order.end(),
                           [&](size_t A, size_t B) { return X->Strides[A] < X->Strides[B]; });
          int64_t Stride = 1;
          for (size_t D : Order) {
            J.Record.Strides[D] = Stride;
            Stride *= J.Record.Shape[D];
          }
        }
        Made.push_back(std::move(J));
      }
  }
  // The later steps' calls go; the indexes are made again, the joined
  // tensors standing for the first step's.
  Calls.erase(std::remove_if(Calls.begin(), Calls.end(),
                             [](const ModuleCallRecord &M) { return M.Step != 1; }),
              Calls.end());
  CallById.clear();
  ByKey.clear();
  KeyOf.clear();
  TensorById.clear();
  ByCall.clear();
  OpOutputs.clear();
  OpStatistics.clear();
  OpWrites.clear();
  Snapshots.clear();
  OpInputs.clear();
  OpMutated.clear();
  OpKernels.clear();
  consumeError(index());
  for (JoinedTensor &J : Made) {
    JoinedTensors.push_back(std::move(J.Record));
    const TensorRecord *X = &JoinedTensors.back();
    TensorById[X->Id] = X;
    ByCall[J.Call][J.Role][J.Index] = X;
    if (J.Dim >= 0)
      Joined[X->Id] = {std::move(J.Parts), J.Dim};
  }
  return Steps;
}

Error Side::index() {
  std::map<std::pair<int64_t, std::string>, unsigned> Seen;
  for (const ModuleCallRecord &M : Calls) {
    CallById[M.Id] = &M;
    unsigned Occurrence = Seen[{M.Step, M.Path}]++;
    auto Key = std::make_tuple(M.Step, M.Path, Occurrence);
    ByKey[Key] = &M;
    KeyOf[M.Id] = Key;
  }
  for (const TensorRecord &X : Tensors) {
    TensorById[X.Id] = &X;
    if (X.Owner == TensorOwner::ModuleCall)
      ByCall[X.OwnerId][X.Role][X.Index] = &X;
    else if (X.Owner == TensorOwner::Op && X.Role == "output" && !X.Shard.empty())
      OpOutputs[X.OwnerId][X.Index] = &X;
    if (X.Owner == TensorOwner::Op && X.Role == "output" && X.Stats)
      OpStatistics[X.OwnerId].push_back(&X);
    if (X.Owner == TensorOwner::Op && (X.Role == "output" || X.Role == "mutated") &&
        !X.Shard.empty())
      OpWrites[X.OwnerId].push_back(&X);
    if (X.Owner == TensorOwner::Kernel && !X.Shard.empty())
      Snapshots[X.OwnerId][X.Index] = &X;
    if (X.Owner == TensorOwner::Op && X.Role == "input" && !X.Shard.empty())
      OpInputs[X.OwnerId][X.Index] = &X;
    if (X.Owner == TensorOwner::Op && X.Role == "mutated" && !X.Shard.empty())
      OpMutated[X.OwnerId][X.Index] = &X;
  }
  for (const KernelRecord &K : Kernels)
    if (K.OpId)
      OpKernels[*K.OpId].push_back(&K);
  for (auto &[Op, Ks] : OpKernels)
    llvm::stable_sort(Ks,
                      [](const KernelRecord *A, const KernelRecord *B) { return A->Seq < B->Seq; });
  return Error::success();
}

const TensorRecord *Side::tensor(int64_t Call, StringRef Role, int64_t Index) const {
  auto C = ByCall.find(Call);
  if (C == ByCall.end())
    return nullptr;
  auto R = C->second.find(Role.str());
  if (R == C->second.end())
    return nullptr;
  auto I = R->second.find(Index);
  return I == R->second.end() ? nullptr : I->second;
}

std::optional<std::vector<double>> Side::values(const TensorRecord *T) const {
  if (T)
    if (auto J = Joined.find(T->Id); J != Joined.end()) {
      std::vector<Elements> Parts;
      std::vector<Dims> Shapes;
      for (const TensorRecord *X : J->second.first) {
        auto V = values(X);
        if (!V)
          return std::nullopt;
        Parts.push_back(std::move(*V));
        Shapes.push_back(Dims(X->Shape.begin(), X->Shape.end()));
      }
      return concatenate(Parts, Shapes, J->second.second);
    }
  T = source(T);
  if (!T || T->Shard.empty())
    return std::nullopt;
  auto Bytes = shardBytes(*T);
  if (!Bytes)
    return std::nullopt;
  auto V = toDoubles(T->Type, *Bytes);
  if (V && !matchesStats(*T, *V))
    return std::nullopt;
  if (V)
    if (auto P = Padded.find(T->Id); P != Padded.end())
      return unpad(*V, P->second, Mask, MaskShape);
  return V;
}

bool Side::matchesStats(const TensorRecord &T, ArrayRef<double> V) const {
  if (!sumChecked(T))
    return true; // and no pass over the values for nothing
  double Sum = 0;
  for (double X : V)
    Sum += X;
  return matchesSum(T, Sum, V.size());
}

bool Side::sumChecked(const TensorRecord &T) {
  // The statistics of a captured CPU tensor were computed from the bytes
  // written (in doubles, as here). GPU statistics are the device's own, in
  // another order and precision: not checked.
  return T.Stats && T.Device == "cpu" && !T.Stats->NanCount && !T.Stats->InfCount &&
         partType(T.Type) == T.Type && std::isfinite(T.Stats->Sum) &&
         std::isfinite(T.Stats->SumSq);
}

bool Side::matchesSum(const TensorRecord &T, double Sum, size_t N) const {
  // Two sums of the same values differ by rounding only, at most
  // 2 n 2^-53 sum|x| each, and sum|x| is at most sqrt(n sum x^2).
  if (!sumChecked(T))
    return true;
  double Bound = 4 * double(N) * 0x1p-53 * std::sqrt(double(N) * T.Stats->SumSq);
  if (std::fabs(Sum - T.Stats->Sum) <= Bound)
    return true;
  if (Problem.empty())
    Problem = formatv("'{0}' is corrupt: tensor {1}'s bytes in '{2}' do not match the statistics "
                      "recorded with them (sum {3:e}, the bytes' {4:e})",
                      Stages[size_t(T.Id >> StageShift)]->directory(),
                      T.Id & ((int64_t(1) << StageShift) - 1),
                      T.Shard, T.Stats->Sum, Sum)
                  .str();
  return false;
}

std::optional<StringRef> Side::shardBytes(const TensorRecord &T) const {
  // Asked as the trace recorded it: a padded batch's record has the shape
  // of its real tokens here, and a stage's id carries the stage in its top
  // bits.
  auto P = Padded.find(T.Id);
  size_t Stage = size_t(T.Id >> StageShift);
  TensorRecord Recorded;
  if (P != Padded.end() || Stage) {
    Recorded = T;
    Recorded.Id = T.Id & ((int64_t(1) << StageShift) - 1);
    if (P != Padded.end())
      Recorded.Shape = P->second;
  }
  auto Bytes = Stages[Stage]->tensorBytes(P != Padded.end() || Stage ? Recorded : T);
  if (Bytes)
    return *Bytes;
  if (Problem.empty())
    Problem = toString(Bytes.takeError());
  else
    consumeError(Bytes.takeError());
  return std::nullopt;
}

void Side::dropPadding() {
  const ModuleCallRecord *Root = nullptr;
  for (const ModuleCallRecord &M : Calls)
    if (!M.ParentId && (!Root || M.Step < Root->Step))
      Root = &M;
  if (!Root)
    return;
  const TensorRecord *Ids = nullptr, *MaskRecord = nullptr;
  for (int64_t I = 0; const TensorRecord *X = tensor(Root->Id, "input", I); ++I) {
    if (unitRoundoff(X->Type) != 0 || X->Shape.size() != 2)
      continue;
    if (!Ids) {
      Ids = X;
      continue;
    }
    if (X->Shape != Ids->Shape)
      continue;
    // The mask: zeros and ones only, some zeros, no empty sequence.
    auto V = values(X);
    if (!V || llvm::any_of(*V, [](double E) { return E != 0 && E != 1; }))
      continue;
    int64_t Seq = X->Shape[1];
    bool Empty = false;
    for (int64_t B = 0; B < X->Shape[0]; ++B)
      Empty |= std::all_of(V->begin() + B * Seq, V->begin() + (B + 1) * Seq,
                           [](double E) { return E == 0; });
    if (!Empty && llvm::is_contained(*V, 0.0)) {
      MaskRecord = X;
      Mask = std::move(*V);
      break;
    }
  }
  if (!MaskRecord)
    return;
  MaskShape = MaskRecord->Shape;
  int64_t Tokens = int64_t(llvm::count(Mask, 1.0));
  // [batch, seq, ...] — but not [batch, heads, seq, dim] whose heads
  // happen to equal seq: which dimension is the sequence is open there,
  // and such a tensor stays as it is (not comparable rather than wrong).
  for (TensorRecord &X : Tensors)
    if (X.Shape.size() >= 2 && X.Shape[0] == MaskShape[0] && X.Shape[1] == MaskShape[1] &&
        !(X.Shape.size() >= 4 && X.Shape[2] == X.Shape[1])) {
      Padded[X.Id] = X.Shape;
      X.Shape.erase(X.Shape.begin());
      X.Shape[0] = Tokens;
    }
}

} // namespace detail
} // namespace ekka
