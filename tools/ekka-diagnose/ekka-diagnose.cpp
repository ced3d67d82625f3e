//===- ekka-diagnose.cpp - Name the component where a silent error begins -===//
//
// Exit codes: 0 no divergence beyond noise, 1 divergence or differing inputs,
// 2 usage or input error.
//
//===----------------------------------------------------------------------===//
#include "ekka/Analysis/Diagnosis.h"
#include "ekka/Config.h"
#include "ekka/Index/CodeIndex.h"
#include "ekka/Support/CommandLine.h"
#include "ekka/Support/Error.h"
#include "ekka/Trace/TraceReader.h"

#include "llvm/Demangle/Demangle.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <malloc.h>
#include <limits>

using namespace llvm;
using namespace ekka;

namespace {

constexpr const char *Tool = "ekka-diagnose";
cl::OptionCategory Category("ekka-diagnose options");

cl::opt<std::string> TargetDir("target", cl::value_desc("TRACE"), cl::cat(Category),
                               cl::desc("Trace of the implementation under suspicion (a "
                                        "directory of rank-N/ traces for several ranks: "
                                        "stages joined, shards gathered)"));
cl::opt<std::string> ReferenceDir("reference", cl::value_desc("TRACE"), cl::cat(Category),
                                  cl::desc("Trace of the trusted implementation, same precision "
                                           "(several ranks: stages joined, shards compared "
                                           "shard for shard)"));
cl::opt<std::string> ReferenceFP32Dir(
    "reference-fp32", cl::value_desc("TRACE"), cl::cat(Category),
    cl::desc("Trace of the trusted implementation in FP32 (recommended): the accurate answer "
             "the error ratio measures against"));
cl::list<std::string> Indexes("index", cl::value_desc("INDEX"), cl::cat(Category),
                              cl::desc("Code index (ekka-index build) to name the suspects' "
                                       "source; repeatable"));
cl::opt<double> Threshold("threshold", cl::init(1.5), cl::cat(Category),
                          cl::desc("Error ratio above which a component diverges (default 1.5)"));
cl::opt<bool> Json("json", cl::cat(Category), cl::desc("Print the diagnosis as JSON"));
cl::opt<std::string> HtmlFile("html", cl::value_desc("FILE"), cl::cat(Category),
                              cl::desc("Also write a self-contained HTML report"));
cl::opt<std::string> MappingFile(
    "mapping", cl::value_desc("FILE"), cl::cat(Category),
    cl::desc("A JSON file mapping target components onto reference ones (renamed, fused: "
             "qkv_proj onto q_proj,k_proj,v_proj; many-to-one; a reference's ':input'); see "
             "docs/Diagnose.md. Without one, names the recipes and paths leave open are paired "
             "by tensor evidence and structure"));
cl::opt<bool> NoRecipes(
    "no-recipes", cl::cat(Category),
    cl::desc("Do not use the built-in recipes that map serving engines' naming (vLLM, SGLang: "
             "qkv_proj, gate_up_proj, logits_processor, the attention backend) onto "
             "HuggingFace's"));
cl::opt<std::string> CalibrateFile(
    "calibrate", cl::value_desc("FILE"), cl::cat(Category),
    cl::desc("On a known-good pair: save the mappings this run validated (ratio below the "
             "threshold) as a knowledge base, a mapping file that later runs reuse with "
             "--mapping FILE. A pair that diverges is refused (exit code 2)"));
cl::opt<bool> ShowMapping("show-mapping", cl::cat(Category),
                          cl::desc("Print how target components map to reference components "
                                   "(by path, rule, tensor evidence or structure), and why "
                                   "the unmapped ones are not"));

/// A trace's ranks, first to last.
std::vector<std::unique_ptr<TraceReader>> openRanks(StringRef Flag, StringRef Dir) {
  auto Ranks = TraceReader::openRanks(Dir);
  if (!Ranks)
    exitWithError(Tool, makeError("--" + Flag + ": " + toString(Ranks.takeError())));
  return std::move(*Ranks);
}

/// Says how a trace's ranks are read, on stderr.
void noteRanks(StringRef Flag, ArrayRef<TraceReader *> Ranks, bool Reference) {
  RankLayout Layout = unwrapOrExit(Tool, rankLayout(Ranks));
  if (Layout == RankLayout::Single)
    return;
  auto Stages = unwrapOrExit(Tool, rankStages(Ranks));
  errs() << Tool << ": note: --" << Flag << " has " << Ranks.size() << " ranks: ";
  if (Layout == RankLayout::Stages)
    errs() << "pipeline stages, joined into one call sequence\n";
  else if (Reference)
    errs() << Stages.size() << " stage(s) of " << Stages.front().size()
           << " tensor-parallel ranks: the first ranks compared, shard for shard with the "
              "target's\n";
  else if (Layout == RankLayout::SameModules)
    errs() << "tensor-parallel, compared through rank 0, sharded tensors gathered from all "
              "ranks\n";
  else
    errs() << Stages.size() << " pipeline stages of " << Stages.front().size()
           << " tensor-parallel ranks each; stages joined, sharded tensors gathered\n";
}

/// A ratio as JSON: infinity (a NaN or Inf where the reference has none)
/// is not a JSON number; the largest double stands for it.
json::Value ratioJSON(const std::optional<double> &R) {
  if (!R)
    return nullptr;
  return std::isfinite(*R) ? *R : std::numeric_limits<double>::max();
}

std::string ratioText(const std::optional<double> &R) {
  return R ? formatv("{0}", format("%.3g", *R)).str() : std::string("-");
}

struct SourceLink {
  std::string Location, Excerpt;
};

/// The suspect's class definition from the code indexes, else the trace's
/// file:line.
SourceLink sourceOf(const ComponentRatio &C, std::vector<std::unique_ptr<CodeIndex>> &Idx) {
  for (auto &I : Idx) {
    auto Defs = I->classDefinitions(C.ClassQualname);
    if (!Defs) {
      consumeError(Defs.takeError());
      continue;
    }
    if (!Defs->empty()) {
      const IndexedDefinition &D = Defs->front();
      return {D.File + ":" + std::to_string(D.Def.LineStart), D.Source};
    }
  }
  if (C.SourceFile.empty())
    return {};
  return {C.SourceFile + ":" + std::to_string(C.SourceLine), ""};
}

/// A kernel as a reader knows it: its source from the code indexes
/// (find_kernel), and its name as the index or the demangler spells it (a
/// CUPTI name is mangled, with nvcc's per-file name for an anonymous
/// namespace).
struct KernelSite {
  std::string Where;   ///< file:line, or empty
  std::string Display; ///< a readable name
};
KernelSite kernelSite(StringRef Kernel, std::vector<std::unique_ptr<CodeIndex>> &Idx) {
  for (auto &I : Idx) {
    auto Defs = I->findKernel(Kernel);
    if (!Defs) {
      consumeError(Defs.takeError());
      continue;
    }
    if (!Defs->empty())
      return {Defs->front().File + ":" + std::to_string(Defs->front().Def.LineStart),
              Defs->front().Def.QualifiedName};
  }
  return {"", llvm::demangle(Kernel.str())};
}

/// Where a custom op is implemented, from the code indexes (find_op): the
/// implementing function if known, else its registration.
std::string opSource(StringRef Op, std::vector<std::unique_ptr<CodeIndex>> &Idx) {
  for (auto &I : Idx) {
    auto Defs = I->findOp(Op);
    if (!Defs) {
      consumeError(Defs.takeError());
      continue;
    }
    const IndexedDefinition *Best = nullptr;
    for (const IndexedDefinition &D : *Defs)
      if (!Best || (!D.Relation.empty() && Best->Relation.empty()))
        Best = &D;
    if (Best)
      return Best->File + ":" + std::to_string(Best->Def.LineStart) +
             (Best->Relation.empty() ? " (registration)" : " (" + Best->Def.Name + ")");
  }
  return "";
}

std::string componentName(const ComponentRatio &C) {
  return C.Path.empty() ? "(root " + C.ClassName + ")" : C.Path;
}

void printText(const Diagnosis &D, std::vector<std::unique_ptr<CodeIndex>> &Idx) {
  raw_ostream &OS = outs();
  switch (D.Result) {
  case Diagnosis::Verdict::InputsDiffer:
    OS << "inputs-differ: the two programs were not fed the same inputs: " << D.InputsDifference
       << "\n";
    return;
  case Diagnosis::Verdict::NoDivergence:
    OS << "no-divergence: no component departs beyond numerical noise (largest R = "
       << format("%.3g", D.MaxRatio) << ", threshold " << format("%g", D.Threshold) << ")\n";
    OS << "  noise model: " << D.NoiseModel << "\n";
    return;
  case Diagnosis::Verdict::Divergence:
    break;
  }
  const Suspect &First = D.Suspects.front();
  OS << "divergence: " << componentName(First.Component) << " (" << First.Component.ClassName
     << ") "
     << (D.MergedSteps > 1 ? "over steps 1-" + std::to_string(D.MergedSteps)
                           : "at step " + std::to_string(First.Component.Step))
     << ", R = " << ratioText(First.Component.Ratio)
     << (First.Op && !First.Op->ReadBy.empty() && First.Component.Ratio &&
                 *First.Component.Ratio <= D.Threshold
             ? " (its output), R = " + ratioText(First.Op->Ratio) + " what it wrote in place"
         : First.Component.Ratio && *First.Component.Ratio <= D.Threshold
             ? std::string(" (within noise itself: see the first suspect's reason)")
             : std::string())
     << "\n";
  OS << "  noise model: " << D.NoiseModel << "\n";
  unsigned Rank = 0;
  for (const Suspect &S : D.Suspects) {
    OS << "\nsuspect " << ++Rank << ": " << componentName(S.Component) << "  "
       << S.Component.ClassQualname << "\n";
    OS << "  " << S.Reason << "\n";
    OS << "  evidence (R of the calls around it, in execution order):\n";
    auto Line = [&](const ComponentRatio &C, bool Mark) {
      OS << (Mark ? "  > " : "    ") << format("%-12s", ratioText(C.Ratio).c_str()) << " "
         << componentName(C) << "\n";
    };
    for (const ComponentRatio &C : S.Before)
      Line(C, false);
    Line(S.Component, true);
    for (const ComponentRatio &C : S.After)
      Line(C, false);
    SourceLink L = sourceOf(S.Component, Idx);
    if (!L.Location.empty())
      OS << "  source: " << L.Location << "\n";
    if (S.Op) {
      OS << "  op: " << S.Op->Name;
      if (S.Op->Ratio)
        OS << ", R = " << ratioText(S.Op->Ratio);
      OS << " (" << S.Op->Reason << ")\n";
      if (std::string Where = opSource(S.Op->Name, Idx); !Where.empty())
        OS << "  op source: " << Where << "\n";
      for (const std::string &K : S.Op->Kernels) {
        KernelSite Site = kernelSite(K, Idx);
        OS << "  kernel: " << Site.Display;
        if (!Site.Where.empty())
          OS << "  " << Site.Where;
        OS << "\n";
      }
    }
  }
  if (!Idx.empty()) {
    SourceLink L = sourceOf(First.Component, Idx);
    if (!L.Excerpt.empty()) {
      OS << "\n" << First.Component.ClassQualname << " (" << L.Location << "):\n";
      StringRef Ex(L.Excerpt);
      unsigned N = 0;
      while (!Ex.empty() && N++ < 25) {
        auto [LineText, Rest] = Ex.split('\n');
        OS << "  | " << LineText << "\n";
        Ex = Rest;
      }
    }
  }
}

json::Value componentJSON(const ComponentRatio &C) {
  json::Object O{{"component", C.Path}, {"class", C.ClassName}, {"step", C.Step}};
  O["ratio"] = ratioJSON(C.Ratio);
  return json::Value(std::move(O));
}

json::Value opJSON(const OpFinding &Op, std::vector<std::unique_ptr<CodeIndex>> &Idx) {
  json::Array Kernels;
  for (const std::string &K : Op.Kernels) {
    KernelSite Site = kernelSite(K, Idx);
    Kernels.push_back(json::Object{
        {"name", K},
        {"display_name", Site.Display},
        {"source", Site.Where.empty() ? json::Value(nullptr) : json::Value(Site.Where)}});
  }
  std::string OpWhere = opSource(Op.Name, Idx);
  return json::Object{{"op", Op.Name},
                      {"schema", Op.Schema},
                      {"source", OpWhere.empty() ? json::Value(nullptr) : json::Value(OpWhere)},
                      {"ratio", ratioJSON(Op.Ratio)},
                      {"reference_op", Op.ReferenceName},
                      {"reason", Op.Reason},
                      {"kernels", std::move(Kernels)}};
}

json::Value toJSON(const Diagnosis &D, std::vector<std::unique_ptr<CodeIndex>> &Idx) {
  json::Array Suspects;
  for (const Suspect &S : D.Suspects) {
    SourceLink L = sourceOf(S.Component, Idx);
    json::Array Before, After;
    for (const ComponentRatio &C : S.Before)
      Before.push_back(componentJSON(C));
    for (const ComponentRatio &C : S.After)
      After.push_back(componentJSON(C));
    Suspects.push_back(json::Object{
        {"component", S.Component.Path},
        {"class", S.Component.ClassQualname},
        {"ratio", ratioJSON(S.Component.Ratio)},
        {"input_ratio", ratioJSON(S.Component.InputRatio)},
        {"step", S.Component.Step},
        {"source", L.Location.empty() ? json::Value(nullptr) : json::Value(L.Location)},
        {"kernel", S.Op ? opJSON(*S.Op, Idx) : json::Value(nullptr)},
        {"reason", S.Reason},
        {"evidence", json::Object{{"before", std::move(Before)}, {"after", std::move(After)}}},
    });
  }
  json::Array Curve;
  for (const ComponentRatio &C : D.Curve)
    Curve.push_back(componentJSON(C));
  json::Object O{{"verdict", verdictName(D.Result)},
                 {"suspects", std::move(Suspects)},
                 {"threshold", D.Threshold},
                 {"noise_model", D.NoiseModel},
                 {"max_ratio", ratioJSON(D.MaxRatio)},
                 {"uncompared", int64_t(D.Uncompared)},
                 {"merged_steps", D.MergedSteps},
                 {"components", std::move(Curve)}};
  if (D.Result == Diagnosis::Verdict::InputsDiffer)
    O["inputs_difference"] = D.InputsDifference;
  return json::Value(std::move(O));
}

std::string htmlEscape(StringRef S) {
  std::string Out;
  for (char C : S) {
    switch (C) {
    case '<': Out += "&lt;"; break;
    case '>': Out += "&gt;"; break;
    case '&': Out += "&amp;"; break;
    case '"': Out += "&quot;"; break;
    default: Out += C;
    }
  }
  return Out;
}

/// One self-contained page: the error ratio along the call sequence (log
/// scale SVG), the suspects with their evidence and source.
void writeHtml(StringRef Path, const Diagnosis &D, std::vector<std::unique_ptr<CodeIndex>> &Idx) {
  std::error_code EC;
  raw_fd_ostream OS(Path, EC);
  if (EC)
    exitWithError(Tool, makeError("cannot write '" + Path + "': " + EC.message()));
  OS << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Ekka diagnosis</title>"
        "<style>body{font-family:sans-serif;margin:2em}pre{background:#f4f4f4;padding:1em}"
        ".suspect{color:#b00}</style></head><body>\n";
  OS << "<h1>" << htmlEscape(verdictName(D.Result)) << "</h1>\n";
  if (!D.Suspects.empty())
    OS << "<p class=\"suspect\">First suspect: <b>" << htmlEscape(componentName(D.Suspects[0].Component))
       << "</b> (" << htmlEscape(D.Suspects[0].Component.ClassQualname) << ")</p>\n";
  if (!D.InputsDifference.empty())
    OS << "<p>" << htmlEscape(D.InputsDifference) << "</p>\n";
  // The curve: log10(R) over the call sequence, threshold dashed.
  const double W = 900, H = 260, Pad = 30;
  auto Y = [&](double R) {
    double L = std::log10(std::max(R, 1e-3));
    double T = std::max(0.0, std::min(1.0, (L + 3) / 12));
    return H - Pad - T * (H - 2 * Pad);
  };
  OS << "<svg id=\"error-ratio\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W
     << "\" height=\"" << H << "\"><title>error ratio along the call sequence</title>\n";
  OS << "<line x1=\"" << Pad << "\" x2=\"" << W - Pad << "\" y1=\"" << Y(D.Threshold)
     << "\" y2=\"" << Y(D.Threshold) << "\" stroke=\"#888\" stroke-dasharray=\"4\"/>\n";
  size_t N = D.Curve.size();
  std::string Points;
  for (size_t I = 0; I < N; ++I) {
    if (!D.Curve[I].Ratio)
      continue;
    double X = Pad + (N > 1 ? double(I) / double(N - 1) : 0) * (W - 2 * Pad);
    Points += formatv("{0:f1},{1:f1} ", X, Y(*D.Curve[I].Ratio)).str();
    OS << "<circle cx=\"" << formatv("{0:f1}", X) << "\" cy=\""
       << formatv("{0:f1}", Y(*D.Curve[I].Ratio)) << "\" r=\"2\"><title>"
       << htmlEscape(componentName(D.Curve[I])) << " R=" << ratioText(D.Curve[I].Ratio)
       << "</title></circle>\n";
  }
  OS << "<polyline fill=\"none\" stroke=\"#06c\" points=\"" << Points << "\"/>\n</svg>\n";
  OS << "<p>" << htmlEscape(D.NoiseModel) << "; threshold " << format("%g", D.Threshold) << "</p>\n";
  unsigned Rank = 0;
  for (const Suspect &S : D.Suspects) {
    OS << "<h2>Suspect " << ++Rank << ": " << htmlEscape(componentName(S.Component)) << "</h2>\n<p>"
       << htmlEscape(S.Reason) << "</p>\n<table>";
    for (const ComponentRatio &C : S.Before)
      OS << "<tr><td>" << ratioText(C.Ratio) << "</td><td>" << htmlEscape(componentName(C)) << "</td></tr>";
    OS << "<tr class=\"suspect\"><td>" << ratioText(S.Component.Ratio) << "</td><td><b>"
       << htmlEscape(componentName(S.Component)) << "</b></td></tr>";
    for (const ComponentRatio &C : S.After)
      OS << "<tr><td>" << ratioText(C.Ratio) << "</td><td>" << htmlEscape(componentName(C)) << "</td></tr>";
    OS << "</table>\n";
    SourceLink L = sourceOf(S.Component, Idx);
    if (!L.Location.empty())
      OS << "<p>" << htmlEscape(L.Location) << "</p>\n";
    if (!L.Excerpt.empty())
      OS << "<pre>" << htmlEscape(L.Excerpt) << "</pre>\n";
  }
  OS << "</body></html>\n";
}

} // namespace

/// --calibrate: the validated mappings of a known-good pair, as a mapping
/// file with what they were validated on.
void writeCalibration(const Diagnosis &D) {
  if (D.Result != Diagnosis::Verdict::NoDivergence) {
    std::string Why = D.Result == Diagnosis::Verdict::InputsDiffer
                          ? "its inputs differ (" + D.InputsDifference + ")"
                          : "it diverges at " + D.Suspects.front().Component.Path + " (R = " +
                                ratioText(D.Suspects.front().Component.Ratio) + ")";
    exitWithError(Tool, makeError("--calibrate needs a known-good pair, and " + Why +
                                  "; nothing written"));
  }
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
                                      {"validated_calls", C.Validated},
                                      {"largest_ratio", C.LargestRatio},
                                      {"from", C.Rule.Source}});
  }
  json::Object Out{{"calibrated", json::Object{{"target", TargetDir.getValue()},
                                               {"reference", ReferenceDir.getValue()},
                                               {"reference_fp32", ReferenceFP32Dir.getValue()},
                                               {"threshold", D.Threshold},
                                               {"largest_ratio", D.MaxRatio},
                                               {"tool", "ekka-diagnose " EKKA_VERSION}}},
                   {"components", std::move(Components)}};
  std::error_code EC;
  raw_fd_ostream OS(CalibrateFile, EC);
  if (EC)
    exitWithError(Tool, makeError("cannot write '" + CalibrateFile + "': " + EC.message()));
  OS << formatv("{0:2}", json::Value(std::move(Out))) << "\n";
  OS.close();
  if (OS.has_error())
    exitWithError(Tool, makeError("cannot write '" + CalibrateFile + "'"));
  outs() << "calibrated: " << Rules.size() << " mapping" << (Rules.size() == 1 ? "" : "s")
         << " validated (largest R = " << ratioText(D.MaxRatio) << ", threshold "
         << ratioText(D.Threshold) << ") written to " << CalibrateFile
         << "; reuse it with --mapping " << CalibrateFile << "\n";
}

int main(int argc, char **argv) {
  // Tensors are widened to doubles one pair after another, in buffers of
  // the same few sizes: keep freed ones in the heap for the next, rather than
  // mapping fresh pages (and faulting on each) for every tensor.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  cl::HideUnrelatedOptions({&Category});
  cl::SetVersionPrinter([](raw_ostream &OS) { OS << "ekka-diagnose " EKKA_VERSION "\n"; });
  parseCommandLineOrExit(
          argc, argv,
          "Ekka's diagnosis: name the component where a silent error begins.\n\n"
          "Compares a target trace with a reference trace of the same precision (and,\n"
          "recommended, one in FP32), module call by module call, with the paper's error\n"
          "ratio R = |X_T - Y_R| / |X_R - Y_R|, and names the earliest component whose\n"
          "output departs beyond noise while its own inputs do not.\n\n"
          "  ekka-diagnose --target tgt.trace --reference ref.trace --reference-fp32 ref32.trace\n"
          "                --index repo.idx --html report.html\n\n"
          "Exit code: 0 no divergence beyond noise, 1 divergence or differing inputs,\n"
          "2 usage or input error.\n");
  if (TargetDir.empty() || ReferenceDir.empty())
    exitWithError(Tool, makeError("needs --target TRACE and --reference TRACE (see --help)"));
  if (!(Threshold > 0) || !std::isfinite(Threshold))
    exitWithError(Tool, makeError("--threshold must be a positive number"));
  if (!HtmlFile.empty()) {
    // Refuse an unwritable report before printing a diagnosis.
    std::error_code EC;
    raw_fd_ostream Probe(HtmlFile, EC);
    if (EC)
      exitWithError(Tool, makeError("cannot write '" + HtmlFile + "': " + EC.message()));
  }
  auto TargetRanks = openRanks("target", TargetDir);
  std::vector<TraceReader *> Target;
  for (auto &R : TargetRanks)
    Target.push_back(R.get());
  // Pipeline stages are joined; ranks that ran the same modules (tensor
  // parallelism) are compared through rank 0, the others lending their
  // shards of sharded tensors.
  noteRanks("target", Target, false);
  auto ReferenceRanks = openRanks("reference", ReferenceDir);
  std::vector<TraceReader *> Reference, FP32;
  for (auto &R : ReferenceRanks)
    Reference.push_back(R.get());
  noteRanks("reference", Reference, true);
  std::vector<std::unique_ptr<TraceReader>> FP32Ranks;
  if (!ReferenceFP32Dir.empty()) {
    FP32Ranks = openRanks("reference-fp32", ReferenceFP32Dir);
    for (auto &R : FP32Ranks)
      FP32.push_back(R.get());
    noteRanks("reference-fp32", FP32, true);
  }
  std::vector<std::unique_ptr<CodeIndex>> Idx;
  for (const std::string &I : Indexes)
    Idx.push_back(unwrapOrExit(Tool, CodeIndex::openForReading(I)));

  DiagnoseOptions Options;
  Options.Threshold = Threshold;
  if (!MappingFile.empty())
    Options.Mapping = unwrapOrExit(Tool, readMappingFile(MappingFile));
  Options.UseRecipes = !NoRecipes;
  Diagnosis D = unwrapOrExit(Tool, diagnose(Target, Reference, FP32, Options));

  if (!CalibrateFile.empty()) {
    writeCalibration(D);
    return 0;
  }

  if (ShowMapping) {
    for (const ComponentRatio &C : D.Curve) {
      std::string Refs;
      for (const std::string &P : C.ReferencePaths)
        Refs += (Refs.empty() ? "" : ", ") + (P.empty() ? std::string("(root)") : P);
      std::string How;
      if (!C.MappedBy.empty())
        How += "by " + C.MappedBy;
      if (C.ResidualPair)
        How += std::string(How.empty() ? "" : ", ") + "(output, residual) pair summed";
      if (C.Part >= 0)
        How += std::string(How.empty() ? "" : ", ") + "part " + std::to_string(C.Part + 1) +
               " of " + std::to_string(C.Parts.size()) + " along dim " +
               std::to_string(C.ConcatDim);
      outs() << (C.Mapped ? "mapped    " : "unmapped  ") << "step " << C.Step << "  "
             << componentName(C)
             << (C.Mapped ? "  <->  " + Refs + (How.empty() ? "" : "  [" + How + "]")
                          : "  (" + C.UnmappedReason + ")")
             << "\n";
    }
  }
  if (Json)
    outs() << formatv("{0:2}", toJSON(D, Idx)) << "\n";
  else
    printText(D, Idx);
  if (D.Uncompared && D.Result != Diagnosis::Verdict::InputsDiffer)
    errs() << Tool << ": warning: " << D.Uncompared << " of " << D.Curve.size()
           << " target module calls could not be compared (unmapped, not captured, or in "
              "steps the reference did not run); --show-mapping lists them\n";
  if (!HtmlFile.empty())
    writeHtml(HtmlFile, D, Idx);
  return D.Result == Diagnosis::Verdict::NoDivergence ? ExitSuccess : ExitFinding;
}
