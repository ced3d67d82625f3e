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
  for (ModuleCallRecord &M : *C) {
    M.Id += Off;
    Shift(M.ParentId);
    Calls.push_back(std::move(M));
  }
  auto T = R.tensors();
  if (!T)
    return T.takeError();
  for (TensorRecord &X : *T) {
    X.Id += Off;
    X.OwnerId += Off;
    Shift(X.SourceId);
    Tensors.push_back(std::move(X));
  }
  auto O = R.ops();
  if (!O)
    return O.takeError();
  for (OpRecord &X : *O) {
    X.Id += Off;
    X.Seq += Off;
    Shift(X.ModuleCallId);
    Ops.push_back(std::move(X));
  }
  auto K = R.kernels();
  if (!K)
    return K.takeError();
  for (KernelRecord &X : *K) {
    X.Id += Off;
    X.Seq += Off;
    Shift(X.OpId);
    Shift(X.ModuleCallId);
    Kernels.push_back(std::move(X));
  }
  return Error::success();
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
