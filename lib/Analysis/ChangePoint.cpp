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

void Diagnoser::localize(Diagnosis &D) {
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
          W && !elevated(D.Curve[*W].Ratio) && llvm::none_of(D.Suspects, [&](const Suspect &X) {
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
    if (llvm::none_of(D.Suspects,
                      [&](const Suspect &X) { return X.Component.CallId == S.Component.CallId; }))
      D.Suspects.push_back(std::move(S));
  }
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
