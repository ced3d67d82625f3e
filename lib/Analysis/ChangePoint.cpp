//===- ChangePoint.cpp - Localization: the first local divergence ---------===//
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

bool Diagnoser::rescaledAfter(Diagnosis &D, size_t I) {
  const ComponentRatio &C = D.Curve[I];
  // The next mapped call after it, outside it and not around it: what its
  // output goes on to.
  size_t J = I + 1;
  while (J < D.Curve.size() && (within(D.Curve[J].CallId, C.CallId) ||
                                within(C.CallId, D.Curve[J].CallId) || !D.Curve[J].Mapped ||
                                !D.Curve[J].Ratio))
    ++J;
  if (J == D.Curve.size() || !D.Curve[J].InputsCompared || !D.Curve[J].InputRatio ||
      elevated(D.Curve[J].InputRatio))
    return false;
  // And it is given C's output, in the reference (HF's layer 0 takes its
  // scaled embedding's): not a neighbour given the same input (up_proj
  // beside a gate_proj that departs).
  const ModuleCallRecord *RC = refCall(C.CallId), *RJ = refCall(D.Curve[J].CallId);
  const TensorRecord *Out = RC ? R.tensor(RC->Id, "output", 0) : nullptr;
  RoleTensors In = RJ ? roleTensors(R, RJ->Id, "input") : RoleTensors();
  if (!Out || In.empty() || !R.sameTensor(In.begin()->second, Out))
    return false;
  // A factoring, far from one (Gemma's sqrt(hidden)): a modest scale with
  // the next input just within noise is a modest bug, not a factoring.
  std::string Relation = relation(C);
  StringRef Factor(Relation);
  double Scale = 0;
  if (!Factor.consume_front("the reference's times ") || !to_float(Factor, Scale) ||
      !(std::fabs(std::log2(std::fabs(Scale))) >= 1))
    return false;
  RescaledCalls.insert(C.CallId);
  D.Rescaled.push_back(C.Path + "'s output is " + Relation + ", and " + D.Curve[J].Path +
                       " after it is given what its counterpart is: the engine scales it "
                       "between the two, where the reference's module scales it inside");
  return true;
}

void Diagnoser::localize(Diagnosis &D) {
  // CurveIndex: computeRatios's, of this curve.
  for (ComponentRatio &C : D.Curve)
    C.InputNoiseByDesign = elevated(C.InputRatio) && inputNoiseByDesign(D, C);
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
    // output just over it only passed a divergence on. An input above the
    // threshold by a noise upstream that a rule allows (an attention
    // backend's) is such an input too.
    if (C.Mapped && departs(C) && (!elevated(C.InputRatio) || C.InputNoiseByDesign) &&
        *C.Ratio > C.Threshold.value_or(O.Threshold) * std::max(1.0, C.InputRatio.value_or(0)) &&
        (C.InputsCompared || !divergedUpstream(D, I)) &&
        (C.MappedBy != "structure" || containerDeparts(D, I)) && !rescaledAfter(D, I))
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
      if (D.Curve[I].Mapped && departs(D.Curve[I]) &&
          (elevated(D.Curve[I].InputRatio) || !D.Curve[I].InputsCompared) &&
          !D.Curve[I].InputNoiseByDesign) {
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
  std::stable_sort(Containers.begin(), Containers.end(),
                   [&](size_t A, size_t B) { return D.Curve[A].Depth > D.Curve[B].Depth; });
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
        << (std::isinf(*D.Curve[I].Ratio) ? nonFinite(D.Curve[I]) : std::string())
        << (D.Curve[I].CalibratedNoise
                ? formatv(", above its calibrated noise: {0} on the known-good pair, "
                          "threshold {1}",
                          format("%.3g", *D.Curve[I].CalibratedNoise),
                          format("%.3g", *D.Curve[I].Threshold))
                      .str()
                : std::string())
        << ") while its inputs do not ("
        << (D.Curve[I].InputRatio
                ? "R = " + formatv("{0}", format("%.3g", *D.Curve[I].InputRatio)).str()
                : std::string("inputs not compared"))
        << (D.Curve[I].InputsCompared ? "" : "; some inputs could not be compared") << ")";
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
          W && !departs(D.Curve[*W]) && llvm::none_of(D.Suspects, [&](const Suspect &X) {
            return X.Component.CallId == D.Curve[*W].CallId;
          })) {
        Suspect Writer;
        Writer.Component = D.Curve[*W];
        Writer.Reason = "it wrote, in place (op " + S.Op->Name + "), the tensor that " +
                        S.Op->ReadBy +
                        " then read, and that departs from what the "
                        "reference's read; its own output does not show it";
        Writer.Op = S.Op;
        Writer.Before = S.Before;
        Writer.After = S.After;
        D.Suspects.push_back(std::move(Writer));
        if (D.Suspects.size() == 3)
          break;
      }
    // Inputs that could not be compared came from a component without a
    // reference counterpart (an engine's rotary embedding, which HF
    // applies in a plain function): what it computed is unchecked, and the
    // departure may be its. It comes next; first where the reference's op
    // statistics found its output nowhere (it computed something else, and
    // the suspect only consumed it).
    std::optional<UnmappedProducer> P;
    if (!D.Curve[I].InputsCompared)
      P = unmappedProducer(D, D.Curve[I]);
    if (P && llvm::any_of(D.Suspects, [&](const Suspect &X) {
          return X.Component.CallId == D.Curve[P->Index].CallId;
        }))
      P.reset();
    auto AddProducer = [&] {
      Suspect Producer;
      Producer.Component = D.Curve[P->Index];
      Producer.Reason = "it computed inputs of " +
                        (D.Curve[I].Path.empty() ? std::string("(root)") : D.Curve[I].Path) +
                        ", whose output departs (R = " +
                        formatv("{0}", format("%.3g", *D.Curve[I].Ratio)).str() +
                        "), and has no reference counterpart: what it computed was not "
                        "compared (see --show-mapping); " +
                        P->Why;
      for (size_t J = P->Index >= 3 ? P->Index - 3 : 0; J < P->Index; ++J)
        Producer.Before.push_back(D.Curve[J]);
      for (size_t J = P->Index + 1; J < D.Curve.size() && J <= P->Index + 3; ++J)
        Producer.After.push_back(D.Curve[J]);
      Producer.Op = lastWriter(D.Curve[P->Index], /*OfOutput=*/true);
      D.Suspects.push_back(std::move(Producer));
    };
    if (P && P->Disagrees) {
      AddProducer();
      P.reset();
      if (D.Suspects.size() == 3)
        break;
    } else if (!D.Curve[I].InputsCompared) {
      // No module made them: an op did, in place, and the reference's op
      // statistics found what it wrote nowhere. The block that ran it
      // comes first, with the op.
      auto W = disagreeingOpProducer(D, I);
      if (W && llvm::none_of(D.Suspects, [&](const Suspect &X) {
            return X.Component.CallId == D.Curve[W->first].CallId;
          })) {
        Suspect Writer;
        Writer.Component = D.Curve[W->first];
        Writer.Reason = "it ran " + W->second.Name + ", which wrote inputs of " +
                        (D.Curve[I].Path.empty() ? std::string("(root)") : D.Curve[I].Path) +
                        " (whose output departs, R = " +
                        formatv("{0}", format("%.3g", *D.Curve[I].Ratio)).str() +
                        ") that the reference computed nowhere: it computed something else";
        for (size_t J = W->first >= 3 ? W->first - 3 : 0; J < W->first; ++J)
          Writer.Before.push_back(D.Curve[J]);
        for (size_t J = W->first + 1; J < D.Curve.size() && J <= W->first + 3; ++J)
          Writer.After.push_back(D.Curve[J]);
        Writer.Op = std::move(W->second);
        D.Suspects.push_back(std::move(Writer));
        if (D.Suspects.size() == 3)
          break;
      }
    }
    if (llvm::none_of(D.Suspects,
                      [&](const Suspect &X) { return X.Component.CallId == S.Component.CallId; }))
      D.Suspects.push_back(std::move(S));
    if (P && D.Suspects.size() < 3)
      AddProducer();
  }
}

std::optional<Diagnoser::UnmappedProducer>
Diagnoser::unmappedProducer(const Diagnosis &D, const ComponentRatio &C) {
  for (const TensorRecord *X : inputsNotCompared(C)) {
    if (!X->SourceId)
      continue;
    const TensorRecord *Source = T.TensorById.lookup(*X->SourceId);
    if (!Source || Source->Owner != TensorOwner::ModuleCall || Source->OwnerId == C.CallId ||
        within(C.CallId, Source->OwnerId))
      continue;
    auto It = CurveIndex.find(Source->OwnerId);
    if (It == CurveIndex.end() || D.Curve[It->second].Mapped)
      continue;
    std::string Why;
    if (std::optional<bool> Agrees = agreesByStatistics(D, It->second, Why); !Agrees || !*Agrees)
      return UnmappedProducer{It->second, Why, Agrees.has_value()};
  }
  return std::nullopt;
}

namespace {
/// A tensor's recorded statistics, over its elements; several (a call's
/// steps) add up.
struct Totals {
  double N = 0, Sum = 0, SumSq = 0, Min = INFINITY, Max = -INFINITY;
  bool add(const TensorRecord &X) {
    if (!X.Stats || X.Stats->NanCount || X.Stats->InfCount || unitRoundoff(X.Type) == 0)
      return false;
    double Elements = 1;
    for (int64_t D : X.Shape)
      Elements *= double(D);
    N += Elements;
    Sum += X.Stats->Sum;
    SumSq += X.Stats->SumSq;
    Min = std::min(Min, X.Stats->Min);
    Max = std::max(Max, X.Stats->Max);
    return Elements > 0;
  }
  /// Whether \p O holds the same values up to rounding at unit roundoff
  /// \p U: a few roundings an element, of either sign, in another order.
  bool agrees(const Totals &O, double U) const {
    if (N != O.N)
      return false;
    double Rms = std::sqrt(std::max(SumSq, O.SumSq) / N), Tol = 16 * U;
    double Big = std::max({std::fabs(Min), std::fabs(Max), std::fabs(O.Min), std::fabs(O.Max)});
    return std::fabs(Sum - O.Sum) <= Tol * Rms * std::sqrt(N) &&
           std::fabs(SumSq - O.SumSq) <= 2 * Tol * std::max(SumSq, O.SumSq) &&
           std::fabs(Min - O.Min) <= Tol * Big && std::fabs(Max - O.Max) <= Tol * Big;
  }
};
} // namespace

/// Whether an op output of the reference in a call \p Inside accepts has
/// the statistics \p Mine of a target tensor of type \p Type.
static bool holds(const Side &R, const Totals &Mine, DType Type,
                  function_ref<bool(int64_t)> Inside) {
  for (const OpRecord &Op : R.Ops) {
    if (!Op.ModuleCallId || !Inside(*Op.ModuleCallId))
      continue;
    auto Outs = R.OpStatistics.find(Op.Id);
    if (Outs == R.OpStatistics.end())
      continue;
    for (const TensorRecord *Y : Outs->second) {
      Totals Theirs;
      if (Theirs.add(*Y) &&
          Mine.agrees(Theirs, std::max(unitRoundoff(Type), unitRoundoff(Y->Type))))
        return true;
    }
  }
  return false;
}

std::optional<bool> Diagnoser::agreesByStatistics(const Diagnosis &D, size_t Index,
                                                  std::string &Why) {
  // Each of its outputs (over every step it ran, where steps are merged)
  // against the op outputs of the reference inside its mapped ancestor's
  // counterpart: the statistics recorded with every tensor, captured or
  // not, are the same values' where one of those ops computed what it did
  // (HF's rotary embedding, applied by plain ops in its attention).
  if (R.OpStatistics.empty()) {
    Why = "trace the reference with --op-stats to check it against the reference's ops";
    return std::nullopt;
  }
  // A batch padded to its longest prompt: the reference's ops computed the
  // padding too, and their statistics count it.
  if (!R.Padded.empty()) {
    Why = "the reference's batch is padded, and the statistics of its ops, which count the "
          "padding, cannot check it";
    return std::nullopt;
  }
  const ComponentRatio *Ancestor = mappedAncestor(D, Index);
  const ModuleCallRecord *Scope = Ancestor ? refCall(Ancestor->CallId) : nullptr;
  int64_t Call = D.Curve[Index].CallId;
  RoleTensors Outputs = roleTensors(T, Call, "output");
  if (!Scope) {
    Why = "no mapped component holds it, whose counterpart's ops could check it";
    return std::nullopt;
  }
  Why = "its outputs have no statistics to check against the reference's ops (none, or not "
        "floating-point, or not finite)";
  if (Outputs.empty())
    return std::nullopt;
  auto Later = LaterSteps.find(Call);
  // Steps joined: the reference ran them as one, and step 1 alone is not
  // what its ops computed.
  if (MergeSteps && Later == LaterSteps.end())
    return std::nullopt;
  // A tensor, and under tensor parallelism the other ranks' shards of it
  // (a replicated one is whole on each): what the reference computed whole.
  auto Add = [&](Totals &Mine, const TensorRecord *X) {
    if (!X || !Mine.add(*X))
      return false;
    if (Peers.empty() || replicated(X))
      return true;
    std::vector<const TensorRecord *> Shards = peerTensors(X);
    if (Shards.size() != Peers.size())
      return false;
    return llvm::all_of(Shards, [&](const TensorRecord *P) { return Mine.add(*P); });
  };
  for (const auto &[I, X] : Outputs) {
    Totals Mine;
    if (!Add(Mine, X))
      return std::nullopt;
    if (MergeSteps)
      for (const ModuleCallRecord *M : Later->second)
        if (!Add(Mine, T.tensor(M->Id, "output", I)))
          return std::nullopt;
    if (!holds(R, Mine, X->Type, [&](int64_t C) { return within(R, C, Scope->Id); })) {
      Why = "no op output of the reference's " +
            (Scope->Path.empty() ? std::string("(root)") : Scope->Path) +
            " has its outputs' statistics";
      return false;
    }
  }
  return true;
}

std::optional<std::pair<size_t, OpFinding>>
Diagnoser::disagreeingOpProducer(const Diagnosis &D, size_t Index) {
  const ComponentRatio &C = D.Curve[Index];
  // Under tensor parallelism an op's writes are one rank's shard, and the
  // other ranks' are not keyed to it: nothing to check them with.
  if (R.OpStatistics.empty() || !R.Padded.empty() || !Peers.empty())
    return std::nullopt;
  const ComponentRatio *Ancestor = mappedAncestor(D, Index);
  const ModuleCallRecord *Scope = Ancestor ? refCall(Ancestor->CallId) : nullptr;
  if (!Scope)
    return std::nullopt;
  auto OpsNamed = [&](int64_t Call, StringRef Name) {
    std::vector<const OpRecord *> Out;
    for (const OpRecord &O : T.Ops)
      if (O.ModuleCallId == Call && O.Name == Name)
        Out.push_back(&O);
    return Out;
  };
  auto WriteOf = [&](const OpRecord *O, StringRef Role, int64_t Index) -> const TensorRecord * {
    auto W = T.OpWrites.find(O->Id);
    if (W != T.OpWrites.end())
      for (const TensorRecord *Y : W->second)
        if (Y->Role == Role && Y->Index == Index)
          return Y;
    return nullptr;
  };
  for (const TensorRecord *X : inputsNotCompared(C)) {
    // One a module returned is unmappedProducer's.
    if (X->SourceId)
      if (const TensorRecord *Source = T.TensorById.lookup(*X->SourceId);
          Source && Source->Owner == TensorOwner::ModuleCall)
        continue;
    std::optional<OpFinding> F = writerOf(*Ancestor, X, C.CallId, &C);
    auto Wanted = T.values(X);
    // An engine's own kernel, which stands for several of the reference's
    // ops: a PyTorch op it runs in place of one the reference runs
    // elsewhere (q scaled before the backend, where HF scales inside its
    // attention) computes what no reference op output holds, rightly.
    if (!F || !Wanted || StringRef(F->Name).starts_with("aten::"))
      continue;
    // The op, and which of the tensors it wrote holds what C was given.
    std::vector<const OpRecord *> Same = OpsNamed(F->CallId, F->Name);
    auto At = llvm::find_if(Same, [&](const OpRecord *O) { return O->Seq == F->OpSeq; });
    if (At == Same.end())
      continue;
    const TensorRecord *Written = nullptr;
    if (auto W = T.OpWrites.find((*At)->Id); W != T.OpWrites.end())
      for (const TensorRecord *Y : W->second)
        if (auto V = T.values(Y); V && sameValues(*V, *Wanted)) {
          Written = Y;
          break;
        }
    Totals Mine;
    if (!Written || !Mine.add(*Written))
      continue;
    // Where the steps were joined, the same op (that occurrence of its
    // name in its call) of every later step: the reference ran them as one.
    if (MergeSteps) {
      auto Later = LaterSteps.find(F->CallId);
      if (Later == LaterSteps.end())
        continue;
      size_t Occurrence = size_t(At - Same.begin());
      bool All = true;
      for (const ModuleCallRecord *M : Later->second) {
        std::vector<const OpRecord *> There = OpsNamed(M->Id, F->Name);
        const TensorRecord *Y =
            Occurrence < There.size() ? WriteOf(There[Occurrence], Written->Role, Written->Index)
                                      : nullptr;
        if (!Y || !Mine.add(*Y)) {
          All = false;
          break;
        }
      }
      if (!All)
        continue;
    }
    if (holds(R, Mine, Written->Type, [&](int64_t Call) { return within(R, Call, Scope->Id); }))
      continue;
    std::optional<size_t> Owner =
        mappedCallAround(D, F->CallId, std::numeric_limits<int64_t>::min());
    if (!Owner)
      continue;
    F->Reason = "it wrote what " + (C.Path.empty() ? std::string("(root)") : C.Path) +
                " was given (its " + Written->Role + " tensor " +
                std::to_string(Written->Index) + "), and no op output of the reference's " +
                (Scope->Path.empty() ? std::string("(root)") : Scope->Path) +
                " has its statistics";
    return std::make_pair(*Owner, std::move(*F));
  }
  return std::nullopt;
}

std::string Diagnoser::nonFinite(const ComponentRatio &C) const {
  // Over every step the component ran where its steps were joined (each
  // its own call), else over its own step.
  auto Count = [&](const Side &S, StringRef Path, int64_t &NaN, int64_t &Inf) {
    for (const ModuleCallRecord &M : S.Calls)
      if (M.Path == Path && (MergeSteps || M.Step == C.Step))
        if (auto It = S.ByCall.find(M.Id); It != S.ByCall.end())
          if (auto Out = It->second.find("output"); Out != It->second.end())
            for (const auto &[Index, X] : Out->second)
              if (X->Stats) {
                NaN += X->Stats->NanCount;
                Inf += X->Stats->InfCount;
              }
  };
  int64_t NaN = 0, Inf = 0, RefNaN = 0, RefInf = 0;
  Count(T, C.Path, NaN, Inf);
  for (const std::string &P : C.ReferencePaths)
    Count(R, P, RefNaN, RefInf);
  if (!NaN && !Inf)
    return "";
  return formatv(": its outputs hold {0} NaN and {1} Inf values, the reference's {2} and {3}", NaN,
                 Inf, RefNaN, RefInf)
      .str();
}

bool Diagnoser::inputNoiseByDesign(const Diagnosis &D, const ComponentRatio &C) const {
  if (!C.InputRatio || !C.InputsCompared)
    return false;
  std::optional<double> Allowed;
  return explainedByNoise(D, C, 0, Allowed) && Allowed && *C.InputRatio <= *Allowed;
}

bool Diagnoser::explainedByNoise(const Diagnosis &D, const ComponentRatio &At, int Depth,
                                 std::optional<double> &Allowed) const {
  if (Depth == 8)
    return false;
  bool Explained = false;
  for (const auto &[Index, X] : roleTensors(T, At.CallId, "input")) {
    if (unitRoundoff(X->Type) == 0)
      continue; // token ids, positions
    // A value nobody compared (no source, or an unmapped one's) may be
    // what departs: nothing is explained.
    const TensorRecord *Source = X->SourceId ? T.TensorById.lookup(*X->SourceId) : nullptr;
    auto It = Source && Source->Owner == TensorOwner::ModuleCall ? CurveIndex.find(Source->OwnerId)
                                                                 : CurveIndex.end();
    if (It == CurveIndex.end())
      return false;
    const ComponentRatio &P = D.Curve[It->second];
    if (!P.Mapped || !P.Ratio || P.CallId == At.CallId)
      return false;
    if (!elevated(P.Ratio))
      continue;
    if (P.RuleNoise && !departs(P)) {
      Allowed = std::min(Allowed.value_or(INFINITY), thresholdOf(P, D));
      Explained = true;
      continue;
    }
    // A call that only passed an elevated input on, itself explained.
    if (P.InputRatio && P.InputsCompared &&
        *P.Ratio <= thresholdOf(P, D) * std::max(1.0, *P.InputRatio) &&
        explainedByNoise(D, P, Depth + 1, Allowed)) {
      Explained = true;
      continue;
    }
    return false;
  }
  return Explained;
}

bool Diagnoser::divergedUpstream(const Diagnosis &D, size_t Index) const {
  const ComponentRatio *Ancestor = mappedAncestor(D, Index);
  if (!Ancestor) {
    // A call of its own after the root's forward (vLLM's logits
    // processor): the step's root before it is what fed it.
    const ComponentRatio &C = D.Curve[Index];
    for (size_t J = Index; J-- > 0;)
      if (D.Curve[J].Step == C.Step && D.Curve[J].Depth == 0 && D.Curve[J].Mapped &&
          D.Curve[J].CallId != C.CallId)
        return departs(D.Curve[J]);
    return false;
  }
  if (elevated(Ancestor->InputRatio))
    return true;
  for (size_t J = 0; J < Index; ++J) {
    const ComponentRatio &X = D.Curve[J];
    if (X.Mapped && X.CallId != Ancestor->CallId && X.Seq > Ancestor->Seq &&
        within(X.CallId, Ancestor->CallId) && departs(X))
      return true;
  }
  return false;
}

const ComponentRatio *Diagnoser::mappedAncestor(const Diagnosis &D, size_t Index) const {
  const ModuleCallRecord *M = T.CallById.lookup(D.Curve[Index].CallId);
  if (!M || !M->ParentId)
    return nullptr;
  auto I = mappedCallAround(D, *M->ParentId, std::numeric_limits<int64_t>::min());
  return I ? &D.Curve[*I] : nullptr;
}

std::optional<std::pair<size_t, std::string>>
Diagnoser::lowerPrecisionProducer(const Diagnosis &D, const ComponentRatio &C) {
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
          It->second,
          ("its output is " + dtypeName(Source->Type) + " where the reference's is " +
           dtypeName(Ref->Type) + ": computed at a lower precision, it feeds " +
           (C.Path.empty() ? std::string("(root)") : C.Path) + ", whose output departs (R = " +
           formatv("{0}", format("%.3g", *C.Ratio)).str() + ") though its other inputs do not")
              .str());
  }
  return std::nullopt;
}

std::optional<size_t> Diagnoser::mappedCallAround(const Diagnosis &D, int64_t Call,
                                                  int64_t Stop) const {
  for (const ModuleCallRecord *M = T.CallById.lookup(Call); M && M->Id != Stop; M = parentOf(T, *M))
    if (auto It = CurveIndex.find(M->Id); It != CurveIndex.end() && D.Curve[It->second].Mapped)
      return It->second;
  return std::nullopt;
}

} // namespace detail
} // namespace ekka
