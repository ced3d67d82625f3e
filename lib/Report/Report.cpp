//===- Report.cpp - A diagnosis as text, JSON, a mapping listing ----------===//
#include "ekka/Report/Report.h"
#include "ekka/Config.h"
#include "ekka/Support/Plural.h"
#include "ekka/Support/Printable.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>
#include <limits>

using namespace llvm;

namespace ekka {

namespace {

/// A ratio as JSON: infinity (a NaN or Inf where the reference has none)
/// is not a JSON number; the largest double stands for it.
json::Value ratioJSON(const std::optional<double> &R) {
  if (!R)
    return nullptr;
  return std::isfinite(*R) ? *R : std::numeric_limits<double>::max();
}

json::Value orNull(const std::string &S) { return S.empty() ? json::Value(nullptr) : json::Value(S); }

} // namespace

/// One decode step's departure, as the text says it.
static std::string departureText(const SamplingDeparture &S) {
  std::string Out;
  raw_string_ostream OS(Out);
  OS << "step " << S.Step << " consumed token " << S.Consumed << " where the argmax of "
     << printable(S.Logits) << "'s logits of step " << S.Step - 1 << " is " << S.Argmax;
  if (S.Row >= 0)
    OS << " (" << S.Consumed << " is the argmax of their row " << S.Row << " of " << S.Rows
       << (S.Row == S.Rows - 2 ? ": one position early" : "") << ")";
  return Out;
}

/// The decode steps whose token was not the target's own argmax.
static void printSampling(raw_ostream &OS, const Diagnosis &D, bool Verdict) {
  if (D.Sampling.empty())
    return;
  OS << "\nsampling: " << D.Sampling.size() << " of " << countOf(D.SamplingChecked, "decode step")
     << " checked consumed a token other than the argmax of the target's logits before it:\n";
  constexpr size_t MostSteps = 8;
  for (size_t I = 0; I < D.Sampling.size() && I < MostSteps; ++I)
    OS << "  " << departureText(D.Sampling[I]) << "\n";
  if (D.Sampling.size() > MostSteps)
    OS << "  ... (" << D.Sampling.size() - MostSteps << " more)\n";
  // Under --greedy with a module's divergence the verdict is the module's,
  // and the sampler departs as well.
  OS << (Verdict    ? "  the target decoded greedily (--greedy): its sampler, or what feeds its "
                      "token back, departs\n"
         : D.Greedy ? "  the target decoded greedily (--greedy): its sampler, or what feeds its "
                      "token back, departs as well\n"
                    : "  under greedy decoding its sampler, or what feeds its token back, departs "
                      "(--greedy makes this the verdict); under temperature sampling it is "
                      "expected\n");
}

/// Whether \p C's path lies inside \p Outer's (below it; the root holds all).
static bool insidePath(const ComponentRatio &Outer, const ComponentRatio &C) {
  return Outer.Path.empty() || StringRef(C.Path).starts_with(Outer.Path + ".");
}

/// The first mapped call inside \p S's component whose inputs depart, when
/// the component's own do not and no call inside it departed before (whose
/// output would be what it was given). Inputs that depart only by a noise
/// a rule allows upstream (an attention backend's, passed to o_proj) do
/// not count.
static const ComponentRatio *firstDepartingInputInside(const Diagnosis &D, const Suspect &S) {
  if (!S.Component.InputRatio || *S.Component.InputRatio > D.Threshold)
    return nullptr;
  for (const ComponentRatio &C : D.Curve) {
    if (C.Seq <= S.Component.Seq || C.Step != S.Component.Step || !C.Mapped ||
        !insidePath(S.Component, C))
      continue;
    if (C.InputRatio && *C.InputRatio > D.Threshold && !C.InputNoiseByDesign)
      return &C;
    if (C.Ratio && *C.Ratio > thresholdOf(C, D))
      return nullptr;
  }
  return nullptr;
}

/// Of joined steps, those in which \p S's outputs alone depart, where not
/// all do: ", departing in steps 2-5".
static std::string departingSteps(const Suspect &S, double Threshold) {
  std::vector<int64_t> Steps;
  for (const auto &[Step, Ratio] : S.StepRatios)
    if (Ratio > Threshold)
      Steps.push_back(Step);
  if (Steps.empty() || Steps.size() == S.StepRatios.size())
    return "";
  return (Steps.size() == 1 ? ", departing in step " : ", departing in steps ") + rangesOf(Steps);
}

std::vector<std::pair<StringRef, StringRef>> diagnosisNotes(const Diagnosis &D) {
  std::vector<std::pair<StringRef, StringRef>> Notes;
  for (const auto &[Label, List] : {std::pair<StringRef, const std::vector<std::string> *>{
                                        "rescaled", &D.Rescaled},
                                    {"few values", &D.FewValues},
                                    {"noisier by design", &D.NoisierByDesign}})
    for (const std::string &Note : *List)
      Notes.emplace_back(Label, Note);
  return Notes;
}

void printText(raw_ostream &OS, const Diagnosis &D, const SourceLocator &Sources) {
  if (D.Result == Diagnosis::Verdict::Divergence && D.Suspects.empty() && !D.Sampling.empty()) {
    OS << "divergence: the sampler: " << departureText(D.Sampling.front()) << "\n";
    OS << "  noise model: " << D.NoiseModel << "\n";
    OS << "  no module call departs beyond numerical noise (largest R = "
       << format("%.3g", D.MaxRatio) << ", threshold " << format("%g", D.Threshold) << ")\n";
    printSampling(OS, D, /*Verdict=*/true);
    return;
  }
  switch (D.Result) {
  case Diagnosis::Verdict::InputsDiffer:
    OS << "inputs-differ: the two programs were not fed the same inputs: "
       << printable(D.InputsDifference) << "\n";
    return;
  case Diagnosis::Verdict::NoDivergence:
    OS << "no-divergence: no component departs beyond numerical noise (largest R = "
       << format("%.3g", D.MaxRatio) << ", threshold " << format("%g", D.Threshold) << ")\n";
    OS << "  noise model: " << D.NoiseModel << "\n";
    for (const auto &[Label, Note] : diagnosisNotes(D))
      OS << "  " << Label << ": " << printable(Note) << "\n";
    printSampling(OS, D, /*Verdict=*/false);
    return;
  case Diagnosis::Verdict::Divergence:
    break;
  }
  const Suspect &First = D.Suspects.front();
  OS << "divergence: " << printable(componentName(First.Component)) << " ("
     << printable(First.Component.ClassName) << ") "
     << (D.MergedSteps > 1 ? "over steps 1-" + std::to_string(D.MergedSteps)
                           : "at step " + std::to_string(First.Component.Step))
     << ", R = " << ratioText(First.Component.Ratio)
     << (First.Op && !First.Op->ReadBy.empty() && First.Component.Ratio &&
                 *First.Component.Ratio <= thresholdOf(First.Component, D)
             ? " (its output), R = " + ratioText(First.Op->Ratio) + " what it wrote in place"
         : First.Component.Ratio && *First.Component.Ratio <= thresholdOf(First.Component, D)
             ? std::string(" (within noise itself: see the first suspect's reason)")
         : !First.Component.Ratio
             ? std::string(" (no reference counterpart: see the first suspect's reason)")
             : std::string())
     << departingSteps(First, thresholdOf(First.Component, D)) << "\n";
  OS << "  noise model: " << D.NoiseModel << "\n";
  for (const auto &[Label, Note] : diagnosisNotes(D))
    OS << "  " << Label << ": " << printable(Note) << "\n";
  // Suspects of several steps (the same module may be one in each) say
  // which step each is.
  bool Steps = llvm::any_of(D.Suspects, [&](const Suspect &S) {
    return S.Component.Step != First.Component.Step;
  });
  unsigned Rank = 0;
  for (const Suspect &S : D.Suspects) {
    OS << "\nsuspect " << ++Rank << ": " << printable(componentName(S.Component)) << "  "
       << printable(S.Component.ClassQualname)
       << (Steps ? "  at step " + std::to_string(S.Component.Step) : std::string()) << "\n";
    OS << "  " << printable(S.Reason) << "\n";
    if (!S.StepRatios.empty()) {
      // The joined steps alone: a departure in decode steps only (a slot
      // mapping off by one) or in the prefill only shows here.
      OS << "  by step (its outputs in each step alone):";
      constexpr size_t MostSteps = 8;
      for (size_t I = 0; I < S.StepRatios.size() && I < MostSteps; ++I)
        OS << (I ? ", " : " ") << "step " << S.StepRatios[I].first << " R = "
           << ratioText(S.StepRatios[I].second);
      if (S.StepRatios.size() > MostSteps)
        OS << ", ... (" << S.StepRatios.size() - MostSteps << " more)";
      double Threshold = thresholdOf(S.Component, D);
      bool FirstDeparts = S.StepRatios.front().second > Threshold;
      bool LaterDepart = llvm::all_of(llvm::drop_begin(S.StepRatios),
                                      [&](const auto &X) { return X.second > Threshold; });
      bool LaterAgree = llvm::none_of(llvm::drop_begin(S.StepRatios),
                                      [&](const auto &X) { return X.second > Threshold; });
      if (!FirstDeparts && LaterDepart)
        OS << ": departs in the later (decode) steps only";
      else if (FirstDeparts && LaterAgree)
        OS << ": departs in the first (prefill) step only";
      OS << "\n";
    }
    if (!S.UnmatchedReference.empty()) {
      // What the reference ran inside it that nothing in the target stands
      // for: a module the target skipped (a final norm never called).
      constexpr size_t MostNames = 4;
      OS << "  in its counterpart, no target call matches:";
      for (size_t I = 0; I < S.UnmatchedReference.size() && I < MostNames; ++I)
        OS << (I ? ", " : " ") << printable(S.UnmatchedReference[I]);
      if (S.UnmatchedReference.size() > MostNames)
        OS << ", ... (" << S.UnmatchedReference.size() - MostNames << " more)";
      OS << "\n";
    }
    if (!S.Relation.empty())
      OS << "  its output: " << printable(S.Relation) << "\n";
    // The first call inside it given what departs, where its own inputs
    // do not: what the block fed it (a router given the residual) is the
    // lead, when no op that wrote it was found.
    if (const ComponentRatio *Given = firstDepartingInputInside(D, S);
        Given && !(S.Op && !S.Op->ReadBy.empty()))
      OS << "  inside it, " << printable(componentName(*Given))
         << " was given what departs from what its counterpart was given (R = "
         << ratioText(Given->InputRatio) << ")\n";
    // Calls inside it whose steps tell (a decode path that skips one).
    std::vector<std::string> Skipped;
    for (const ComponentRatio &C : D.Curve)
      if (!C.UncomparedReason.empty() && insidePath(S.Component, C))
        Skipped.push_back(printable(C.Path + " (" + C.UncomparedReason + ")"));
    constexpr size_t MostSkipped = 4;
    for (size_t I = 0; I < Skipped.size() && I < MostSkipped; ++I)
      OS << "  not compared inside it: " << Skipped[I] << "\n";
    if (Skipped.size() > MostSkipped)
      OS << "  not compared inside it: ... (" << Skipped.size() - MostSkipped << " more)\n";
    OS << "  evidence (R of the calls around it, in execution order):\n";
    auto Line = [&](const ComponentRatio &C, bool Mark) {
      OS << (Mark ? "  > " : "    ") << format("%-12s", ratioText(C.Ratio).c_str()) << " "
         << printable(componentName(C))
         << (C.UncomparedReason.empty() ? "" : "  (" + printable(C.UncomparedReason) + ")")
         << "\n";
    };
    for (const ComponentRatio &C : S.Before)
      Line(C, false);
    Line(S.Component, true);
    for (const ComponentRatio &C : S.After)
      Line(C, false);
    SourceLocator::Link L = Sources.classSource(S.Component);
    if (!L.Location.empty())
      OS << "  source: " << printable(L.Location) << "\n";
    if (S.Op) {
      OS << "  op: " << printable(S.Op->Name);
      if (S.Op->Ratio)
        OS << ", R = " << ratioText(S.Op->Ratio);
      OS << " (" << printable(S.Op->Reason) << ")\n";
      if (std::string Where = Sources.op(S.Op->Name); !Where.empty())
        OS << "  op source: " << printable(Where) << "\n";
      for (size_t I = 0; I < S.Op->Kernels.size(); ++I) {
        const std::string &K = S.Op->Kernels[I];
        SourceLocator::KernelSite Site = Sources.kernel(K);
        OS << "  kernel: " << printable(Site.Display);
        if (!Site.Where.empty())
          OS << "  " << printable(Site.Where);
        OS << "\n";
        if (int(I) == S.Op->KernelIndex)
          OS << "    ^ " << printable(S.Op->KernelReason)
             << (S.Op->KernelRatio ? ", R = " + ratioText(S.Op->KernelRatio) : std::string())
             << "\n";
      }
    }
  }
  if (!Sources.empty()) {
    SourceLocator::Link L = Sources.classSource(First.Component);
    if (!L.Excerpt.empty()) {
      OS << "\n" << printable(First.Component.ClassQualname) << " (" << printable(L.Location)
         << "):\n";
      StringRef Ex(L.Excerpt);
      unsigned N = 0;
      while (!Ex.empty() && N++ < 25) {
        auto [LineText, Rest] = Ex.split('\n');
        OS << "  | " << LineText << "\n";
        Ex = Rest;
      }
    }
  }
  printSampling(OS, D, /*Verdict=*/false);
}


namespace {

/// How a mapped component was paired with its reference counterpart: by
/// what, and how its tensors are arranged to meet (--show-mapping).
std::string mappingHow(const ComponentRatio &C) {
  std::string How;
  auto Add = [&](const std::string &S) { How += (How.empty() ? "" : ", ") + S; };
  if (!C.MappedBy.empty())
    Add("by " + C.MappedBy);
  if (C.ResidualPair)
    Add("(output, residual) pair summed");
  if (C.Transposed)
    Add("dims " + std::to_string(C.Transposed->first) + "," +
        std::to_string(C.Transposed->second) + " swapped, " + C.LayoutBy);
  if (C.Part >= 0)
    Add("part " + std::to_string(C.Part + 1) + " of " + std::to_string(C.Parts.size()) +
        " along dim " + std::to_string(C.ConcatDim));
  if (C.RuleNoise && C.NoiseOwn)
    Add(formatv("noise {0}", format("%g", *C.RuleNoise)).str());
  return How;
}

json::Value componentJSON(const ComponentRatio &C) {
  json::Object O{{"component", C.Path}, {"class", C.ClassName}, {"step", C.Step}};
  O["ratio"] = ratioJSON(C.Ratio);
  return json::Value(std::move(O));
}

/// A component of the curve, with what --show-mapping says of it.
json::Value curveJSON(const ComponentRatio &C, const Diagnosis &D) {
  json::Value V = componentJSON(C);
  json::Object &O = *V.getAsObject();
  O["mapped"] = C.Mapped;
  O["reference"] = json::Array(C.ReferencePaths);
  O["mapped_by"] = C.Mapped ? json::Value(mappingHow(C)) : json::Value(nullptr);
  O["unmapped_reason"] = C.Mapped ? json::Value(nullptr) : json::Value(C.UnmappedReason);
  O["uncompared_reason"] = orNull(C.UncomparedReason);
  O["input_ratio"] = ratioJSON(C.InputRatio);
  O["calibrated_noise"] = ratioJSON(C.CalibratedNoise);
  O["rule_noise"] = ratioJSON(C.RuleNoise);
  O["input_noise_by_design"] = C.InputNoiseByDesign;
  O["threshold"] = thresholdOf(C, D);
  O["compared_values"] = C.ComparedValues ? json::Value(C.ComparedValues) : json::Value(nullptr);
  return V;
}

/// The kernel the buffer snapshots single out beneath the op, or null.
json::Value departingKernelJSON(const OpFinding &Op, const SourceLocator &Sources) {
  if (Op.Kernel.empty())
    return nullptr;
  SourceLocator::KernelSite Site = Sources.kernel(Op.Kernel);
  return json::Object{{"name", Op.Kernel},
                      {"index", Op.KernelIndex},
                      {"display_name", Site.Display},
                      {"source", orNull(Site.Where)},
                      {"ratio", ratioJSON(Op.KernelRatio)},
                      {"reason", Op.KernelReason}};
}

json::Value opJSON(const OpFinding &Op, const SourceLocator &Sources) {
  json::Array Kernels;
  for (const std::string &K : Op.Kernels) {
    SourceLocator::KernelSite Site = Sources.kernel(K);
    Kernels.push_back(
        json::Object{{"name", K}, {"display_name", Site.Display}, {"source", orNull(Site.Where)}});
  }
  return json::Object{{"op", Op.Name},
                      {"schema", Op.Schema},
                      {"source", orNull(Sources.op(Op.Name))},
                      {"ratio", ratioJSON(Op.Ratio)},
                      {"reference_op", Op.ReferenceName},
                      {"reason", Op.Reason},
                      {"kernels", std::move(Kernels)},
                      {"departing_kernel", departingKernelJSON(Op, Sources)}};
}

} // namespace

json::Value toJSON(const Diagnosis &D, const SourceLocator &Sources) {
  json::Array Suspects;
  for (const Suspect &S : D.Suspects) {
    json::Array Before, After;
    for (const ComponentRatio &C : S.Before)
      Before.push_back(componentJSON(C));
    for (const ComponentRatio &C : S.After)
      After.push_back(componentJSON(C));
    json::Array Steps;
    for (const auto &[Step, Ratio] : S.StepRatios)
      Steps.push_back(json::Object{{"step", Step}, {"ratio", ratioJSON(Ratio)}});
    Suspects.push_back(json::Object{
        {"component", S.Component.Path},
        {"class", S.Component.ClassQualname},
        {"ratio", ratioJSON(S.Component.Ratio)},
        {"input_ratio", ratioJSON(S.Component.InputRatio)},
        {"calibrated_noise", ratioJSON(S.Component.CalibratedNoise)},
        {"threshold", thresholdOf(S.Component, D)},
        {"step", S.Component.Step},
        {"source", orNull(Sources.classSource(S.Component).Location)},
        {"kernel", S.Op ? opJSON(*S.Op, Sources) : json::Value(nullptr)},
        {"reason", S.Reason},
        {"evidence", json::Object{{"before", std::move(Before)}, {"after", std::move(After)}}},
        {"step_ratios", std::move(Steps)},
        {"unmatched_reference", json::Array(S.UnmatchedReference)},
        {"relation", orNull(S.Relation)},
    });
  }
  json::Array Curve;
  for (const ComponentRatio &C : D.Curve)
    Curve.push_back(curveJSON(C, D));
  json::Object O{{"verdict", verdictName(D.Result)},
                 {"suspects", std::move(Suspects)},
                 {"threshold", D.Threshold},
                 {"noise_model", D.NoiseModel},
                 {"rescaled", json::Array(D.Rescaled)},
                 {"few_values", json::Array(D.FewValues)},
                 {"noisier_by_design", json::Array(D.NoisierByDesign)},
                 {"max_ratio", ratioJSON(D.MaxRatio)},
                 {"uncompared", int64_t(D.Uncompared)},
                 {"merged_steps", D.MergedSteps},
                 {"components", std::move(Curve)}};
  if (D.Result == Diagnosis::Verdict::InputsDiffer)
    O["inputs_difference"] = D.InputsDifference;
  json::Array Departures;
  for (const SamplingDeparture &S : D.Sampling)
    Departures.push_back(json::Object{{"step", S.Step},
                                      {"consumed", S.Consumed},
                                      {"argmax", S.Argmax},
                                      {"logits", S.Logits},
                                      {"rows", S.Rows},
                                      {"row", S.Row >= 0 ? json::Value(S.Row) : nullptr}});
  O["sampling"] = json::Object{{"checked", int64_t(D.SamplingChecked)},
                               {"departures", std::move(Departures)}};
  return json::Value(std::move(O));
}

void printMapping(raw_ostream &OS, const Diagnosis &D) {
  for (const ComponentRatio &C : D.Curve) {
    std::string Refs;
    for (const std::string &P : C.ReferencePaths)
      Refs += (Refs.empty() ? "" : ", ") + (P.empty() ? std::string("(root)") : P);
    std::string How = mappingHow(C);
    OS << (C.Mapped ? "mapped    " : "unmapped  ") << "step " << C.Step << "  "
       << printable(componentName(C))
       << printable(C.Mapped ? "  <->  " + Refs + (How.empty() ? "" : "  [" + How + "]")
                             : "  (" + C.UnmappedReason + ")")
       << printable(C.UncomparedReason.empty() ? ""
                                               : "  (not compared: " + C.UncomparedReason + ")")
       << "\n";
  }
}

std::string calibrationRefusal(const Diagnosis &D) {
  switch (D.Result) {
  case Diagnosis::Verdict::NoDivergence:
    return "";
  case Diagnosis::Verdict::InputsDiffer:
    return "its inputs differ (" + D.InputsDifference + ")";
  case Diagnosis::Verdict::Divergence:
    break;
  }
  if (D.Suspects.empty())
    return D.Sampling.empty() ? "it diverges"
                              : "its sampler departs (" + departureText(D.Sampling.front()) + ")";
  const ComponentRatio &First = D.Suspects.front().Component;
  return "it diverges at " + First.Path + " (R = " + ratioText(First.Ratio) + ")";
}

json::Value calibrationJSON(const Diagnosis &D, const CalibrationOrigin &Origin,
                            unsigned *Mappings) {
  json::Array Components;
  std::vector<CalibratedRule> Rules = calibratedRules(D);
  for (const CalibratedRule &C : Rules) {
    json::Array Refs;
    for (const std::string &R : C.Rule.Reference)
      Refs.push_back(R);
    // Many-to-one: the target's parts, in order.
    json::Value Target = C.Rule.Target;
    if (!C.Rule.Parts.empty())
      Target = json::Array(C.Rule.Parts);
    Components.push_back(json::Object{{"target", std::move(Target)},
                                      {"reference", std::move(Refs)},
                                      {"concat_dim", C.Rule.ConcatDim},
                                      {"transpose", C.Rule.Transpose
                                                        ? json::Value(json::Array{
                                                              C.Rule.Transpose->first,
                                                              C.Rule.Transpose->second})
                                                        : json::Value(nullptr)},
                                      {"noise", C.Rule.Noise ? json::Value(*C.Rule.Noise)
                                                             : json::Value(nullptr)},
                                      {"validated_calls", C.Validated},
                                      {"largest_ratio", C.LargestRatio},
                                      {"from", C.Rule.Source}});
  }
  if (Mappings)
    *Mappings = unsigned(Rules.size());
  json::Object Noise;
  for (const auto &[Path, Ratio] : calibratedNoise(D))
    Noise[Path] = Ratio;
  return json::Object{{"calibrated", json::Object{{"target", Origin.Target},
                                                  {"reference", Origin.Reference},
                                                  {"reference_fp32", Origin.ReferenceFP32},
                                                  {"threshold", D.Threshold},
                                                  {"largest_ratio", D.MaxRatio},
                                                  {"tool", "ekka-diagnose " EKKA_VERSION}}},
                      {"components", std::move(Components)},
                      {"noise", std::move(Noise)},
                      {"noise_against_fp32", !Origin.ReferenceFP32.empty()}};
}

} // namespace ekka
