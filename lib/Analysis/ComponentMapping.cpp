//===- ComponentMapping.cpp - Target calls onto reference calls -----------===//
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

std::optional<double> Diagnoser::ruleRatio(const ModuleCallRecord &TC,
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
  Dims RefShape;
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
    std::vector<Dims> Shapes;
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
  return joinedRatio(*XT, TT->Type, *XR, YR ? ArrayRef<double>(*YR) : std::nullopt,
                     ruleTensor(R, RC[0], Inputs[0])->Type);
}

std::string Diagnoser::structureDiffers(const ModuleCallRecord &TC, const ModuleCallRecord &RC) {
  if (std::string Why = laterWorkInside(TC, RC); !Why.empty())
    return Why;
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
    if (!sameFeatures(A->Shape, B->Shape) && !transposition(A->Shape, B->Shape) &&
        !memoryOrder(A, B))
      return ("same path, but a different computation: its first " + Role + " has " +
              Twine(A->Shape.back()) + " features against the reference's " +
              Twine(B->Shape.back()))
          .str();
  }
  return "";
}

std::string Diagnoser::laterWorkInside(const ModuleCallRecord &TC, const ModuleCallRecord &RC) {
  const ModuleCallRecord *Begin = T.Calls.data(), *End = Begin + T.Calls.size();
  if (&TC < Begin || &TC >= End)
    return "";
  StringRef Prefix = TC.Path;
  DenseSet<int64_t> Inside = {TC.Id};
  for (const ModuleCallRecord *X = &TC + 1; X < End && X->ParentId && Inside.count(*X->ParentId);
       ++X) {
    Inside.insert(X->Id);
    // A call inside it named elsewhere than under it: a module it (or a
    // helper of its own) borrows.
    if (Prefix.empty() || StringRef(X->Path).starts_with((Prefix + ".").str()))
      continue;
    auto RIt = R.ByKey.find(T.KeyOf.lookup(X->Id));
    if (RIt == R.ByKey.end() || RIt->second->Seq < RC.Seq)
      continue; // the reference runs it before (an input made inside)
    bool Within = false;
    for (const ModuleCallRecord *M = parentOf(R, *RIt->second); M && !Within; M = parentOf(R, *M))
      Within = M->Id == RC.Id;
    if (!Within)
      return "same path, but a different computation: it calls " + X->Path +
             ", which the reference calls after it, outside it";
  }
  return "";
}

bool Diagnoser::rootHolds(const ModuleCallRecord &TC,
                          const std::vector<const ModuleCallRecord *> &RC) const {
  // The target's root onto a reference module (an engine's model returns
  // the hidden states, HF's base `model`'s): only where they have the
  // same features.
  if (TC.Path.empty() && !TC.ParentId)
    for (const ModuleCallRecord *X : RC) {
      const TensorRecord *A = T.tensor(TC.Id, "output", 0), *B = R.tensor(X->Id, "output", 0);
      if (!A || !B || !sameFeatures(A->Shape, B->Shape))
        return false;
    }
  for (const ModuleCallRecord *X : RC) {
    if (!X->Path.empty())
      continue;
    // The root returns what its program asks for: HF's ForCausalLM (and
    // ForConditionalGeneration) the logits first, by HF's convention; a
    // program's own wrapper anything, a softmax of them as well.
    StringRef Class = X->ClassName;
    if (!Class.ends_with("ForCausalLM") && !Class.ends_with("ForConditionalGeneration"))
      return false;
    const TensorRecord *A = T.tensor(TC.Id, "output", 0), *B = R.tensor(X->Id, "output", 0);
    if (!A || !B || A->Shape.empty() || B->Shape.empty() || A->Shape.back() != B->Shape.back() ||
        unitRoundoff(B->Type) == 0)
      return false;
  }
  return true;
}

/// A rule's noise (MappingRule::Noise), for the call it mapped; \p From
/// names the rule.
static void takeNoise(const MappingRule &Rule, const std::string &From, ComponentRatio &C) {
  if (!Rule.Noise)
    return;
  C.RuleNoise = Rule.Noise;
  C.NoiseOwn = true;
  C.NoiseFrom = From;
}

bool Diagnoser::applyRule(const ModuleCallRecord &TC, ComponentRatio &C) {
  std::vector<const MappingRule *> Rules;
  for (const MappingRule &Rule : O.Mapping)
    Rules.push_back(&Rule);
  if (O.UseRecipes)
    for (const MappingRule &Rule : builtinRecipes())
      Rules.push_back(&Rule);
  for (const MappingRule *RulePtr : Rules) {
    const MappingRule &Rule = *RulePtr;
    auto Stars = matchPath(Rule.Target, TC.Path);
    if (!Stars ||
        (!Rule.Classes.empty() && !classMatches(Rule.Classes, TC.ClassName, TC.ClassQualname)))
      continue;
    if (!Rule.Parts.empty())
      return applyPartRule(TC, Rule, *Stars, C);
    // The reference's paths, with the call's own relatives in them.
    std::vector<std::string> Named;
    for (const std::string &Pattern : Rule.Reference)
      if (auto P = relativePath(substitute(Pattern, *Stars), TC))
        Named.push_back(std::move(*P));
    if (Named.size() != Rule.Reference.size())
      continue; // a relative the call does not have (no next call)
    // A rule onto the call's own path (what --calibrate writes for a layout
    // the shapes left open): paired by path, as without it, with its layout.
    if (Named.size() == 1 && Named[0] == TC.Path) {
      if (Rule.Transpose)
        RuleLayouts[TC.Id] = *Rule.Transpose;
      takeNoise(Rule, Rule.Source, C);
      return false;
    }
    bool Recipe = Rule.Source != "mapping file";
    auto Key = T.KeyOf.lookup(TC.Id);
    // A recipe translates between two frameworks' names; where the
    // reference has the target's own path (the same model code on both
    // sides), pairing by path is the better evidence — unless the structure
    // says that path computes something else there (vLLM's root returns
    // the hidden states where HF's returns the logits; its act_fn takes
    // gate and up together).
    if (Recipe && Rule.Source != "calibration")
      if (auto Same = R.ByKey.find(Key);
          Same != R.ByKey.end() && structureDiffers(TC, *Same->second).empty())
        continue;
    std::vector<const ModuleCallRecord *> RC, FC;
    std::vector<bool> Inputs;
    C.ReferencePaths.clear();
    for (const std::string &Reference : Named) {
      C.ReferencePaths.push_back(Reference);
      auto [Path, Role] = referenceRole(Reference);
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
    if (RC.size() != Rule.Reference.size() || (Recipe && !rootHolds(TC, RC))) {
      C.ReferencePaths.clear(); // a recipe that does not apply here
      continue;
    }
    C.MappedBy = Rule.Source;
    // Which rule of a knowledge base: the class it knows, or the name.
    if (!Rule.Classes.empty())
      C.MappedBy += ": class " + TC.ClassName;
    else if (Recipe && StringRef(Rule.Target).starts_with("**."))
      C.MappedBy += ": name " + StringRef(TC.Path).rsplit('.').second.str();
    takeNoise(Rule, C.MappedBy, C);
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
    C.InputRatio = callRatio(TC, *RC[0], FC.empty() ? nullptr : FC[0], "input", &C.InputsCompared);
    return true;
  }
  return false;
}

std::optional<std::string> Diagnoser::relativePath(StringRef Pattern,
                                                   const ModuleCallRecord &TC) const {
  auto Under = [](StringRef Path, StringRef Rest) -> std::string {
    // `{parent}.x` of a call at the top level is `x`.
    if (Path.empty() && Rest.starts_with("."))
      return Rest.drop_front().str();
    return (Path + Rest).str();
  };
  auto Parent = [](StringRef Path) -> std::optional<StringRef> {
    if (Path.empty())
      return std::nullopt;
    size_t Dot = Path.rfind('.');
    return Dot == StringRef::npos ? StringRef() : Path.take_front(Dot);
  };
  if (Pattern.consume_front("{parent}")) {
    auto P = Parent(TC.Path);
    return P ? std::optional<std::string>(Under(*P, Pattern)) : std::nullopt;
  }
  if (Pattern.consume_front("{grandparent}")) {
    auto P = Parent(TC.Path);
    auto G = P ? Parent(*P) : std::nullopt;
    return G ? std::optional<std::string>(Under(*G, Pattern)) : std::nullopt;
  }
  if (Pattern.consume_front("{next}")) {
    const ModuleCallRecord *Next = nextSibling(TC);
    return Next ? std::optional<std::string>(Next->Path + Pattern.str()) : std::nullopt;
  }
  return Pattern.str();
}

const ModuleCallRecord *Diagnoser::nextSibling(const ModuleCallRecord &TC) const {
  // The calls that follow, while they stay inside TC's parent: the first
  // with TC's parent is the next.
  const ModuleCallRecord *Begin = T.Calls.data(), *End = Begin + T.Calls.size();
  const ModuleCallRecord *At = &TC;
  if (At < Begin || At >= End)
    return nullptr;
  DenseSet<int64_t> Inside = {TC.Id};
  for (const ModuleCallRecord *X = At + 1; X < End && X->Step == TC.Step; ++X) {
    if (X->ParentId == TC.ParentId)
      return X;
    if (!X->ParentId || !Inside.count(*X->ParentId))
      return nullptr;
    Inside.insert(X->Id);
  }
  return nullptr;
}

bool Diagnoser::applyPartRule(const ModuleCallRecord &TC, const MappingRule &Rule,
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
  takeNoise(Rule, C.MappedBy, C);
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
  Dims PartShape = RO->Shape;
  PartShape[Dim] = Sizes[size_t(Rule.Part)];
  auto XR = Part(R, RO);
  const ModuleCallRecord *FC = fp32Call(&RC);
  auto YR = FC ? Part(*F, ruleTensor(*F, FC, Input)) : std::nullopt;
  auto XT = targetValues(TO, TC.Id, PartShape);
  if (XR && XT)
    C.Ratio = ratioValues(*XT, TO->Type, *XR, RO->Type,
                          YR ? ArrayRef<double>(*YR) : std::nullopt);
  if (Input)
    C.InputsCompared = false; // what the part was given has no counterpart
  else
    C.InputRatio = callRatio(TC, RC, FC, "input", &C.InputsCompared);
  return true;
}

void Diagnoser::pair(const ModuleCallRecord &TC, const ModuleCallRecord &RC, ComponentRatio &C) {
  const ModuleCallRecord *FC = fp32Call(&RC);
  C.ReferencePaths = {RC.Path};
  C.Ratio = callRatio(TC, RC, FC, "output", nullptr, &C.ResidualPair);
  C.InputRatio = callRatio(TC, RC, FC, "input", &C.InputsCompared);
  RefOf[TC.Id] = &RC;
  UsedRef.insert(RC.Id);
  Cursor = std::max(Cursor, RC.Seq);
}

void Diagnoser::reservePaths() {
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

bool Diagnoser::mapByEvidence(const ModuleCallRecord &TC, ComponentRatio &C) {
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

bool Diagnoser::comparableShapes(const TensorRecord *A, const TensorRecord *B, int64_t Call) const {
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
  else if (!sameFeatures(A->Shape, B->Shape) && !transposition(A->Shape, B->Shape) &&
           !memoryOrder(A, B))
    return false;
  return N == numElements(B->Shape);
}

bool Diagnoser::plausibleNorms(const TensorRecord *A, const TensorRecord *B) const {
  const TensorRecord *PA = producer(T, A), *PB = producer(R, B);
  if (!PA || !PB || !PA->Stats || !PB->Stats || MergeSteps || !Peers.empty() || !T.Padded.empty() ||
      !R.Padded.empty())
    return true;
  double NA = std::sqrt(PA->Stats->SumSq), NB = std::sqrt(PB->Stats->SumSq);
  if (!std::isfinite(NA) || !std::isfinite(NB))
    return true;
  return std::abs(NA - NB) <= 0.1 * std::max(NA, NB);
}

} // namespace detail
} // namespace ekka
