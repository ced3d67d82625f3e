//===- KernelDrillDown.cpp - Inside a suspect: the op, the kernel ---------===//
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

std::vector<const OpRecord *> Diagnoser::capturedOps(const Side &S, int64_t Call) {
  std::vector<const OpRecord *> Out;
  for (const OpRecord &Op : S.Ops)
    if (Op.ModuleCallId && *Op.ModuleCallId == Call && S.OpOutputs.count(Op.Id) &&
        !allocatesOnly(Op.Name))
      Out.push_back(&Op);
  return Out;
}

bool Diagnoser::movesOnly(StringRef Name) {
  return Name == "aten::view" || Name == "aten::reshape" || Name == "aten::_reshape_alias" ||
         Name == "aten::as_strided" || Name == "aten::contiguous" || Name == "aten::clone" ||
         Name == "aten::copy_" || Name == "aten::detach" || Name == "aten::t" ||
         Name == "aten::transpose" || Name == "aten::permute" || Name == "aten::expand" ||
         Name == "aten::slice" || Name == "aten::select" || Name == "aten::unsqueeze" ||
         Name == "aten::squeeze" || Name == "aten::flatten" || Name == "aten::to" ||
         Name == "aten::_to_copy" || Name == "aten::split" || Name == "aten::chunk" ||
         Name == "aten::narrow" || Name == "aten::unbind" || Name == "aten::lift_fresh";
}

std::optional<OpFinding> Diagnoser::drillDown(const ComponentRatio &C) {
  auto Found = [&]() -> std::optional<OpFinding> {
    if (auto Writer = lastWriter(C))
      return Writer;
    if (auto Paired = pairedDrillDown(C))
      return Paired;
    // A suspect whose output an op of its own wrote (a fused custom op the
    // reference computes with several others): that op.
    return lastWriter(C, /*OfOutput=*/true);
  }();
  // A KV-cache write that ran earlier and did not store what it was given
  // comes first: what later ops read from the cache departs because of it.
  if (auto Cache = cacheWriteDrillDown(C); Cache && (!Found || Cache->OpSeq < Found->OpSeq))
    return Cache;
  return Found;
}

/// "first", "second", ... for a 0-based position.
static std::string ordinal(int64_t I) {
  static const char *Words[] = {"first", "second", "third", "fourth", "fifth"};
  return I >= 0 && I < 5 ? Words[I] : std::to_string(I + 1) + "th";
}

std::optional<OpFinding> Diagnoser::cacheWriteDrillDown(const ComponentRatio &C) {
  for (const OpRecord &Op : T.Ops) {
    if (!Op.ModuleCallId || !within(*Op.ModuleCallId, C.CallId))
      continue;
    auto In = T.OpInputs.find(Op.Id);
    auto Out = T.OpMutated.find(Op.Id);
    if (In == T.OpInputs.end() || Out == T.OpMutated.end())
      continue;
    // The slot mapping: a one-dimensional integer input.
    std::optional<Elements> Slots;
    std::vector<const TensorRecord *> Given;
    for (const auto &[Index, X] : In->second) {
      if (unitRoundoff(X->Type) == 0 && X->Shape.size() == 1 && !Slots)
        Slots = T.values(X);
      else if (unitRoundoff(X->Type) != 0 && !X->Shape.empty())
        Given.push_back(X);
    }
    if (!Slots || Slots->empty())
      continue;
    std::vector<int64_t> SlotIds(Slots->begin(), Slots->end());
    size_t Tokens = SlotIds.size(), Next = 0;
    for (const auto &[Index, Cache] : Out->second) {
      // [blocks, block_size, per-token dims...]; an fp8 cache holds scaled
      // values (its scales are other inputs): not compared.
      if (Cache->Shape.size() < 3 || unitRoundoff(Cache->Type) == 0 ||
          dtypeBits(Cache->Type) < 16)
        continue;
      ArrayRef<int64_t> PerToken = ArrayRef<int64_t>(Cache->Shape).drop_front(2);
      int64_t Row = numElements(PerToken);
      // The input written into it: the same per-token dims, at least one row
      // per slot (an engine may pad its tokens beyond the slots it maps).
      const TensorRecord *X = nullptr;
      while (Next < Given.size() && !X) {
        const TensorRecord *Y = Given[Next++];
        ArrayRef<int64_t> YS(Y->Shape);
        bool SameRow = YS.size() == PerToken.size() + 1 ? YS.drop_front() == PerToken
                                                         : YS.size() == 2 && YS[1] == Row;
        if (SameRow && YS[0] >= int64_t(Tokens))
          X = Y;
      }
      if (!X)
        break;
      auto Bytes = T.rawBytes(Cache);
      auto Keys = T.values(X);
      if (!Bytes || !Keys)
        continue;
      // Un-paged from the bytes: only the slots' rows are read.
      auto Rows = unpageBytes(*Bytes, Cache->Shape, dtypeBits(Cache->Type) / 8, SlotIds);
      bool Past = !Rows;
      Elements Wanted;
      for (size_t K = 0; K < Tokens; ++K)
        if (SlotIds[K] >= 0) // a padding token: not stored
          Wanted.insert(Wanted.end(), Keys->begin() + K * size_t(Row),
                        Keys->begin() + (K + 1) * size_t(Row));
      auto Stored = Past ? std::nullopt : toDoubles(Cache->Type, *Rows);
      if (!Past && !Stored)
        continue;
      std::optional<double> Ratio =
          Stored ? ratioValues(*Stored, Cache->Type, Wanted, X->Type, {})
                 : std::optional<double>(std::numeric_limits<double>::infinity());
      if (!elevated(Ratio))
        continue;
      OpFinding F;
      F.Name = Op.Name;
      F.Schema = Op.Schema;
      F.CallId = *Op.ModuleCallId;
      F.OpSeq = Op.Seq;
      F.Ratio = Ratio;
      F.WroteInPlace = true;
      F.Kernels = kernelNames(Op.Id);
      F.Reason = Stored ? "the paged KV cache it wrote (the " + ordinal(Index) +
                              " tensor it writes in place), un-paged by its slot mapping, "
                              "does not hold the values it was given (the " +
                              ordinal(X->Index) + " tensor it reads)"
                        : "its slot mapping points past the KV cache it wrote";
      refineToKernel(F, Op.Id, nullptr, Cache);
      return F;
    }
  }
  return std::nullopt;
}

std::optional<OpFinding> Diagnoser::pairedDrillDown(const ComponentRatio &C) {
  const ModuleCallRecord *RC = refCall(C.CallId);
  if (!RC)
    return std::nullopt;
  std::vector<const OpRecord *> TO = capturedOps(T, C.CallId);
  if (TO.empty())
    return std::nullopt;
  // What the reference ran there, captured or not: an op it did not run
  // is told from one whose output was not captured.
  std::vector<const OpRecord *> RO;
  for (const OpRecord &Op : R.Ops)
    if (Op.ModuleCallId && *Op.ModuleCallId == RC->Id && !allocatesOnly(Op.Name))
      RO.push_back(&Op);
  std::map<std::string, std::vector<const OpRecord *>> RByName;
  for (const OpRecord *Op : RO)
    RByName[Op->Name].push_back(Op);
  std::map<std::string, unsigned> Seen;
  // Occurrences are counted over every op the suspect ran, captured or
  // not, as they are over the reference's.
  std::map<int64_t, unsigned> Occurrence;
  for (const OpRecord &X : T.Ops)
    if (X.ModuleCallId && *X.ModuleCallId == C.CallId && !allocatesOnly(X.Name))
      Occurrence[X.Id] = Seen[X.Name]++;
  for (size_t I = 0; I < TO.size(); ++I) {
    const OpRecord *Op = TO[I];
    unsigned K = Occurrence[Op->Id];
    OpFinding F;
    F.Name = Op->Name;
    F.Schema = Op->Schema;
    F.OpSeq = Op->Seq;
    F.Kernels = kernelNames(Op->Id);
    auto &Candidates = RByName[Op->Name];
    if (K >= Candidates.size()) {
      // What the reference ran at the same place among the call's ops.
      size_t At = 0;
      for (const OpRecord &X : T.Ops)
        if (X.ModuleCallId && *X.ModuleCallId == C.CallId && !allocatesOnly(X.Name) &&
            X.Seq < Op->Seq)
          ++At;
      F.ReferenceName = At < RO.size() ? RO[At]->Name : "";
      F.Reason = "the reference ran no " + Op->Name + " here" +
                 (F.ReferenceName.empty() ? "" : " (it ran " + F.ReferenceName + ")");
      const auto &Outputs = T.OpOutputs.find(Op->Id)->second; // captured: capturedOps
      refineToKernel(F, Op->Id, nullptr, Outputs.begin()->second);
      return F;
    }
    const OpRecord *Ref = Candidates[K];
    std::optional<double> Worst;
    const TensorRecord *Departing = nullptr;
    auto RefOutputs = R.OpOutputs.find(Ref->Id);
    if (RefOutputs == R.OpOutputs.end())
      continue; // the reference's op ran, its output was not captured
    for (const auto &[Index, TT] : T.OpOutputs.find(Op->Id)->second) {
      auto RT = RefOutputs->second.find(Index);
      if (RT == RefOutputs->second.end())
        continue;
      if (auto X = ratio(TT, RT->second, nullptr); X && *X > Worst.value_or(-1)) {
        Worst = *X;
        Departing = TT;
      }
    }
    if (elevated(Worst)) {
      F.Ratio = Worst;
      F.ReferenceName = Ref->Name;
      F.Reason = "first op of the suspect whose output departs from the reference's";
      refineToKernel(F, Op->Id, Ref, Departing);
      return F;
    }
  }
  return std::nullopt;
}

std::optional<OpFinding> Diagnoser::lastWriter(const ComponentRatio &C, bool OfOutput) {
  const ModuleCallRecord *Suspect = T.CallById.lookup(C.CallId);
  if (!Suspect)
    return std::nullopt;
  if (OfOutput)
    return writerOf(C, T.tensor(C.CallId, "output", 0), C.CallId, nullptr);
  auto Inside = [&](int64_t Call) { return within(Call, Suspect->Id); };
  // The first mapped descendant whose input departs.
  const ComponentRatio *Child = nullptr;
  for (const ComponentRatio &X : CurveSoFar)
    if (X.CallId != C.CallId && X.Mapped && elevated(X.InputRatio) && Inside(X.CallId)) {
      Child = &X;
      break;
    }
  if (!Child)
    return std::nullopt;
  return writerOf(C, departingInput(*Child), Child->CallId, Child);
}

std::optional<OpFinding> Diagnoser::writerOf(const ComponentRatio &C, const TensorRecord *Given,
                                             int64_t Before, const ComponentRatio *Child) {
  auto Inside = [&](int64_t Call) { return within(Call, C.CallId); };
  auto Wanted = Given ? T.values(Given) : std::nullopt;
  if (!Wanted)
    return std::nullopt;
  // The window: the suspect's ops that ran before the child was entered
  // (its own ops and its descendants' alike).
  auto InChild = [&](int64_t Call) { return within(Call, Before); };
  int64_t ChildFirstOp = std::numeric_limits<int64_t>::max();
  if (Child)
    for (const OpRecord &Op : T.Ops)
      if (Op.ModuleCallId && InChild(*Op.ModuleCallId))
        ChildFirstOp = std::min(ChildFirstOp, Op.Seq);
  const OpRecord *Writer = nullptr;
  const TensorRecord *Written = nullptr;
  for (const OpRecord &Op : T.Ops) {
    if (Writer)
      break; // the first op that produced the value, not a later copy
    if (!Op.ModuleCallId || !Inside(*Op.ModuleCallId) || Op.Seq >= ChildFirstOp ||
        allocatesOnly(Op.Name) || movesOnly(Op.Name))
      continue;
    auto W = T.OpWrites.find(Op.Id);
    if (W == T.OpWrites.end())
      continue;
    for (const TensorRecord *X : W->second) {
      auto V = T.values(X);
      // The same values; a NaN the child was given is the writer's NaN.
      if (V && sameValues(*V, *Wanted)) {
        Writer = &Op;
        Written = X;
        break;
      }
    }
  }
  if (!Writer)
    return std::nullopt;
  OpFinding F;
  F.Name = Writer->Name;
  F.Schema = Writer->Schema;
  F.CallId = *Writer->ModuleCallId;
  F.OpSeq = Writer->Seq;
  F.LastWriter = true;
  F.WroteInPlace = Written->Role == "mutated";
  F.Kernels = kernelNames(Writer->Id);
  refineToKernel(F, Writer->Id, nullptr, Written);
  if (Child) {
    F.ReadBy = Child->Path.empty() ? std::string("(root)") : Child->Path;
    F.Ratio = Child->InputRatio;
    F.Reason = "it last wrote what " + (Child->Path.empty() ? std::string("(root)") : Child->Path) +
               " was given, and that departs from what the reference's " +
               (Child->ReferencePaths.empty() ? Child->Path : Child->ReferencePaths[0]) +
               " was given";
  } else {
    F.Ratio = C.Ratio;
    F.Reason = "it last wrote the suspect's output";
  }
  return F;
}

void Diagnoser::refineToKernel(OpFinding &F, int64_t OpId, const OpRecord *RefOp,
                               const TensorRecord *Value) {
  auto TK = T.OpKernels.find(OpId);
  if (TK == T.OpKernels.end())
    return;
  const std::vector<const KernelRecord *> &Mine = TK->second;
  auto SnapshotsOf = [](const Side &S, const KernelRecord *K) {
    auto It = S.Snapshots.find(K->Id);
    return It == S.Snapshots.end() ? std::map<int64_t, const TensorRecord *>() : It->second;
  };
  auto Name = [&](size_t I, std::string Why, std::optional<double> Ratio) {
    F.Kernel = Mine[I]->Name;
    F.KernelIndex = int(I);
    F.KernelReason = std::move(Why);
    F.KernelRatio = Ratio;
  };
  auto RK = RefOp ? R.OpKernels.find(RefOp->Id) : R.OpKernels.end();
  bool SameKernels =
      RK != R.OpKernels.end() && RK->second.size() == Mine.size() &&
      std::equal(Mine.begin(), Mine.end(), RK->second.begin(),
                 [](const KernelRecord *A, const KernelRecord *B) { return A->Name == B->Name; });
  if (SameKernels) {
    // The buffers the op writes, after each kernel; one the reference's
    // kernel left as its previous kernel had it was not written there (its
    // content, perhaps still uninitialized memory, says nothing).
    for (size_t I = 0; I < Mine.size(); ++I) {
      auto Ref = SnapshotsOf(R, RK->second[I]);
      auto RefBefore = I ? SnapshotsOf(R, RK->second[I - 1]) : decltype(Ref)();
      for (const auto &[Param, X] : SnapshotsOf(T, Mine[I])) {
        auto Y = Ref.find(Param);
        if (X->Role != "mutated" || Y == Ref.end())
          continue;
        if (auto Before = RefBefore.find(Param); Before != RefBefore.end()) {
          auto Now = R.values(Y->second), Then = R.values(Before->second);
          if (Now && Then && sameValues(*Now, *Then))
            continue;
        }
        if (auto Ratio = ratio(X, Y->second, nullptr); elevated(Ratio)) {
          Name(I,
               "first of the op's kernels whose buffer (parameter " + std::to_string(Param) +
                   ") departs from the reference's same kernel's",
               Ratio);
          return;
        }
      }
    }
  }
  auto Wanted = Value ? T.values(Value) : std::nullopt;
  if (!Wanted)
    return;
  for (size_t I = 0; I < Mine.size(); ++I)
    for (const auto &[Param, X] : SnapshotsOf(T, Mine[I])) {
      auto V = T.values(X);
      if (V && sameValues(*V, *Wanted)) {
        Name(I,
             "the first of the op's kernels after which its buffer (parameter " +
                 std::to_string(Param) + ") held the op's departing value",
             std::nullopt);
        return;
      }
    }
}

std::vector<std::string> Diagnoser::kernelNames(int64_t OpId) const {
  std::vector<std::string> Out;
  if (auto It = T.OpKernels.find(OpId); It != T.OpKernels.end())
    for (const KernelRecord *K : It->second)
      Out.push_back(K->Name);
  return Out;
}

bool Diagnoser::sameValues(const Elements &A, const Elements &B) {
  return A.size() == B.size() && std::equal(A.begin(), A.end(), B.begin(), [](double X, double Y) {
           return X == Y || (std::isnan(X) && std::isnan(Y));
         });
}

} // namespace detail
} // namespace ekka
