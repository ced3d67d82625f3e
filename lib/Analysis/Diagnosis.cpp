//===- Diagnosis.cpp - From two traces to the first diverging component ---===//
#include "ekka/Analysis/Diagnosis.h"
#include "ekka/Align/Transforms.h"
#include "ekka/Support/Progress.h"
#include "ekka/Analysis/TensorMath.h"
#include "ekka/Support/Error.h"

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

StringRef verdictName(Diagnosis::Verdict V) {
  switch (V) {
  case Diagnosis::Verdict::Divergence: return "divergence";
  case Diagnosis::Verdict::NoDivergence: return "no-divergence";
  case Diagnosis::Verdict::InputsDiffer: return "inputs-differ";
  }
  return "?";
}

std::vector<CalibratedRule> calibratedRules(const Diagnosis &D) {
  struct Group {
    CalibratedRule Out;
    bool Failed = false;
  };
  std::vector<Group> Groups;
  std::map<std::string, size_t> ByKey;
  for (const ComponentRatio &C : D.Curve) {
    // Rules onto other paths, and layouts the shapes left open.
    bool Renamed = !C.MappedBy.empty() && !C.ReferencePaths.empty() &&
                   !(C.ReferencePaths.size() == 1 && C.ReferencePaths[0] == C.Path);
    if (!Renamed && !(C.Transposed && C.ReferencePaths.size() == 1))
      continue;
    // Generalize when each reference path numbers its layers as the target
    // does (the same numbers, in order); else keep the literal paths.
    auto [Pattern, Numbers] = starred(C.Path);
    std::vector<std::string> Refs;
    bool Same = !Numbers.empty();
    for (const std::string &R : C.ReferencePaths) {
      auto [RP, RN] = starred(R);
      Same &= RN == Numbers;
      Refs.push_back(RP);
    }
    // Many-to-one: the parts are one rule, whichever part's call this is.
    std::vector<std::string> Parts;
    for (const std::string &P : C.Parts) {
      auto [PP, PN] = starred(P);
      Same &= PN == Numbers;
      Parts.push_back(PP);
    }
    MappingRule Rule;
    Rule.Target = Same ? Pattern : C.Path;
    Rule.Reference = Same ? Refs : C.ReferencePaths;
    Rule.Parts = Same ? Parts : C.Parts;
    Rule.ConcatDim = C.ConcatDim;
    Rule.Transpose = C.Transposed;
    // What proposed it: a mapping file, a recipe, the path and the layout
    // search.
    Rule.Source = C.MappedBy.empty() ? "path" : C.MappedBy;
    std::string Key = (Rule.Parts.empty() ? Rule.Target : join(Rule.Parts, ",")) + "\n" +
                      join(Rule.Reference, ",") + "\n" + std::to_string(Rule.ConcatDim);
    if (Rule.Transpose)
      Key += formatv("\n{0},{1}", Rule.Transpose->first, Rule.Transpose->second).str();
    auto [It, New] = ByKey.try_emplace(Key, Groups.size());
    if (New)
      Groups.push_back({CalibratedRule{Rule, 0, 0}, false});
    Group &G = Groups[It->second];
    if (!C.Ratio || *C.Ratio >= D.Threshold) {
      G.Failed = true; // not compared, or not within noise: nothing validated
      continue;
    }
    ++G.Out.Validated;
    G.Out.LargestRatio = std::max(G.Out.LargestRatio, *C.Ratio);
  }
  std::vector<CalibratedRule> Out;
  for (Group &G : Groups)
    if (!G.Failed && G.Out.Validated)
      Out.push_back(std::move(G.Out));
  return Out;
}

namespace {

/// One side's trace, indexed for the comparison. A pipeline-parallel run's
/// stages (ranks that ran different modules) are joined into one: their
/// ids are kept apart by the stage in their top bits.
struct Side {
  static constexpr int StageShift = 40;
  TraceReader *Reader = nullptr;
  std::vector<TraceReader *> Stages; ///< When joined: each stage's trace.
  std::vector<ModuleCallRecord> Calls;
  std::vector<OpRecord> Ops;
  std::vector<KernelRecord> Kernels;
  /// op id -> its output tensors by index
  std::map<int64_t, std::map<int64_t, const TensorRecord *>> OpOutputs;
  /// op id -> the captured tensors it produced or wrote in place
  std::map<int64_t, std::vector<const TensorRecord *>> OpWrites;
  /// op id -> the kernels it launched, in launch order
  std::map<int64_t, std::vector<const KernelRecord *>> OpKernels;
  /// kernel id -> its captured buffer snapshots, by parameter
  std::map<int64_t, std::map<int64_t, const TensorRecord *>> Snapshots;
  /// op id -> its captured inputs (ekka-trace --capture-op-inputs), by index
  std::map<int64_t, std::map<int64_t, const TensorRecord *>> OpInputs;
  /// op id -> its captured in-place writes, by index
  std::map<int64_t, std::map<int64_t, const TensorRecord *>> OpMutated;
  std::vector<TensorRecord> Tensors;
  DenseMap<int64_t, const ModuleCallRecord *> CallById;
  DenseMap<int64_t, const TensorRecord *> TensorById;
  /// call id -> role -> index -> tensor
  std::map<int64_t, std::map<std::string, std::map<int64_t, const TensorRecord *>>> ByCall;
  /// (step, path, occurrence) -> call
  std::map<std::tuple<int64_t, std::string, unsigned>, const ModuleCallRecord *> ByKey;
  DenseMap<int64_t, std::tuple<int64_t, std::string, unsigned>> KeyOf;

  Error load(TraceReader &R) {
    Reader = &R;
    Stages = {&R};
    if (Error E = append(R, 0))
      return E;
    return index();
  }

  /// The stages of a pipeline-parallel run, first to last, as one trace:
  /// calls in the order the stages ran them, step by step. A module that
  /// several stages enter (the root, the decoder each stage runs a part of)
  /// is the last stage's call, which completes it; the earlier stages'
  /// calls of it are dropped, their children re-parented to it.
  Error loadStages(ArrayRef<TraceReader *> Readers) {
    Reader = Readers.front();
    Stages.assign(Readers.begin(), Readers.end());
    for (size_t I = 0; I < Readers.size(); ++I)
      if (Error E = append(*Readers[I], int64_t(I)))
        return E;
    std::map<std::pair<int64_t, std::string>, int64_t> LastStage;
    for (const ModuleCallRecord &M : Calls)
      LastStage[{M.Step, M.Path}] =
          std::max(LastStage[{M.Step, M.Path}], M.Id >> StageShift);
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

  /// Reads one trace (stage \p Stage) into the side, its ids offset.
  Error append(TraceReader &R, int64_t Stage) {
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

  Error index() {
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
      llvm::stable_sort(Ks, [](const KernelRecord *A, const KernelRecord *B) {
        return A->Seq < B->Seq;
      });
    return Error::success();
  }

  const TensorRecord *tensor(int64_t Call, StringRef Role, int64_t Index) const {
    auto C = ByCall.find(Call);
    if (C == ByCall.end())
      return nullptr;
    auto R = C->second.find(Role.str());
    if (R == C->second.end())
      return nullptr;
    auto I = R->second.find(Index);
    return I == R->second.end() ? nullptr : I->second;
  }

  /// The values of a captured tensor, following the dataflow for an input
  /// that is an earlier output; a padded batch's without its padding.
  std::optional<std::vector<double>> values(const TensorRecord *T) const {
    T = source(T);
    if (!T || T->Shard.empty())
      return std::nullopt;
    auto Bytes = shardBytes(*T);
    if (!Bytes)
      return std::nullopt;
    auto V = toDoubles(T->Type, *Bytes);
    if (V)
      if (auto P = Padded.find(T->Id); P != Padded.end())
        return unpad(*V, P->second, Mask, MaskShape);
    return V;
  }

  /// The captured bytes of \p T as recorded (through the dataflow), when no
  /// padding is dropped from them; none otherwise.
  std::optional<StringRef> rawBytes(const TensorRecord *T) const {
    T = source(T);
    if (!T || T->Shard.empty() || Padded.count(T->Id))
      return std::nullopt;
    return shardBytes(*T);
  }

  /// The record an input stands for: the earlier output it is.
  const TensorRecord *source(const TensorRecord *T) const {
    for (unsigned Hops = 0; T && T->SourceId && Hops < 4; ++Hops)
      T = TensorById.lookup(*T->SourceId);
    return T;
  }

  /// A captured tensor's bytes in its shard. A missing or corrupt shard
  /// must not turn into a quietly partial diagnosis: it is remembered, and
  /// the diagnosis fails with it.
  std::optional<StringRef> shardBytes(const TensorRecord &T) const {
    auto Bytes = Stages[size_t(T.Id >> StageShift)]->tensorBytes(T);
    if (Bytes)
      return *Bytes;
    if (Problem.empty())
      Problem = toString(Bytes.takeError());
    else
      consumeError(Bytes.takeError());
    return std::nullopt;
  }

  /// A batch padded to one length: the root was given token ids [batch,
  /// seq] and an attention mask of that shape, zeros marking the padding.
  /// Then every tensor that starts with [batch, seq] is seen as a serving
  /// engine lays a batch out, its real tokens sequence after sequence
  /// ([tokens, ...]): its Shape says so, values() drops the padding. Only
  /// the root's inputs of the first step tell; none found, nothing changes.
  void dropPadding() {
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

  /// Tensors of a padded batch: their shapes as recorded.
  DenseMap<int64_t, Dims> Padded;
  Elements Mask;
  Dims MaskShape;

  mutable std::string Problem;
};

class Diagnoser {
public:
  Diagnoser(Side &T, Side &R, Side *F, const DiagnoseOptions &O) : T(T), R(R), F(F), O(O) {}

  Diagnosis run() {
    Diagnosis D;
    D.Threshold = O.Threshold;
    D.NoiseModel = F ? "R = |X_T - Y_R| / max(|X_R - Y_R|, u |Y_R|), Y_R from the FP32 reference"
                     : "no FP32 reference: R = |X_T - X_R| / (" +
                           formatv("{0}", format("%g", O.NoiseUnits)).str() +
                           " u |X_R|), u the unit roundoff of the traced precision";
    groupSteps();
    if (MergeSteps)
      for (const ModuleCallRecord &M : T.Calls)
        D.MergedSteps = std::max(D.MergedSteps, M.Step);
    if (MergeSteps)
      D.NoiseModel += "; the target's prefill and decode steps concatenated along the token "
                      "dimension to meet the reference's single forward";
    for (auto [S, Name] : {std::pair<Side *, const char *>{&T, "target"}, {&R, "reference"}})
      if (!S->Padded.empty())
        D.NoiseModel += formatv("; the {0}'s batch of {1} sequences padded to {2} tokens "
                                "compared on its {3} real tokens (its attention mask)",
                                Name, S->MaskShape[0], S->MaskShape[1], llvm::count(S->Mask, 1.0))
                            .str();
    if (checkInputs(D))
      return D;
    reservePaths();
    computeRatios(D);
    CurveSoFar = D.Curve;
    localize(D);
    return D;
  }

private:
  /// The root calls' inputs (token ids) of the first step must agree before
  /// any module can be blamed: a missing BOS token shows up here.
  bool checkInputs(Diagnosis &D) {
    auto Root = [](Side &S) -> const ModuleCallRecord * {
      for (const ModuleCallRecord &M : S.Calls)
        if (!M.ParentId)
          return &M;
      return nullptr;
    };
    const ModuleCallRecord *TR = Root(T), *RR = Root(R);
    if (!TR || !RR)
      return false;
    // The first integer input of each root: the token ids. Other integer
    // inputs (positions, an attention mask) are passed differently by each
    // program; floating inputs (embeddings fed directly) are compared as
    // components are.
    auto FirstInteger = [](Side &S, int64_t Call) -> const TensorRecord * {
      for (int64_t I = 0; const TensorRecord *X = S.tensor(Call, "input", I); ++I)
        if (unitRoundoff(X->Type) == 0)
          return X;
      return nullptr;
    };
    const TensorRecord *A = FirstInteger(T, TR->Id), *B = FirstInteger(R, RR->Id);
    if (!A || !B)
      return false;
    auto VA = targetValues(A, TR->Id, B->Shape), VB = R.values(B);
    if (!VA || !VB)
      return false;
    auto Diff = firstDifference(*VA, *VB);
    // The same ids, however laid out: [batch, seq] and the flattened tokens
    // of a serving engine are the same inputs.
    if (!Diff && (VA->size() == VB->size() || MergeSteps))
      return false;
    size_t P = Diff.value_or(0);
    std::string Msg;
    raw_string_ostream OS(Msg);
    OS << "input " << A->Index << " of the root (" << (TR->Path.empty() ? TR->ClassName : TR->Path)
       << ") differs: shape " << shape(A->Shape) << " against " << shape(B->Shape)
       << "; first difference at flat position " << P << ": target ";
    auto Value = [](const std::vector<double> &V, size_t P) {
      return P < V.size() ? formatv("{0}", format("%g", V[P])).str() : std::string("(none)");
    };
    OS << Value(*VA, P) << ", reference " << Value(*VB, P);
    D.Result = Diagnosis::Verdict::InputsDiffer;
    D.InputsDifference = Msg;
    return true;
  }

  static std::string shape(const std::vector<int64_t> &S) {
    std::string Out = "[";
    for (size_t I = 0; I < S.size(); ++I)
      Out += (I ? ", " : "") + std::to_string(S[I]);
    return Out + "]";
  }

  /// The ratio for one pair of same-role tensors (and the FP32 reference's).
  std::optional<double> ratio(const TensorRecord *A, const TensorRecord *B, const TensorRecord *C,
                              int64_t TargetCall = 0) {
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
    bool Open = layoutOpen(A, B, TargetCall);
    if (Open)
      settleLayout(A);
    auto Compare = [&] {
      auto Out = ratioFromBytes(A, B, C, TargetCall);
      if (!Out)
        Out = ratioOf(targetValues(A, TargetCall, B->Shape), A->Type, B, C);
      return Out;
    };
    auto Out = Compare();
    if (Open && !Layouts.count(A->Id)) {
      // Nothing settled this layout: as is, unless the values say otherwise.
      LayoutChoice Choice;
      if (elevated(Out))
        Choice = searchLayout(A, B, C);
      Layouts[A->Id] = Choice;
      if (!elevated(Out) || Choice.Swap) // validated: later calls follow it
        if (std::string K = layoutKey(A); !K.empty())
          Learned.try_emplace(K, Choice.Swap);
      if (Choice.Swap)
        Out = Compare();
    }
    if (Memo)
      Ratios[Key] = Out;
    return Out;
  }
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::optional<double>> Ratios;

  /// A layout the shapes leave open ([T, H, D] against [1, H, T, D] with
  /// T == H): the swap of the target tensor's dimensions (leading ones
  /// squeezed) that meets the reference's, none for as is, and how it was
  /// chosen (empty: nothing but the default).
  struct LayoutChoice {
    std::optional<std::pair<int, int>> Swap;
    std::string How;
  };
  /// By target tensor id, once chosen.
  DenseMap<int64_t, LayoutChoice> Layouts;
  /// What the calls of a component validated, by layoutKey(): its later
  /// calls follow it, so a bug in one layer is not explained away by a
  /// layout its other layers did not need.
  std::map<std::string, std::optional<std::pair<int, int>>> Learned;
  /// Target call -> its mapping rule's "transpose".
  DenseMap<int64_t, std::pair<int, int>> RuleLayouts;

  /// Whether the layout of target tensor \p A against reference tensor
  /// \p B is open: their shapes agree, and dimensions of equal extent could
  /// have been swapped. Not for shards and merged steps (their own
  /// alignment), nor scalars.
  bool layoutOpen(const TensorRecord *A, const TensorRecord *B, int64_t Call) const {
    if (A->Shape.empty() || B->Shape.empty() || sharded(A, B->Shape) ||
        (MergeSteps && LaterSteps.count(Call)))
      return false;
    return squeezeLeading(A->Shape) == squeezeLeading(B->Shape) &&
           !transpositions(A->Shape, B->Shape).empty();
  }

  /// A component's tensor as the layouts it validated are remembered: its
  /// path with layer numbers starred, its role and position. Empty for an
  /// op's tensors (each is searched on its own).
  std::string layoutKey(const TensorRecord *A) const {
    if (A->Owner != TensorOwner::ModuleCall)
      return "";
    const ModuleCallRecord *M = T.CallById.lookup(A->OwnerId);
    if (!M)
      return "";
    return starred(M->Path).first + "\n" + A->Role + "\n" + std::to_string(A->Index);
  }

  /// The layout of \p A when something other than its values settles it:
  /// its call's mapping rule (for the call's output), else what the
  /// component's earlier calls validated.
  void settleLayout(const TensorRecord *A) {
    if (Layouts.count(A->Id))
      return;
    Dims S = squeezeLeading(A->Shape);
    if (auto It = RuleLayouts.find(A->OwnerId);
        It != RuleLayouts.end() && A->Owner == TensorOwner::ModuleCall && A->Role == "output") {
      auto [I, J] = It->second;
      if (size_t(J) < S.size() && S[size_t(I)] == S[size_t(J)])
        Layouts[A->Id] = {It->second, "by the mapping"};
      return;
    }
    if (auto It = Learned.find(layoutKey(A)); It != Learned.end())
      Layouts[A->Id] = {It->second, "as the component's earlier calls"};
  }

  /// The bounded search for an open layout, run when \p A as it is departs
  /// from \p B: every swap of two dimensions of equal extent, validated on
  /// the tensor sums (the norms, which no layout changes, must agree) and on
  /// sampled elements (within the threshold). Exactly one swap must pass;
  /// none or several leave the tensor as it is. The set is closed: it only
  /// reorders elements, so a wrong value stays wrong.
  LayoutChoice searchLayout(const TensorRecord *A, const TensorRecord *B, const TensorRecord *C) {
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
      auto V = transpose(*XT, S, I, J);
      if (!V)
        continue;
      auto Ratio = ratioValues(Sample(*V), A->Type, SR, B->Type, SY.empty() ? nullptr : &SY);
      if (!Ratio || elevated(Ratio))
        continue;
      if (Found)
        return {}; // two layouts agree: the values do not decide
      Found = std::make_pair(I, J);
    }
    if (!Found)
      return {};
    return {Found, "found by a search validated on sums and sampled elements"};
  }

  /// The ratio of the target's values \p XT (of dtype \p TargetType) to
  /// reference tensor \p B, with FP32 reference tensor \p C if any.
  std::optional<double> ratioOf(std::optional<std::vector<double>> XT, DType TargetType,
                                const TensorRecord *B, const TensorRecord *C) {
    auto XR = R.values(B);
    if (!XT || !XR)
      return std::nullopt;
    std::optional<Elements> YR;
    if (F && C)
      YR = F->values(C);
    return ratioValues(*XT, TargetType, *XR, B->Type, YR ? &*YR : nullptr);
  }

  /// R from finite sums: against the FP32 reference when \p WithFP32,
  /// else by the noise model.
  double ratioFromSums(const RatioSums &S, bool WithFP32, DType TargetType, DType RefType) const {
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

  /// The ratio straight from the captured bytes, when the three tensors are
  /// compared as recorded (no transform moves an element: no steps merged,
  /// no shards, no padding, no transposition) and every value is finite.
  std::optional<double> ratioFromBytes(const TensorRecord *A, const TensorRecord *B,
                                       const TensorRecord *C, int64_t TargetCall) {
    if (MergeSteps && LaterSteps.count(TargetCall))
      return std::nullopt;
    if (A->Shape.empty() || B->Shape.empty() || sharded(A, B->Shape) ||
        layoutOf(A, B->Shape))
      return std::nullopt;
    auto XT = T.rawBytes(A), XR = R.rawBytes(B);
    std::optional<StringRef> YR;
    if (C && F) {
      YR = F->rawBytes(C);
      if (!YR)
        return std::nullopt;
    }
    int64_t N = numElements(B->Shape);
    if (!XT || !XR || N <= 0 || numElements(A->Shape) != N ||
        (C && numElements(C->Shape) != N))
      return std::nullopt;
    auto S = ratioSums(A->Type, *XT, B->Type, *XR, C ? C->Type : DType::F32,
                       YR ? *YR : StringRef(), size_t(N));
    if (!S || !S->Finite)
      return std::nullopt;
    return ratioFromSums(*S, YR.has_value(), A->Type, B->Type);
  }

  /// The error ratio of target values \p XT against reference values \p XR
  /// (of dtype \p RefType) and, if given and as large, FP32 reference values
  /// \p YR; none when the sizes differ.
  std::optional<double> ratioValues(const Elements &XT, DType TargetType, const Elements &XR,
                                    DType RefType, const Elements *YR) const {
    if (XT.size() != XR.size() || XT.empty())
      return std::nullopt;
    if (YR && YR->size() != XT.size())
      YR = nullptr;
    // The common case, every value finite: all sums in one pass.
    if (RatioSums S = ratioSums(XT, XR, YR); S.Finite)
      return ratioFromSums(S, YR != nullptr, TargetType, RefType);
    // A NaN or infinity where the reference has none (or the reverse) is a
    // divergence whatever the scale: R = infinity.
    if (std::isinf(distance(XT, XR)))
      return std::numeric_limits<double>::infinity();
    if (YR) {
      double Floor = unitRoundoff(RefType) * norm(*YR);
      double Den = std::max(distance(XR, *YR), Floor);
      if (std::isinf(Den))
        Den = Floor; // the reference's own NaNs: measure against roundoff
      return distance(XT, *YR) / (Den + 1e-30);
    }
    double Den = O.NoiseUnits * std::max(unitRoundoff(RefType), unitRoundoff(TargetType)) * norm(XR);
    double Num = distance(XT, XR);
    if (Num == 0)
      return 0.0;
    return Num / (Den + 1e-30);
  }

  /// The largest ratio over a call's tensors of one role. \p AllCompared
  /// (if given) says whether every such tensor could be compared.
  std::optional<double> callRatio(const ModuleCallRecord &TC, const ModuleCallRecord &RC,
                                  const ModuleCallRecord *FC, StringRef Role,
                                  bool *AllCompared = nullptr, bool *ResidualPair = nullptr) {
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
    return Worst;
  }

  /// The reference call target call \p Call was mapped to (the first, for
  /// a rule's several); null when unmapped.
  const ModuleCallRecord *refCall(int64_t Call) const { return RefOf.lookup(Call); }

  /// The FP32 reference's call where reference call \p RC stands.
  const ModuleCallRecord *fp32Call(const ModuleCallRecord *RC) const {
    if (!F || !RC)
      return nullptr;
    auto It = F->ByKey.find(R.KeyOf.lookup(RC->Id));
    return It == F->ByKey.end() ? nullptr : It->second;
  }

  /// The floating inputs of \p TC that could not be compared with the
  /// reference's (paired in order, as callRatio pairs them).
  std::vector<const TensorRecord *> uncomparedInputs(const ComponentRatio &C) {
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

  /// The first floating input of \p C that departs from the reference's (or
  /// its first floating input, when none could be told apart).
  const TensorRecord *departingInput(const ComponentRatio &C) {
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

  using RoleTensors = std::map<int64_t, const TensorRecord *>;
  static const TensorRecord *at(const RoleTensors &M, int64_t I) {
    auto It = M.find(I);
    return It == M.end() ? nullptr : It->second;
  }

  /// A call's tensors of one role, by position. Inputs are paired among the
  /// floating-point ones only, in order: the two programs pass integer
  /// side inputs (positions, ids) in different places, and a serving
  /// engine's module takes `positions` first where HF's takes the hidden
  /// states first.
  static RoleTensors roleTensors(const Side &S, int64_t Call, StringRef Role) {
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
      if (unitRoundoff(X->Type) != 0)
        Out[N++] = X;
    return Out;
  }

  /// A fused residual-add + norm (vLLM's decoder layers and norms) returns
  /// the pair (output, residual) where the reference returns one tensor:
  /// the norm's output, or the layer's output = output + residual. When the
  /// target call has two tensors of one shape first and the reference one
  /// (its next, if any, has another shape), both readings are tried —
  /// the first alone, and the sum — and the sum's ratio is returned when it
  /// is the closer (validated on the values, as the paper's tensor-sum
  /// matching; the set stays these two, so no arithmetic is invented to
  /// explain a difference away); none otherwise.
  /// Inputs likewise: the layer after a fused one, and the fused norm
  /// itself, take (hidden, residual) where the reference takes their sum.
  std::optional<double> residualPairRatio(const ModuleCallRecord &TC, StringRef Role,
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
    auto Second = targetValues(B, TC.Id, Ref->Shape);
    std::optional<double> Alone = ratioOf(First, A->Type, Ref, Fp), Sum;
    if (First && Second && First->size() == Second->size()) {
      std::vector<double> Added = *First;
      for (size_t I = 0; I < Added.size(); ++I)
        Added[I] += (*Second)[I];
      Sum = ratioOf(std::move(Added), A->Type, Ref, Fp);
    }
    // Only the sum is a reading of its own; when the first tensor alone is
    // closer, the tensors are compared one by one as usual (so that a second
    // input that matches nothing still counts as not compared).
    Summed = Sum && (!Alone || *Sum < *Alone);
    return Summed ? Sum : std::nullopt;
  }

  /// The swap that puts target tensor \p A in the reference's layout (of
  /// shape \p RefShape): the one chosen where the shapes left it open, else
  /// the one the shapes make (none: as it is).
  std::optional<std::pair<int, int>> layoutOf(const TensorRecord *A,
                                              const std::vector<int64_t> &RefShape) const {
    if (auto It = Layouts.find(A->Id); It != Layouts.end())
      return It->second.Swap;
    return transposition(A->Shape, RefShape);
  }

  /// The target's values for tensor \p A of call \p Call. When the target
  /// served the prompt as a prefill and then decode steps against a
  /// reference that ran the whole sequence in one forward, a component's
  /// tensors of every step are concatenated along the token dimension — the
  /// one where the steps' shapes differ and add up to the reference's.
  std::optional<std::vector<double>> targetValues(const TensorRecord *A, int64_t Call,
                                                  const std::vector<int64_t> &RefShape) {
    // A tensor-parallel shard: gathered from the ranks first.
    bool Gather = sharded(A, RefShape);
    if (RefShape.empty() || A->Shape.empty()) // a scalar (a loss, a scale): as it is
      return T.values(A);
    int64_t Ranks = int64_t(Peers.size() + 1), RefFeatures = tokenMajor(RefShape).back();
    int64_t Local = Gather ? RefFeatures / Ranks : RefFeatures;
    auto Values = [&](const TensorRecord *X) {
      return Gather ? gathered(X, Local) : T.values(X);
    };
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
    std::vector<int64_t> Ref = RefShape;
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
      std::vector<int64_t> S = Reshaped ? rowsOf(X->Shape, Local) : X->Shape;
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
        std::vector<int64_t> S = ShapeOf(X);
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
    std::vector<std::vector<int64_t>> Shapes;
    for (const TensorRecord *X : Parts) {
      auto V = Values(X);
      if (!V)
        return std::nullopt;
      Merged.push_back(std::move(*V));
      Shapes.push_back(ShapeOf(X));
    }
    return concatenate(Merged, Shapes, int(*Dim));
  }

  /// Prefill and decode steps against a one-shot reference: group each
  /// target call of step 1 with the same module's calls in later steps.
  void groupSteps() {
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

  bool MergeSteps = false;
  DenseMap<int64_t, std::vector<const ModuleCallRecord *>> LaterSteps;

  /// A rule-mapped call's ratio: the reference side is the concatenation of
  /// the reference calls' outputs (index 0), and likewise for FP32.
  /// The tensor a rule names of reference call \p Call: its first output,
  /// or (a `:input` reference) its first floating input.
  static const TensorRecord *ruleTensor(const Side &S, const ModuleCallRecord *Call, bool Input) {
    if (!Input)
      return S.tensor(Call->Id, "output", 0);
    RoleTensors In = roleTensors(S, Call->Id, "input");
    return In.empty() ? nullptr : In.begin()->second;
  }

  std::optional<double> ruleRatio(const ModuleCallRecord &TC,
                                  const std::vector<const ModuleCallRecord *> &RC,
                                  const std::vector<const ModuleCallRecord *> &FC, int Dim,
                                  const std::vector<bool> &Inputs) {
    const TensorRecord *TT = T.tensor(TC.Id, "output", 0);
    if (!TT)
      return std::nullopt;
    // One to one: compared as a pair of tensors is.
    if (RC.size() == 1)
      return ratio(TT, ruleTensor(R, RC[0], Inputs[0]),
                   FC.size() == 1 && F ? ruleTensor(*F, FC[0], Inputs[0]) : nullptr, TC.Id);
    // The reference side's shape: its parts' shapes, concatenated.
    std::vector<int64_t> RefShape;
    for (size_t K = 0; K < RC.size(); ++K) {
      const TensorRecord *X = ruleTensor(R, RC[K], Inputs[K]);
      if (!X)
        return std::nullopt;
      if (RefShape.empty()) {
        RefShape = X->Shape;
        continue;
      }
      if (X->Shape.size() != RefShape.size() || RefShape.empty())
        return std::nullopt;
      size_t D = Dim < 0 ? RefShape.size() + Dim : size_t(Dim);
      if (D >= RefShape.size())
        return std::nullopt;
      RefShape[D] += X->Shape[D];
    }
    // A tensor-parallel rank holds its share of each part.
    GatherParts.clear();
    if (!Peers.empty() && (Dim == -1 || Dim == int(RefShape.size()) - 1))
      for (size_t K = 0; K < RC.size(); ++K)
        if (const TensorRecord *X = ruleTensor(R, RC[K], Inputs[K]); X && !X->Shape.empty())
          GatherParts.push_back(tokenMajor(X->Shape).back());
    auto XT = targetValues(TT, TC.Id, RefShape);
    GatherParts.clear();
    auto Gather = [&](Side &S, const std::vector<const ModuleCallRecord *> &Calls)
        -> std::optional<std::vector<double>> {
      std::vector<std::vector<double>> Parts;
      std::vector<std::vector<int64_t>> Shapes;
      for (size_t K = 0; K < Calls.size(); ++K) {
        const TensorRecord *X = ruleTensor(S, Calls[K], Inputs[K]);
        if (!X)
          return std::nullopt;
        auto V = S.values(X);
        if (!V)
          return std::nullopt;
        Parts.push_back(std::move(*V));
        Shapes.push_back(X->Shape);
      }
      return concatenate(Parts, Shapes, Dim);
    };
    auto XR = Gather(R, RC);
    if (!XT || !XR)
      return std::nullopt;
    std::optional<Elements> YR;
    if (F && FC.size() == RC.size())
      YR = Gather(*F, FC);
    return ratioValues(*XT, TT->Type, *XR, ruleTensor(R, RC[0], Inputs[0])->Type,
                       YR ? &*YR : nullptr);
  }

  /// The tensors of the other tensor-parallel ranks that stand where \p X
  /// stands on rank 0: the same call (step, path, occurrence), role and
  /// index. Empty unless every rank has one.
  std::vector<const TensorRecord *> peerTensors(const TensorRecord *X) const {
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

  /// The record holding \p X's statistics: an input that is an earlier
  /// output has them on that output.
  static const TensorRecord *producer(const Side &S, const TensorRecord *X) {
    for (unsigned Hops = 0; X && X->SourceId && Hops < 4; ++Hops)
      X = S.TensorById.lookup(*X->SourceId);
    return X;
  }

  /// Whether \p X is the same on every tensor-parallel rank (by its
  /// statistics; unknown counts as the same).
  bool replicated(const TensorRecord *X) const {
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

  /// Whether \p X is one rank's share of a tensor of \p RefShape: the
  /// ranks' features side by side make the reference's (a column-parallel
  /// layer's output, a row-parallel one's input).
  bool sharded(const TensorRecord *X, const std::vector<int64_t> &RefShape) const {
    if (Peers.empty() || !X || X->Shape.empty() || RefShape.empty() ||
        unitRoundoff(X->Type) == 0) // ids and positions are never shards
      return false;
    // Features only: the tokens may be one of several steps' share.
    int64_t Ranks = int64_t(Peers.size() + 1), Features = tokenMajor(RefShape).back();
    return Features % Ranks == 0 && !rowsOf(X->Shape, Features / Ranks).empty() &&
           !peerTensors(X).empty();
  }

  /// When a fused module is compared with the concatenation of several
  /// reference modules (a recipe: qkv_proj against q, k and v), their
  /// features; each rank holds its share of every part, so the gathered
  /// tensor is regrouped part by part.
  std::vector<int64_t> GatherParts;

  /// \p X gathered from every rank: each token's features, rank after rank
  /// (part after part, each part rank after rank, with GatherParts).
  std::optional<std::vector<double>> gathered(const TensorRecord *X, int64_t Local) const {
    auto Ps = peerTensors(X);
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

  /// Structural evidence against a pairing by path: the same name for a
  /// different computation (vLLM's `act_fn` is SiluAndMul, which takes the
  /// gate and up projections together; HF's is the activation alone). Their
  /// first input's or first output's last dimension (the feature size)
  /// differ. Empty when nothing speaks against the pair.
  std::string structureDiffers(const ModuleCallRecord &TC, const ModuleCallRecord &RC) {
    const TensorRecord *TO = T.tensor(TC.Id, "output", 0), *RO = R.tensor(RC.Id, "output", 0);
    bool OutputSharded = TO && RO && sharded(TO, RO->Shape);
    for (StringRef Role : {"input", "output"}) {
      const TensorRecord *A = T.tensor(TC.Id, Role, 0), *B = R.tensor(RC.Id, Role, 0);
      if (!A || !B || A->Shape.empty() || B->Shape.empty() || unitRoundoff(A->Type) == 0 ||
          unitRoundoff(B->Type) == 0)
        continue;
      // Under tensor parallelism a shard is gathered from the ranks; but a
      // module whose output is a shard while its input, as large as the
      // reference's, differs from rank to rank takes a shard of something
      // else (vLLM's SiluAndMul `act_fn`: gate and up, against HF's
      // activation of the gate alone).
      if (sharded(A, B->Shape))
        continue;
      if (Role == "input" && OutputSharded && !replicated(A))
        return "same path, but a different computation: its first input is a "
               "tensor-parallel shard as large as the reference's whole input";
      if (!sameFeatures(A->Shape, B->Shape) && !transposition(A->Shape, B->Shape))
        return ("same path, but a different computation: its first " + Role + " has " +
                Twine(A->Shape.back()) + " features against the reference's " +
                Twine(B->Shape.back()))
            .str();
    }
    return "";
  }

  /// Applies the first mapping rule that matches \p TC; true if one did.
  bool applyRule(const ModuleCallRecord &TC, ComponentRatio &C) {
    std::vector<const MappingRule *> Rules;
    for (const MappingRule &Rule : O.Mapping)
      Rules.push_back(&Rule);
    if (O.UseRecipes)
      for (const MappingRule &Rule : builtinRecipes())
        Rules.push_back(&Rule);
    for (const MappingRule *RulePtr : Rules) {
      const MappingRule &Rule = *RulePtr;
      auto Stars = matchPath(Rule.Target, TC.Path);
      if (!Stars)
        continue;
      if (!Rule.Parts.empty())
        return applyPartRule(TC, Rule, *Stars, C);
      bool Recipe = Rule.Source != "mapping file";
      auto Key = T.KeyOf.lookup(TC.Id);
      // A recipe translates between two frameworks' names; where the
      // reference has the target's own path (the same model code on both
      // sides), pairing by path is the better evidence.
      if (Recipe && Rule.Source != "calibration" && R.ByKey.count(Key))
        continue;
      std::vector<const ModuleCallRecord *> RC, FC;
      std::vector<bool> Inputs;
      C.ReferencePaths.clear();
      for (const std::string &Pattern : Rule.Reference) {
        std::string Named = substitute(Pattern, *Stars);
        C.ReferencePaths.push_back(Named);
        auto [Path, Role] = referenceRole(Named);
        Inputs.push_back(Role == "input");
        auto RK = std::make_tuple(std::get<0>(Key), Path, std::get<2>(Key));
        auto RIt = R.ByKey.find(RK);
        if (RIt == R.ByKey.end() && Recipe)
          break;
        if (RIt == R.ByKey.end()) {
          C.Mapped = false;
          C.UnmappedReason = "the mapping names reference '" + Path + "', which did not run";
          return true;
        }
        RC.push_back(RIt->second);
        if (F)
          if (auto FIt = F->ByKey.find(RK); FIt != F->ByKey.end())
            FC.push_back(FIt->second);
      }
      if (RC.size() != Rule.Reference.size()) { // a recipe that does not apply here
        C.ReferencePaths.clear();
        continue;
      }
      C.MappedBy = Rule.Source;
      C.ConcatDim = Rule.ConcatDim;
      if (Rule.Transpose)
        RuleLayouts[TC.Id] = *Rule.Transpose;
      C.Ratio = ruleRatio(TC, RC, FC, Rule.ConcatDim, Inputs);
      if (llvm::is_contained(Inputs, true)) {
        // The output met another component's input (an engine's attention
        // backend against the input of HF's o_proj): what the target
        // component was given has no counterpart.
        C.InputsCompared = false;
        return true;
      }
      RefOf[TC.Id] = RC[0];
      for (const ModuleCallRecord *X : RC)
        UsedRef.insert(X->Id);
      // Inputs: the first reference component sees what the target does.
      C.InputRatio =
          callRatio(TC, *RC[0], FC.empty() ? nullptr : FC[0], "input", &C.InputsCompared);
      return true;
    }
    return false;
  }

  /// A many-to-one rule: target call \p TC is one of several parts whose
  /// outputs together make one reference call's. The reference output (and
  /// the FP32 one) is split along the rule's dimension by the parts' sizes
  /// there, and \p TC's own part compared.
  bool applyPartRule(const ModuleCallRecord &TC, const MappingRule &Rule,
                     const std::vector<std::string> &Stars, ComponentRatio &C) {
    auto [Step, Path, Occurrence] = T.KeyOf.lookup(TC.Id);
    std::string Named = substitute(Rule.Reference[0], Stars);
    auto [Ref, Role] = referenceRole(Named);
    C.ReferencePaths = {Named};
    C.ConcatDim = Rule.ConcatDim;
    C.Part = Rule.Part;
    C.Parts.clear();
    for (const std::string &P : Rule.Parts)
      C.Parts.push_back(substitute(P, Stars));
    auto RIt = R.ByKey.find(std::make_tuple(Step, Ref, Occurrence));
    if (RIt == R.ByKey.end()) {
      C.Mapped = false;
      C.UnmappedReason = "the mapping names reference '" + Ref + "', which did not run";
      return true;
    }
    const ModuleCallRecord &RC = *RIt->second;
    C.MappedBy = Rule.Source;
    bool Input = Role == "input";
    if (!Input) {
      RefOf[TC.Id] = &RC;
      UsedRef.insert(RC.Id);
    }
    const TensorRecord *RO = ruleTensor(R, &RC, Input), *TO = T.tensor(TC.Id, "output", 0);
    if (!RO || !TO || RO->Shape.empty())
      return true; // mapped, not comparable
    // The parts' sizes along the dimension, from their outputs' shapes.
    std::vector<int64_t> Sizes;
    size_t Rank = RO->Shape.size();
    size_t Dim = Rule.ConcatDim < 0 ? Rank + Rule.ConcatDim : size_t(Rule.ConcatDim);
    for (const std::string &P : C.Parts) {
      auto PIt = T.ByKey.find(std::make_tuple(Step, P, Occurrence));
      const TensorRecord *X = PIt == T.ByKey.end() ? nullptr : T.tensor(PIt->second->Id, "output", 0);
      if (!X || X->Shape.empty() || Dim >= Rank)
        return true;
      // The part's extent along the dimension, counted from the end as the
      // rule's is (a part may lack the reference's leading batch of one).
      size_t FromEnd = Rank - Dim;
      if (X->Shape.size() < FromEnd)
        return true;
      // A tensor-parallel rank's part is its share of the features.
      int64_t Share = X->Shape[X->Shape.size() - FromEnd];
      bool Last = FromEnd == 1;
      Sizes.push_back(Last && !peerTensors(X).empty() && unitRoundoff(X->Type) != 0
                          ? Share * int64_t(Peers.size() + 1)
                          : Share);
    }
    auto Part = [&](Side &S, const TensorRecord *X) -> std::optional<Elements> {
      auto V = X ? S.values(X) : std::nullopt;
      if (!V)
        return std::nullopt;
      auto Split = split(*V, X->Shape, int(Dim), Sizes);
      if (!Split)
        return std::nullopt;
      return std::move((*Split)[size_t(Rule.Part)]);
    };
    std::vector<int64_t> PartShape = RO->Shape;
    PartShape[Dim] = Sizes[size_t(Rule.Part)];
    auto XR = Part(R, RO);
    const ModuleCallRecord *FC = fp32Call(&RC);
    auto YR = FC ? Part(*F, ruleTensor(*F, FC, Input)) : std::nullopt;
    auto XT = targetValues(TO, TC.Id, PartShape);
    if (XR && XT)
      C.Ratio = ratioValues(*XT, TO->Type, *XR, RO->Type, YR ? &*YR : nullptr);
    if (Input)
      C.InputsCompared = false; // what the part was given has no counterpart
    else
      C.InputRatio = callRatio(TC, RC, FC, "input", &C.InputsCompared);
    return true;
  }

  void computeRatios(Diagnosis &D) {
    DenseMap<int64_t, unsigned> Depth;
    // On a terminal only (lit and logs stay clean): comparing a large
    // model's captured tensors over many decode steps takes a while.
    ProgressBar Bar("comparing module calls", T.Calls.size());
    for (const ModuleCallRecord &TC : T.Calls) {
      Bar.advance();
      if (MergeSteps && TC.Step > 1)
        continue; // folded into its step-1 call
      ComponentRatio C;
      C.CallId = TC.Id;
      C.Seq = TC.Seq;
      C.Step = TC.Step;
      C.Depth = TC.ParentId ? Depth.lookup(*TC.ParentId) + 1 : 0;
      Depth[TC.Id] = C.Depth;
      C.Path = TC.Path;
      C.ClassName = TC.ClassName;
      C.ClassQualname = TC.ClassQualname;
      C.SourceFile = TC.SourceFile;
      C.SourceLine = TC.SourceLine;
      auto Key = T.KeyOf.lookup(TC.Id);
      auto RIt = R.ByKey.find(Key);
      if (applyRule(TC, C)) {
        // mapped (or not) by the user's mapping
      } else if (RIt == R.ByKey.end()) {
        if (!mapByEvidence(TC, C)) {
          C.Mapped = false;
          C.UnmappedReason = "no reference call with this path at this step, and none inside "
                             "its mapped parent's counterpart agrees by structure or values";
        }
      } else if (std::string Why = structureDiffers(TC, *RIt->second); !Why.empty()) {
        C.Mapped = false;
        C.UnmappedReason = Why;
      } else {
        pair(TC, *RIt->second, C);
      }
      if (const TensorRecord *Out = T.tensor(TC.Id, "output", 0))
        if (auto It = Layouts.find(Out->Id); It != Layouts.end() && It->second.Swap) {
          C.Transposed = It->second.Swap;
          C.LayoutBy = It->second.How;
        }
      if (C.Ratio)
        D.MaxRatio = std::max(D.MaxRatio, *C.Ratio);
      else
        ++D.Uncompared;
      D.Curve.push_back(std::move(C));
    }
  }

  /// Pairs target call \p TC with reference call \p RC and compares them.
  void pair(const ModuleCallRecord &TC, const ModuleCallRecord &RC, ComponentRatio &C) {
    const ModuleCallRecord *FC = fp32Call(&RC);
    C.ReferencePaths = {RC.Path};
    C.Ratio = callRatio(TC, RC, FC, "output", nullptr, &C.ResidualPair);
    C.InputRatio = callRatio(TC, RC, FC, "input", &C.InputsCompared);
    RefOf[TC.Id] = &RC;
    UsedRef.insert(RC.Id);
    Cursor = std::max(Cursor, RC.Seq);
  }

  /// The reference calls that target calls pair with by path: not free for
  /// the evidence below.
  void reservePaths() {
    for (const ModuleCallRecord &TC : T.Calls)
      if (auto It = R.ByKey.find(T.KeyOf.lookup(TC.Id)); It != R.ByKey.end())
        UsedRef.insert(It->second->Id);
    for (const ModuleCallRecord &M : T.Calls)
      if (M.ParentId)
        TargetParents.insert(*M.ParentId);
    for (const ModuleCallRecord &M : R.Calls)
      if (M.ParentId)
        ReferenceParents.insert(*M.ParentId);
  }

  /// Code that names its modules its own way (a custom engine; Meta's
  /// `layers.0.feed_forward.w1` against HF's `model.layers.0.mlp.gate_proj`):
  /// a target call that no rule and no path pairs is looked for among the
  /// free reference calls inside the reference call of its nearest mapped
  /// ancestor, of the same step, whose tensors have comparable shapes.
  ///  - **Tensor evidence** (the paper's infer_tensor_match): the one whose
  ///    output agrees within noise (the smallest R at or below the
  ///    threshold), norms first, from the recorded statistics.
  ///  - **Structure**, when none agrees (a diverging component, or one
  ///    downstream of it): the first free call after the reference call
  ///    mapped last, both leaves or both not, with comparable input and
  ///    output shapes. Its ratio then says how far it departs.
  /// A call the rules or paths left unmapped for a reason (the same name
  /// for another computation) is not looked for.
  bool mapByEvidence(const ModuleCallRecord &TC, ComponentRatio &C) {
    const ModuleCallRecord *Scope = nullptr;
    for (const ModuleCallRecord *M = parentOf(T, TC); M && !Scope; M = parentOf(T, *M))
      Scope = refCall(M->Id);
    const TensorRecord *TO = T.tensor(TC.Id, "output", 0);
    if (!Scope || !TO || unitRoundoff(TO->Type) == 0)
      return false;
    RoleTensors TIn = roleTensors(T, TC.Id, "input");
    const TensorRecord *TI = TIn.empty() ? nullptr : TIn.begin()->second;
    bool Leaf = !TargetParents.count(TC.Id);
    const ModuleCallRecord *ByValue = nullptr, *ByStructure = nullptr;
    std::pair<bool, double> Best;
    for (const ModuleCallRecord &RC : R.Calls) {
      if (RC.Step != TC.Step || UsedRef.count(RC.Id) || RC.Id == Scope->Id ||
          !within(R, RC.Id, Scope->Id))
        continue;
      const TensorRecord *RO = R.tensor(RC.Id, "output", 0);
      if (!RO || unitRoundoff(RO->Type) == 0 || !comparableShapes(TO, RO, TC.Id))
        continue;
      RoleTensors RI = roleTensors(R, RC.Id, "input");
      const TensorRecord *RIn = RI.empty() ? nullptr : RI.begin()->second;
      bool Inputs = (!TI && !RIn) || (TI && RIn && comparableShapes(TI, RIn, TC.Id));
      bool SameKind = Leaf == !ReferenceParents.count(RC.Id);
      if (!ByStructure && RC.Seq > Cursor && Inputs && SameKind)
        ByStructure = &RC;
      if (!plausibleNorms(TO, RO))
        continue;
      const ModuleCallRecord *FC = fp32Call(&RC);
      const TensorRecord *FO = FC ? F->tensor(FC->Id, "output", 0) : nullptr;
      // Equal values (a model's output is its last norm's): a leaf for a
      // leaf, a container for a container.
      if (auto X = ratio(TO, RO, FO, TC.Id); X && *X <= O.Threshold) {
        std::pair<bool, double> Rank{!SameKind, *X};
        if (!ByValue || Rank < Best) {
          Best = Rank;
          ByValue = &RC;
        }
      }
    }
    const ModuleCallRecord *RC = ByValue ? ByValue : ByStructure;
    if (!RC)
      return false;
    C.MappedBy = ByValue ? "tensor evidence" : "structure";
    pair(TC, *RC, C);
    return true;
  }

  static const ModuleCallRecord *parentOf(const Side &S, const ModuleCallRecord &M) {
    return M.ParentId ? S.CallById.lookup(*M.ParentId) : nullptr;
  }

  /// Whether target tensor \p A (of call \p Call, its decode steps merged
  /// and shards gathered as the comparison does) holds as many elements as
  /// reference tensor \p B, with the same features per token.
  bool comparableShapes(const TensorRecord *A, const TensorRecord *B, int64_t Call) const {
    if (A->Shape.empty() || B->Shape.empty())
      return A->Shape.empty() && B->Shape.empty();
    int64_t N = numElements(A->Shape);
    if (MergeSteps)
      if (auto Steps = LaterSteps.find(Call); Steps != LaterSteps.end())
        for (const ModuleCallRecord *Later : Steps->second)
          if (const TensorRecord *X = T.tensor(Later->Id, A->Role, A->Index))
            N += numElements(X->Shape);
    if (sharded(A, B->Shape))
      N *= int64_t(Peers.size() + 1);
    else if (!sameFeatures(A->Shape, B->Shape) && !transposition(A->Shape, B->Shape))
      return false;
    return N == numElements(B->Shape);
  }

  /// Whether two tensors' norms, from their recorded statistics, are close
  /// enough for their values to agree within noise (R at most the threshold
  /// puts them within a few units of noise, far below 10 %). Unknown (no
  /// statistics, or the values are not the recorded tensor's: padding
  /// dropped, steps merged, shards gathered) counts as close.
  bool plausibleNorms(const TensorRecord *A, const TensorRecord *B) const {
    const TensorRecord *PA = producer(T, A), *PB = producer(R, B);
    if (!PA || !PB || !PA->Stats || !PB->Stats || MergeSteps || !Peers.empty() ||
        !T.Padded.empty() || !R.Padded.empty())
      return true;
    double NA = std::sqrt(PA->Stats->SumSq), NB = std::sqrt(PB->Stats->SumSq);
    if (!std::isfinite(NA) || !std::isfinite(NB))
      return true;
    return std::abs(NA - NB) <= 0.1 * std::max(NA, NB);
  }

  /// Target call -> the reference call it was mapped to.
  DenseMap<int64_t, const ModuleCallRecord *> RefOf;
  /// Reference calls taken by a path, a rule or evidence.
  DenseSet<int64_t> UsedRef;
  /// Calls that have children, on each side.
  DenseSet<int64_t> TargetParents, ReferenceParents;
  /// The sequence number of the reference call mapped last.
  int64_t Cursor = -1;

  bool elevated(const std::optional<double> &X) const { return X && *X > O.Threshold; }

  void localize(Diagnosis &D) {
    for (size_t I = 0; I < D.Curve.size(); ++I)
      CurveIndex[D.Curve[I].CallId] = I;
    // Local divergence: the output departs while the inputs do not. Such a
    // call computed the difference itself; a call downstream of it sees a
    // diverged input and is not a root cause, and one that does not consume
    // the bad tensor (up_proj after a broken act_fn) is not elevated at all.
    // Strong candidates had every input compared; weak ones had some that
    // could not be (not captured, or changed in place before they were
    // recorded) and rank after all strong ones.
    std::vector<size_t> Candidates, Weak;
    for (size_t I = 0; I < D.Curve.size(); ++I) {
      const ComponentRatio &C = D.Curve[I];
      // Its output must depart beyond noise by more than its inputs already
      // did: a call whose inputs sit just under the threshold and whose
      // output just over it only passed a divergence on.
      if (C.Mapped && elevated(C.Ratio) && !elevated(C.InputRatio) &&
          *C.Ratio > O.Threshold * std::max(1.0, C.InputRatio.value_or(0)) &&
          (C.InputsCompared || !divergedUpstream(D, I)) &&
          (C.MappedBy != "structure" || containerDeparts(D, I)))
        (C.InputsCompared ? Candidates : Weak).push_back(I);
    }
    Candidates.insert(Candidates.end(), Weak.begin(), Weak.end());
    if (Candidates.empty()) {
      // Everything elevated has elevated inputs: the divergence enters from
      // a component without a reference counterpart. Blame its first
      // consumer, and say why.
      // A call whose inputs were compared and are within noise only passed a
      // small divergence on (the pass-through rule): no verdict from it.
      for (size_t I = 0; I < D.Curve.size(); ++I)
        if (D.Curve[I].Mapped && elevated(D.Curve[I].Ratio) &&
            (elevated(D.Curve[I].InputRatio) || !D.Curve[I].InputsCompared)) {
          D.Result = Diagnosis::Verdict::Divergence;
          Suspect S;
          S.Component = D.Curve[I];
          S.Reason = "output diverges and so do its inputs, which come from a component "
                     "without a reference counterpart (see --show-mapping)";
          D.Suspects.push_back(std::move(S));
          break;
        }
      return;
    }
    D.Result = Diagnosis::Verdict::Divergence;
    // A candidate that contains another (mlp around act_fn) is explained by
    // it: keep the innermost.
    auto Contains = [&](size_t Outer, size_t Inner) {
      return D.Curve[Inner].CallId != D.Curve[Outer].CallId &&
             within(D.Curve[Inner].CallId, D.Curve[Outer].CallId);
    };
    std::vector<size_t> Innermost;
    for (size_t A : Candidates)
      if (llvm::none_of(Candidates, [&](size_t B) { return B != A && Contains(A, B); }))
        Innermost.push_back(A);
    // Then the candidates that contain them, as weaker suspects: the
    // innermost of those first (the layer around a broken projection
    // before the whole model).
    std::vector<size_t> Containers;
    for (size_t A : Candidates)
      if (llvm::find(Innermost, A) == Innermost.end())
        Containers.push_back(A);
    std::stable_sort(Containers.begin(), Containers.end(), [&](size_t A, size_t B) {
      return D.Curve[A].Depth > D.Curve[B].Depth;
    });
    Innermost.insert(Innermost.end(), Containers.begin(), Containers.end());
    for (size_t I : Innermost) {
      if (D.Suspects.size() == 3)
        break;
      // An input that could not be compared came from a component that
      // computed it at a lower precision than the reference does (a router
      // run in bf16 where the reference keeps it in fp32): its values may
      // sit within noise, but what it decides downstream (the experts
      // chosen) does not. It comes first.
      if (!D.Curve[I].InputsCompared)
        if (auto P = lowerPrecisionProducer(D, D.Curve[I]);
            P && llvm::none_of(D.Suspects, [&](const Suspect &X) {
              return X.Component.CallId == D.Curve[P->first].CallId;
            })) {
          Suspect Producer;
          Producer.Component = D.Curve[P->first];
          Producer.Reason = P->second;
          for (size_t J = P->first >= 3 ? P->first - 3 : 0; J < P->first; ++J)
            Producer.Before.push_back(D.Curve[J]);
          for (size_t J = P->first + 1; J < D.Curve.size() && J <= P->first + 3; ++J)
            Producer.After.push_back(D.Curve[J]);
          D.Suspects.push_back(std::move(Producer));
          if (D.Suspects.size() == 3)
            break;
        }
      Suspect S;
      S.Component = D.Curve[I];
      raw_string_ostream(S.Reason)
          << "output diverges (R = " << format("%.3g", *D.Curve[I].Ratio)
          << ") while its inputs do not ("
          << (D.Curve[I].InputRatio ? "R = " + formatv("{0}", format("%.3g", *D.Curve[I].InputRatio)).str()
                                    : std::string("inputs not compared"))
          << (D.Curve[I].InputsCompared ? "" : "; some inputs could not be compared")
          << ")";
      for (size_t J = I >= 3 ? I - 3 : 0; J < I; ++J)
        S.Before.push_back(D.Curve[J]);
      for (size_t J = I + 1; J < D.Curve.size() && J <= I + 3; ++J)
        S.After.push_back(D.Curve[J]);
      S.Op = drillDown(D.Curve[I]);
      // The op that wrote a tensor a later component of the suspect read ran
      // in a mapped child of its own: that child is the root cause, by a
      // side effect its own output does not show (it wrote its input in
      // place). It comes first — unless its own output departs too (then
      // it wrote its output buffer, and the dataflow rules placed it).
      if (S.Op && S.Op->LastWriter && S.Op->WroteInPlace && !S.Op->ReadBy.empty() &&
          S.Op->CallId != S.Component.CallId)
        if (std::optional<size_t> W = mappedCallAround(D, S.Op->CallId, S.Component.CallId);
            W && !elevated(D.Curve[*W].Ratio) && llvm::none_of(D.Suspects, [&](const Suspect &X) {
              return X.Component.CallId == D.Curve[*W].CallId;
            })) {
          Suspect Writer;
          Writer.Component = D.Curve[*W];
          Writer.Reason = "it wrote, in place (op " + S.Op->Name + "), the tensor that " +
                          S.Op->ReadBy + " then read, and that departs from what the "
                          "reference's read; its own output does not show it";
          Writer.Op = S.Op;
          Writer.Before = S.Before;
          Writer.After = S.After;
          D.Suspects.push_back(std::move(Writer));
          if (D.Suspects.size() == 3)
            break;
        }
      if (llvm::none_of(D.Suspects, [&](const Suspect &X) {
            return X.Component.CallId == S.Component.CallId;
          }))
        D.Suspects.push_back(std::move(S));
    }
  }

  /// For a call whose inputs could not all be compared: whether what flows
  /// into it had already departed, as far as the calls around it tell —
  /// the inputs of its nearest mapped ancestor, or the output of a mapped
  /// call that ran before it inside that ancestor (an engine's attention
  /// backend after a layer whose input departed; a logits processor after
  /// the model whose output departed). Such a call passes a divergence on.
  bool divergedUpstream(const Diagnosis &D, size_t Index) const {
    const ComponentRatio *Ancestor = mappedAncestor(D, Index);
    if (!Ancestor) {
      // A call of its own after the root's forward (vLLM's logits
      // processor): the step's root before it is what fed it.
      const ComponentRatio &C = D.Curve[Index];
      for (size_t J = Index; J-- > 0;)
        if (D.Curve[J].Step == C.Step && D.Curve[J].Depth == 0 && D.Curve[J].Mapped &&
            D.Curve[J].CallId != C.CallId)
          return elevated(D.Curve[J].Ratio);
      return false;
    }
    if (elevated(Ancestor->InputRatio))
      return true;
    for (size_t J = 0; J < Index; ++J) {
      const ComponentRatio &X = D.Curve[J];
      if (X.Mapped && X.CallId != Ancestor->CallId && X.Seq > Ancestor->Seq &&
          within(X.CallId, Ancestor->CallId) && elevated(X.Ratio))
        return true;
    }
    return false;
  }

  /// The nearest mapped call around curve entry \p Index, or null.
  const ComponentRatio *mappedAncestor(const Diagnosis &D, size_t Index) const {
    const ModuleCallRecord *M = T.CallById.lookup(D.Curve[Index].CallId);
    if (!M || !M->ParentId)
      return nullptr;
    auto I = mappedCallAround(D, *M->ParentId, std::numeric_limits<int64_t>::min());
    return I ? &D.Curve[*I] : nullptr;
  }

  /// A call paired by structure alone (nothing on the reference side agreed
  /// with it) may be paired wrongly — a module only the target has, set
  /// against a free reference call of the same shapes — and would then
  /// depart for that reason alone. It is a candidate only when the mapped
  /// call around it departs too.
  bool containerDeparts(const Diagnosis &D, size_t Index) const {
    const ComponentRatio *Ancestor = mappedAncestor(D, Index);
    return Ancestor && elevated(Ancestor->Ratio);
  }

  /// For a candidate with inputs that could not be compared: a mapped
  /// component that produced one of them with a lower precision than the
  /// reference's counterpart produced its output. Its index in the curve and
  /// the reason.
  std::optional<std::pair<size_t, std::string>> lowerPrecisionProducer(const Diagnosis &D,
                                                                       const ComponentRatio &C) {
    for (const TensorRecord *X : uncomparedInputs(C)) {
      if (!X->SourceId)
        continue;
      const TensorRecord *Source = T.TensorById.lookup(*X->SourceId);
      if (!Source || Source->Owner != TensorOwner::ModuleCall)
        continue;
      const ModuleCallRecord *RC = refCall(Source->OwnerId);
      if (!RC)
        continue;
      const TensorRecord *Ref = R.tensor(RC->Id, "output", Source->Index);
      if (!Ref || unitRoundoff(Source->Type) == 0 || unitRoundoff(Ref->Type) == 0 ||
          unitRoundoff(Source->Type) <= unitRoundoff(Ref->Type))
        continue;
      if (auto It = CurveIndex.find(Source->OwnerId);
          It != CurveIndex.end() && D.Curve[It->second].Mapped)
        return std::make_pair(
              It->second, ("its output is " + dtypeName(Source->Type) + " where the reference's is " +
                  dtypeName(Ref->Type) + ": computed at a lower precision, it feeds " +
                  (C.Path.empty() ? std::string("(root)") : C.Path) +
                  ", whose output departs (R = " + formatv("{0}", format("%.3g", *C.Ratio)).str() +
                  ") though its other inputs do not")
                     .str());
    }
    return std::nullopt;
  }

  /// Whether target call \p Call is \p Ancestor or runs inside it.
  bool within(int64_t Call, int64_t Ancestor) const { return within(T, Call, Ancestor); }
  static bool within(const Side &S, int64_t Call, int64_t Ancestor) {
    for (const ModuleCallRecord *M = S.CallById.lookup(Call); M; M = parentOf(S, *M))
      if (M->Id == Ancestor)
        return true;
    return false;
  }

  /// The innermost mapped call that contains target call \p Call (itself
  /// included), below \p Stop; its index in the curve.
  std::optional<size_t> mappedCallAround(const Diagnosis &D, int64_t Call, int64_t Stop) const {
    for (const ModuleCallRecord *M = T.CallById.lookup(Call); M && M->Id != Stop;
         M = parentOf(T, *M))
      if (auto It = CurveIndex.find(M->Id); It != CurveIndex.end() && D.Curve[It->second].Mapped)
        return It->second;
    return std::nullopt;
  }

  /// Target call id -> its entry in the curve (built before localization).
  DenseMap<int64_t, size_t> CurveIndex;

  /// The ops of a call (its own, not its children's) with captured outputs,
  /// in execution order.
  static std::vector<const OpRecord *> capturedOps(const Side &S, int64_t Call) {
    std::vector<const OpRecord *> Out;
    for (const OpRecord &Op : S.Ops)
      if (Op.ModuleCallId && *Op.ModuleCallId == Call && S.OpOutputs.count(Op.Id) &&
          !allocatesOnly(Op.Name))
        Out.push_back(&Op);
    return Out;
  }

  /// Ops that only move or relabel values already computed (views, copies,
  /// dtype and layout changes): not where a value was made.
  static bool movesOnly(StringRef Name) {
    return Name == "aten::view" || Name == "aten::reshape" || Name == "aten::_reshape_alias" ||
           Name == "aten::as_strided" || Name == "aten::contiguous" || Name == "aten::clone" ||
           Name == "aten::copy_" || Name == "aten::detach" || Name == "aten::t" ||
           Name == "aten::transpose" || Name == "aten::permute" || Name == "aten::expand" ||
           Name == "aten::slice" || Name == "aten::select" || Name == "aten::unsqueeze" ||
           Name == "aten::squeeze" || Name == "aten::flatten" || Name == "aten::to" ||
           Name == "aten::_to_copy" || Name == "aten::split" || Name == "aten::chunk" ||
           Name == "aten::narrow" || Name == "aten::unbind" || Name == "aten::lift_fresh";
  }

  /// Ops whose output is storage still to be written (an `out=` buffer being
  /// sized) or a view of an input: what they "computed" says nothing.
  static bool allocatesOnly(StringRef Name) {
    return Name == "aten::resize_" || Name == "aten::empty" || Name == "aten::empty_like" ||
           Name == "aten::empty_strided" || Name == "aten::new_empty" ||
           Name == "aten::alias" || Name == "aten::set_";
  }

  /// The first op of the suspect whose output departs from the reference's
  /// op at the same place (same name, same occurrence), or the first op the
  /// reference did not run.
  std::optional<OpFinding> drillDown(const ComponentRatio &C) {
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

  /// Inside suspect \p C, the first op that wrote a paged KV cache
  /// ([blocks, block_size, ...], written in place) other than what it was
  /// given: the cache, un-paged by the op's slot mapping (an integer input
  /// of one slot per token, as vLLM's reshape_and_cache takes), departs from
  /// the op's floating input of as many elements (the keys, the values; the
  /// i-th cache against the i-th such input). Needs the op's inputs captured
  /// (ekka-trace --capture-op-inputs); none otherwise.
  std::optional<OpFinding> cacheWriteDrillDown(const ComponentRatio &C) {
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
      size_t Next = 0;
      for (const auto &[Index, Cache] : Out->second) {
        if (Cache->Shape.size() < 3 || unitRoundoff(Cache->Type) == 0)
          continue;
        int64_t Row = numElements(ArrayRef<int64_t>(Cache->Shape).drop_front(2));
        // The input written into it: one row per token.
        const TensorRecord *X = nullptr;
        while (Next < Given.size() && !X) {
          const TensorRecord *Y = Given[Next++];
          if (numElements(Y->Shape) == int64_t(SlotIds.size()) * Row)
            X = Y;
        }
        if (!X)
          break;
        auto CacheValues = T.values(Cache), Keys = T.values(X);
        if (!CacheValues || !Keys)
          continue;
        auto Stored = unpage(*CacheValues, Cache->Shape, SlotIds);
        // Tokens without a slot (padding) were not stored.
        Elements Wanted;
        for (size_t K = 0; K < SlotIds.size(); ++K)
          if (SlotIds[K] >= 0)
            Wanted.insert(Wanted.end(), Keys->begin() + K * size_t(Row),
                          Keys->begin() + (K + 1) * size_t(Row));
        std::optional<double> Ratio =
            Stored ? ratioValues(*Stored, Cache->Type, Wanted, X->Type, nullptr)
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
        for (const KernelRecord &K : T.Kernels)
          if (K.OpId && *K.OpId == Op.Id)
            F.Kernels.push_back(K.Name);
        F.Reason = Stored ? "the paged KV cache it wrote (its in-place argument " +
                                std::to_string(Index) +
                                "), un-paged by its slot mapping, does not hold the values "
                                "it was given (its input " +
                                std::to_string(X->Index) + ")"
                          : "its slot mapping points past the KV cache it wrote";
        refineToKernel(F, Op.Id, nullptr, Cache);
        return F;
      }
    }
    return std::nullopt;
  }

  std::optional<OpFinding> pairedDrillDown(const ComponentRatio &C) {
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
    auto KernelsOf = [&](int64_t OpId) {
      std::vector<std::string> Names;
      for (const KernelRecord &K : T.Kernels)
        if (K.OpId && *K.OpId == OpId)
          Names.push_back(K.Name);
      return Names;
    };
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
      F.Kernels = KernelsOf(Op->Id);
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
        refineToKernel(F, Op->Id, nullptr, T.OpOutputs[Op->Id].begin()->second);
        return F;
      }
      const OpRecord *Ref = Candidates[K];
      std::optional<double> Worst;
      const TensorRecord *Departing = nullptr;
      for (const auto &[Index, TT] : T.OpOutputs[Op->Id]) {
        auto RT = R.OpOutputs[Ref->Id].find(Index);
        if (RT == R.OpOutputs[Ref->Id].end())
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

  /// Inside a suspect whose own computation has no reference counterpart
  /// (a serving engine's attention: its custom ops and unmapped children),
  /// the divergence first shows as the elevated input of a mapped child
  /// (`o_proj`): the op that last wrote that tensor is the one that made
  /// it. It is found by value — the op's captured output or written
  /// argument holds exactly what the child was given — among the suspect's
  /// ops (its children's included) that ran before the child.
  std::optional<OpFinding> lastWriter(const ComponentRatio &C, bool OfOutput = false) {
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

  /// The last op inside suspect \p C, before call \p Before's first op (or
  /// anywhere in it, for its own output), whose captured output or
  /// in-place write holds exactly \p Given's values.
  std::optional<OpFinding> writerOf(const ComponentRatio &C, const TensorRecord *Given,
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
        if (V && V->size() == Wanted->size() &&
            std::equal(V->begin(), V->end(), Wanted->begin(), [](double A, double B) {
              return A == B || (std::isnan(A) && std::isnan(B));
            })) {
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
    for (const KernelRecord &K : T.Kernels)
      if (K.OpId && *K.OpId == Writer->Id)
        F.Kernels.push_back(K.Name);
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

  /// Beneath op \p OpId, from its kernels' buffer snapshots (taken after
  /// each kernel, on a GPU): the first kernel whose buffers depart from the
  /// reference's same kernel, when \p RefOp launched the same kernels in
  /// the same order (a kernel developer's old and new build); else the
  /// first kernel after which a buffer held the op's departing value
  /// \p Value — the kernel that wrote it. Nothing when no snapshot tells.
  void refineToKernel(OpFinding &F, int64_t OpId, const OpRecord *RefOp,
                      const TensorRecord *Value) {
    auto TK = T.OpKernels.find(OpId);
    if (TK == T.OpKernels.end())
      return;
    auto SnapshotsOf = [](const Side &S, const KernelRecord *K) {
      auto It = S.Snapshots.find(K->Id);
      return It == S.Snapshots.end() ? std::map<int64_t, const TensorRecord *>() : It->second;
    };
    auto RK = RefOp ? R.OpKernels.find(RefOp->Id) : R.OpKernels.end();
    bool SameKernels = RK != R.OpKernels.end() && RK->second.size() == TK->second.size() &&
                       std::equal(TK->second.begin(), TK->second.end(), RK->second.begin(),
                                  [](const KernelRecord *A, const KernelRecord *B) {
                                    return A->Name == B->Name;
                                  });
    if (SameKernels) {
      for (size_t I = 0; I < TK->second.size(); ++I) {
        auto Ref = SnapshotsOf(R, RK->second[I]);
        for (const auto &[Param, X] : SnapshotsOf(T, TK->second[I])) {
          auto Y = Ref.find(Param);
          if (Y == Ref.end())
            continue;
          if (auto Ratio = ratio(X, Y->second, nullptr); elevated(Ratio)) {
            F.Kernel = TK->second[I]->Name;
            F.KernelRatio = Ratio;
            F.KernelReason = "first of the op's kernels whose buffer (parameter " +
                             std::to_string(Param) +
                             ") departs from the reference's same kernel's";
            return;
          }
        }
      }
    }
    auto Wanted = Value ? T.values(Value) : std::nullopt;
    if (!Wanted)
      return;
    for (const KernelRecord *K : TK->second)
      for (const auto &[Param, X] : SnapshotsOf(T, K)) {
        auto V = T.values(X);
        if (V && V->size() == Wanted->size() &&
            std::equal(V->begin(), V->end(), Wanted->begin(), [](double A, double B) {
              return A == B || (std::isnan(A) && std::isnan(B));
            })) {
          F.Kernel = K->Name;
          F.KernelReason = "the first of the op's kernels after which its buffer (parameter " +
                           std::to_string(Param) + ") held the op's departing value: it wrote it";
          return;
        }
      }
  }

  /// The components compared so far, for the drill-down.
  std::vector<ComponentRatio> CurveSoFar;

  Side &T, &R;
  Side *F;
  const DiagnoseOptions &O;

public:
  /// The target's other tensor-parallel ranks (rank 0 is T).
  std::vector<Side *> Peers;
};

} // namespace

Expected<Diagnosis> diagnose(TraceReader &Target, TraceReader &Reference,
                             TraceReader *ReferenceFP32, const DiagnoseOptions &Options) {
  TraceReader *Ranks[] = {&Target};
  return diagnose(Ranks, Reference, ReferenceFP32, Options);
}

Expected<std::vector<std::vector<size_t>>> rankStages(ArrayRef<TraceReader *> Ranks) {
  std::vector<std::set<std::string>> Paths;
  for (TraceReader *R : Ranks) {
    auto C = R->moduleCalls();
    if (!C)
      return C.takeError();
    std::set<std::string> P;
    for (const ModuleCallRecord &M : *C)
      P.insert(M.Path);
    Paths.push_back(std::move(P));
  }
  // Ranks of which one ran every module the other did are one stage's.
  auto Within = [](const std::set<std::string> &A, const std::set<std::string> &B) {
    return std::includes(B.begin(), B.end(), A.begin(), A.end());
  };
  std::vector<size_t> Group(Ranks.size());
  for (size_t I = 0; I < Ranks.size(); ++I) {
    Group[I] = I;
    for (size_t J = 0; J < I; ++J)
      if (Within(Paths[I], Paths[J]) || Within(Paths[J], Paths[I])) {
        Group[I] = Group[J];
        break;
      }
  }
  std::vector<std::vector<size_t>> Stages;
  std::map<size_t, size_t> StageOf;
  for (size_t I = 0; I < Ranks.size(); ++I) {
    auto [It, New] = StageOf.try_emplace(Group[I], Stages.size());
    if (New)
      Stages.emplace_back();
    Stages[It->second].push_back(I);
  }
  for (const auto &S : Stages)
    if (S.size() != Stages.front().size())
      return makeError("the trace's " + Twine(Ranks.size()) + " ranks form " +
                       Twine(Stages.size()) +
                       " pipeline stages of different sizes (by the modules each rank ran): "
                       "not a tensor-parallel x pipeline-parallel layout");
  return Stages;
}

Expected<RankLayout> rankLayout(ArrayRef<TraceReader *> Ranks) {
  if (Ranks.size() < 2)
    return RankLayout::Single;
  auto Stages = rankStages(Ranks);
  if (!Stages)
    return Stages.takeError();
  if (Stages->size() == 1)
    return RankLayout::SameModules;
  return Stages->front().size() == 1 ? RankLayout::Stages : RankLayout::TensorParallelStages;
}

Expected<Diagnosis> diagnose(ArrayRef<TraceReader *> TargetRanks, TraceReader &Reference,
                             TraceReader *ReferenceFP32, const DiagnoseOptions &Options) {
  TraceReader *Ref[] = {&Reference}, *FP32[] = {ReferenceFP32};
  return diagnose(TargetRanks, Ref, ReferenceFP32 ? ArrayRef<TraceReader *>(FP32)
                                                  : ArrayRef<TraceReader *>(),
                  Options);
}

namespace {

/// Column \p P of a multi-rank trace: each stage's P-th tensor-parallel
/// rank, first stage first, joined into one call sequence when there are
/// several stages.
Error loadColumn(Side &S, ArrayRef<TraceReader *> Ranks,
                 const std::vector<std::vector<size_t>> &Stages, size_t P) {
  std::vector<TraceReader *> Column;
  for (const std::vector<size_t> &Stage : Stages)
    Column.push_back(Ranks[Stage[P]]);
  return Column.size() > 1 ? S.loadStages(Column) : S.load(*Column.front());
}

/// A reference of several ranks: its stages joined, compared through its
/// first tensor-parallel rank — which meets the target's own first rank
/// shard for shard, so both must have as many tensor-parallel ranks (or
/// the reference one).
Error loadReference(Side &S, ArrayRef<TraceReader *> Ranks, size_t TargetParallel,
                    StringRef Flag) {
  auto Stages = rankStages(Ranks);
  if (!Stages)
    return Stages.takeError();
  size_t Parallel = Stages->front().size();
  if (Parallel > 1 && Parallel != TargetParallel)
    return makeError("the " + Flag + " has " + Twine(Parallel) +
                     " tensor-parallel ranks per stage and the target " + Twine(TargetParallel) +
                     ": a sharded reference is compared shard for shard, with as many ranks");
  return loadColumn(S, Ranks, *Stages, 0);
}

} // namespace

Expected<Diagnosis> diagnose(ArrayRef<TraceReader *> TargetRanks,
                             ArrayRef<TraceReader *> ReferenceRanks,
                             ArrayRef<TraceReader *> FP32Ranks, const DiagnoseOptions &Options) {
  TraceReader &Target = *TargetRanks.front(), &Reference = *ReferenceRanks.front();
  TraceReader *ReferenceFP32 = FP32Ranks.empty() ? nullptr : FP32Ranks.front();
  Side T, R, F;
  auto Stages = rankStages(TargetRanks);
  if (!Stages)
    return Stages.takeError();
  if (Error E = loadColumn(T, TargetRanks, *Stages, 0))
    return E;
  // Tensor-parallel ranks: the first is compared, the others lend their
  // shards — unless the reference is sharded alike (then shard meets shard).
  size_t Parallel = Stages->front().size();
  if (Error E = loadReference(R, ReferenceRanks, Parallel, "reference"))
    return E;
  if (ReferenceFP32)
    if (Error E = loadReference(F, FP32Ranks, Parallel, "FP32 reference"))
      return E;
  std::vector<std::unique_ptr<Side>> Peers;
  for (size_t P = 1; P < Parallel; ++P) {
    Peers.push_back(std::make_unique<Side>());
    if (Error E = loadColumn(*Peers.back(), TargetRanks, *Stages, P))
      return E;
  }
  for (Side *S : {&T, &R, &F})
    S->dropPadding();
  for (auto &P : Peers)
    P->dropPadding();
  if (T.Calls.empty())
    return makeError("the target trace '" + Target.directory() + "' has no module calls");
  if (R.Calls.empty())
    return makeError("the reference trace '" + Reference.directory() + "' has no module calls");
  Diagnoser Run(T, R, ReferenceFP32 ? &F : nullptr, Options);
  for (auto &P : Peers)
    Run.Peers.push_back(P.get());
  Diagnosis D = Run.run();
  for (Side *S : {&T, &R, &F})
    if (!S->Problem.empty())
      return makeError(S->Problem);
  for (auto &P : Peers)
    if (!P->Problem.empty())
      return makeError(P->Problem);
  if (D.Result != Diagnosis::Verdict::InputsDiffer &&
      llvm::none_of(D.Curve, [](const ComponentRatio &C) { return C.Ratio.has_value(); }))
    return makeError("no target component could be compared with the reference: the module "
                     "paths differ (different models?) or nothing was captured; "
                     "--show-mapping lists the components");
  return D;
}

} // namespace ekka
