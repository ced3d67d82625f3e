//===- ekka-diagnose.cpp - Name the component where a silent error begins -===//
//
// Exit codes: 0 no divergence beyond noise, 1 divergence or differing inputs,
// 2 usage or input error.
//
//===----------------------------------------------------------------------===//
#include "ReferenceRun.h"

#include "ekka/Analysis/Diagnosis.h"
#include "ekka/Report/Report.h"
#include "ekka/Config.h"
#include "ekka/Index/CodeIndex.h"
#include "ekka/Support/CommandLine.h"
#include "ekka/Support/Error.h"
#include "ekka/Support/Plural.h"
#include "ekka/Support/Printable.h"
#include "ekka/Trace/Timeline.h"
#include "ekka/Trace/TraceReader.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <malloc.h>
#include <limits>
#include <set>

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
cl::opt<std::string> ReferenceModel(
    "reference-model", cl::value_desc("DIR"), cl::cat(Category),
    cl::desc("Instead of --reference and --reference-fp32: the HuggingFace model directory the "
             "target served. Ekka runs HuggingFace Transformers on it itself, teacher-forced on "
             "exactly the token ids each request of the target consumed (from its trace), once "
             "in the target's dtype and once in FP32, each traced by ekka-trace"));
cl::opt<std::string> ReferenceOut(
    "reference-out", cl::value_desc("DIR"), cl::cat(Category),
    cl::desc("Where --reference-model keeps its two traces and the requests it ran (default: "
             "the target's directory name + '.reference'); reused while the requests and the "
             "model are the same"));
cl::opt<std::string> ReferencePython(
    "reference-python", cl::value_desc("PYTHON"), cl::cat(Category),
    cl::init(EKKA_REFERENCE_PYTHON),
    cl::desc("The Python interpreter --reference-model runs HuggingFace Transformers with "
             "(default: the one Ekka was built with, " EKKA_REFERENCE_PYTHON ")"));
cl::list<std::string> Indexes("index", cl::value_desc("INDEX"), cl::cat(Category),
                              cl::desc("Code index (ekka-index build) to name the suspects' "
                                       "source; repeatable"));
// The defaults are DiagnoseOptions'; the help text says them from there.
const DiagnoseOptions Defaults;
const std::string ThresholdDesc =
    formatv("Error ratio above which a component diverges (default {0})",
            format("%g", Defaults.Threshold));
cl::opt<double> Threshold("threshold", cl::init(Defaults.Threshold), cl::cat(Category),
                          cl::desc(ThresholdDesc));
cl::opt<bool> Json("json", cl::cat(Category), cl::desc("Print the diagnosis as JSON"));
cl::opt<bool> Greedy(
    "greedy", cl::cat(Category),
    cl::desc("The target decoded greedily: a decode step whose token is not the argmax of the "
             "target's logits before it is a divergence (of the sampler, which no module shows), "
             "not only a note"));
cl::opt<std::string> HtmlFile("html", cl::value_desc("FILE"), cl::cat(Category),
                              cl::desc("Also write a self-contained HTML report"));
cl::opt<std::string> PerfettoFile(
    "perfetto", cl::value_desc("FILE"), cl::cat(Category),
    cl::desc("Also write the target's timeline as Chrome trace-event JSON (Perfetto, "
             "chrome://tracing), the suspects and the first divergent op marked on it; the "
             "target must be a trace of format 1.8 or newer"));
cl::opt<std::string> MappingFile(
    "mapping", cl::value_desc("FILE"), cl::cat(Category),
    cl::desc("A JSON file mapping target components onto reference ones (renamed, fused: "
             "qkv_proj onto q_proj,k_proj,v_proj; many-to-one; a reference's ':input'; a "
             "\"transpose\" for a layout the shapes leave open); see docs/Diagnose.md. Without "
             "one, names the recipes and paths leave open are paired by tensor evidence and "
             "structure"));
cl::opt<bool> NoRecipes(
    "no-recipes", cl::cat(Category),
    cl::desc("Do not use the built-in recipes that map serving engines' naming (vLLM, SGLang: "
             "qkv_proj, gate_up_proj, logits_processor, the attention backend) onto "
             "HuggingFace's"));
const std::string CalibrateDesc = formatv(
    "On a known-good pair: save the mappings this run validated (ratio below the threshold) "
    "and each component's noise (its largest R) as a knowledge base, a mapping file that later "
    "runs reuse with --mapping FILE; there a component departs above {0} times its own noise "
    "(at least {1}) instead of the threshold. A pair that diverges is refused (exit code 2)",
    format("%g", Defaults.CalibratedMargin), format("%g", Defaults.CalibratedFloor));
cl::opt<std::string> CalibrateFile("calibrate", cl::value_desc("FILE"), cl::cat(Category),
                                   cl::desc(CalibrateDesc));
cl::opt<bool> ShowMapping("show-mapping", cl::cat(Category),
                          cl::desc("Print how target components map to reference components "
                                   "(by path, rule, tensor evidence or structure), and why "
                                   "the unmapped ones are not); with --json, each "
                                   "component's mapped, reference, mapped_by and "
                                   "unmapped_reason keys, which it always has, say it"));

/// A trace's ranks, first to last.
std::vector<std::unique_ptr<TraceReader>> openRanks(StringRef Flag, StringRef Dir) {
  auto Ranks = TraceReader::openRanks(Dir);
  if (!Ranks)
    exitWithError(Tool, makeError("--" + Flag + ": " + toString(Ranks.takeError())));
  // A rank that ran no module left no trace: what needs every rank (the
  // shards of tensor-parallel tensors) is then incomplete.
  const auto &Meta = (*Ranks)[0]->meta();
  int64_t World = 0;
  if (auto It = Meta.find("world_size");
      It != Meta.end() && !StringRef(It->second).getAsInteger(10, World) &&
      World > int64_t(Ranks->size())) {
    // Which: one that began under Ekka left its start marker (it ran no
    // module, or was killed before its first); one without is missing (its
    // trace lost, or it did not run under Ekka) — and a pipeline stage's
    // modules are then not compared. Traces before format 1.7 leave no
    // marker.
    std::set<int64_t> Present;
    for (const auto &R : *Ranks)
      if (auto Rank = R->meta().find("rank"); Rank != R->meta().end())
        Present.insert(std::strtoll(Rank->second.c_str(), nullptr, 10));
    std::vector<unsigned> Started = TraceReader::startedRanks(Dir);
    auto List = [&](bool Idle) {
      std::string Text;
      unsigned Named = 0, All = 0;
      for (int64_t Rank = 0; Rank < World; ++Rank)
        if (!Present.count(Rank) && llvm::is_contained(Started, unsigned(Rank)) == Idle &&
            All++ < 8)
          Text += (Named++ ? ", " : "") + std::to_string(Rank);
      return std::make_pair(Text + (All > Named ? ", ..." : ""), All);
    };
    auto [Idle, IdleCount] = List(true);
    auto [Missing, MissingCount] = List(false);
    bool Marks = (*Ranks)[0]->formatAtLeast(1, 7);
    errs() << Tool << ": warning: --" << Flag << " holds " << Ranks->size() << " of its "
           << World << " ranks' traces";
    if (IdleCount)
      errs() << "; rank" << (IdleCount > 1 ? "s " : " ") << Idle
             << " began but traced no module (ran none, or was killed before its first)";
    if (MissingCount)
      errs() << "; none from rank" << (MissingCount > 1 ? "s " : " ") << Missing
             << (Marks ? ", which left nothing (its trace lost, or it did not run under ekka-trace)"
                       : " (a rank that ran no module leaves none)");
    errs() << ": only the ranks present are compared, sharded tensors from their shards\n";
  }
  // What a trace says it lacks: what is missing is not compared, which the
  // verdict alone would not tell.
  for (const auto &R : *Ranks) {
    auto Lost = R->meta().find(LostRecordsKey.str());
    if (Lost == R->meta().end())
      errs() << Tool << ": warning: --" << Flag << ": '" << R->directory()
             << "' was not closed (its program was killed, crashed or ended with _exit): "
                "what it recorded after its last written batch is missing\n";
    else if (Lost->second != "0")
      errs() << Tool << ": warning: --" << Flag << ": '" << R->directory()
             << "' lacks records: " << printable(Lost->second) << "\n";
  }
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

/// --calibrate: the validated mappings of a known-good pair, as a mapping
/// file with what they were validated on.
void writeCalibration(const Diagnosis &D) {
  if (std::string Why = calibrationRefusal(D); !Why.empty())
    exitWithError(Tool, makeError("--calibrate needs a known-good pair, and " + Why +
                                  "; nothing written"));
  unsigned Mappings = 0;
  json::Value Out = calibrationJSON(
      D, {TargetDir.getValue(), ReferenceDir.getValue(), ReferenceFP32Dir.getValue()}, &Mappings);
  std::error_code EC;
  raw_fd_ostream OS(CalibrateFile, EC);
  if (EC)
    exitWithError(Tool, makeError("cannot write '" + CalibrateFile + "': " + EC.message()));
  OS << formatv("{0:2}", Out) << "\n";
  OS.close();
  if (OS.has_error())
    exitWithError(Tool, makeError("cannot write '" + CalibrateFile + "'"));
  outs() << "calibrated: " << countOf(Mappings, "mapping") << " validated, the noise of "
         << countOf(calibratedNoise(D).size(), "component") << " (largest R = " << ratioText(D.MaxRatio) << ", threshold "
         << ratioText(D.Threshold) << ") written to " << CalibrateFile
         << "; reuse it with --mapping " << CalibrateFile << "\n";
}

} // namespace

/// --perfetto: the target's timeline with the suspects and the first
/// divergent op marked, each on the rank that ran it: a target of several
/// pipeline stages is diagnosed through one call sequence whose ids carry
/// their stage (PipelineStageShift), each stage's calls its first rank's.
static void writeMarkedTimeline(const Diagnosis &D, ArrayRef<TraceReader *> Target) {
  auto Stages = unwrapOrExit(Tool, rankStages(Target));
  constexpr int StageShift = PipelineStageShift;
  auto Place = [&](int64_t Id) -> std::pair<size_t, int64_t> {
    if (Stages.size() < 2)
      return {Stages.front().front(), Id};
    size_t Stage = size_t(Id >> StageShift);
    size_t Rank = Stage < Stages.size() ? Stages[Stage].front() : Target.size();
    return {Rank, Id & ((int64_t(1) << StageShift) - 1)};
  };
  TimelineMarks Marks;
  unsigned Rank = 0;
  bool OpMarked = false;
  for (const Suspect &S : D.Suspects) {
    ++Rank;
    Marks.Calls[Place(S.Component.CallId)] = "suspect " + std::to_string(Rank) + ": " +
                                             componentName(S.Component) + ", R = " +
                                             ratioText(S.Component.Ratio);
    if (S.Op && S.Op->OpSeq >= 0 && !OpMarked) {
      OpMarked = true;
      Marks.Ops[Place(S.Op->OpSeq)] =
          "first divergent op: " + S.Op->Name +
          (S.Op->Ratio ? ", R = " + ratioText(S.Op->Ratio) : std::string()) + " (in suspect " +
          std::to_string(Rank) + ")";
    }
  }
  unwrapOrExit(Tool, writeTimelineFile(PerfettoFile, Target, Marks));
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
          "  ekka-diagnose --target tgt.trace --reference ref.trace \\\n"
          "                --reference-fp32 ref32.trace --index repo.idx --html report.html\n\n"
          "With the HuggingFace model directory a serving engine (vLLM) served, Ekka runs\n"
          "the reference itself on the tokens the target's trace shows:\n\n"
          "  ekka-trace -o vllm.trace --framework vllm -- python serve.py\n"
          "  ekka-diagnose --target vllm.trace --reference-model MODEL_DIR\n\n"
          "Exit code: 0 no divergence beyond noise, 1 divergence or differing inputs,\n"
          "2 usage or input error.\n");
  if (!ReferenceModel.empty() && (!ReferenceDir.empty() || !ReferenceFP32Dir.empty()))
    exitWithError(Tool, makeError("--reference-model runs the reference itself: drop "
                                  "--reference and --reference-fp32, or --reference-model"));
  if (TargetDir.empty() || (ReferenceDir.empty() && ReferenceModel.empty()))
    exitWithError(Tool, makeError("needs --target TRACE and --reference TRACE, or --target "
                                  "TRACE and --reference-model DIR (see --help)"));
  // A calibration writes a mapping file, not a report.
  if (!CalibrateFile.empty() && (Json || !HtmlFile.empty() || !PerfettoFile.empty()))
    exitWithError(Tool, makeError(std::string("--calibrate writes a mapping file and no "
                                              "report: drop ") +
                                  (Json ? "--json" : !HtmlFile.empty() ? "--html" : "--perfetto") +
                                  " (or run it again without --calibrate)"));
  if (!(Threshold > 0) || !std::isfinite(Threshold))
    exitWithError(Tool, makeError("--threshold must be a positive number"));
  if (PerfettoFile == "-")
    exitWithError(Tool, makeError("--perfetto needs a file: the report is on standard output"));
  // Refuse an unwritable report before printing a diagnosis, without
  // emptying one that is there (the run may yet fail on its input).
  for (const std::string &File : {HtmlFile.getValue(), PerfettoFile.getValue()}) {
    if (File.empty())
      continue;
    std::error_code EC;
    bool Existed = sys::fs::exists(File);
    {
      raw_fd_ostream Probe(File, EC, sys::fs::OF_Append);
    }
    if (EC)
      exitWithError(Tool, makeError("cannot write '" + File + "': " + EC.message()));
    if (!Existed)
      sys::fs::remove(File);
  }
  auto TargetRanks = openRanks("target", TargetDir);
  std::vector<TraceReader *> Target;
  for (auto &R : TargetRanks)
    Target.push_back(R.get());
  if (!PerfettoFile.empty())
    for (TraceReader *R : Target)
      if (!R->formatAtLeast(1, 8))
        exitWithError(Tool, makeError("--perfetto: the target '" + R->directory() +
                                      "' records no times (a trace before format 1.8): "
                                      "trace it again, or drop --perfetto"));
  // Pipeline stages are joined; ranks that ran the same modules (tensor
  // parallelism) are compared through rank 0, the others lending their
  // shards of sharded tensors.
  noteRanks("target", Target, false);
  if (!ReferenceModel.empty()) {
    ReferenceRunOptions RO;
    RO.ModelDir = ReferenceModel;
    RO.OutDir = ReferenceOut.empty()
                    ? (sys::path::remove_leading_dotslash(
                           StringRef(TargetDir.getValue()).rtrim('/')) + ".reference").str()
                    : ReferenceOut.getValue();
    RO.Python = ReferencePython;
    RO.Argv0 = argv[0];
    ReferenceTraces Traces = unwrapOrExit(Tool, runReference(Target, RO));
    ReferenceDir = Traces.LowPrecision;
    ReferenceFP32Dir = Traces.FP32;
  }
  auto ReferenceRanks = openRanks("reference", ReferenceDir);
  std::vector<TraceReader *> Reference, FP32;
  for (auto &R : ReferenceRanks)
    Reference.push_back(R.get());
  noteRanks("reference", Reference, true);
  // Traces of two machines (meta host; older traces have none): what
  // the CPU chose (its vector extensions, torch's capability, its thread
  // count splitting reductions) may round otherwise on each.
  auto HostOf = [](TraceReader *R) {
    auto It = R->meta().find("host");
    return It == R->meta().end() ? std::string() : It->second;
  };
  if (std::string TH = HostOf(Target[0]), RH = HostOf(Reference[0]);
      !TH.empty() && !RH.empty() && TH != RH)
    errs() << Tool << ": note: the target was recorded on '" << printable(TH) << "', the reference on '"
           << printable(RH) << "': kernels chosen by the CPU may round otherwise on each\n";
  std::vector<std::unique_ptr<TraceReader>> FP32Ranks;
  if (!ReferenceFP32Dir.empty()) {
    FP32Ranks = openRanks("reference-fp32", ReferenceFP32Dir);
    // Its noise model takes it for the exact values: a trace in another
    // precision (meta dtype, from format 1.6) would make noise of them.
    const auto &Meta = FP32Ranks[0]->meta();
    if (auto Type = Meta.find("dtype"); Type != Meta.end()) {
      StringRef Main = StringRef(Type->second).split(' ').first;
      auto Parsed = parseDType(Main); // complex64 counts as float32
      if (Parsed && partType(*Parsed) != DType::F32 && partType(*Parsed) != DType::F64)
        exitWithError(Tool, makeError("--reference-fp32: '" + ReferenceFP32Dir +
                                      "' was traced in " + Main +
                                      " (meta dtype), not float32: trace the reference in "
                                      "float32 for it"));
    }
    for (auto &R : FP32Ranks)
      FP32.push_back(R.get());
    noteRanks("reference-fp32", FP32, true);
  }
  std::vector<std::unique_ptr<CodeIndex>> Indexed;
  std::vector<CodeIndex *> Idx;
  for (const std::string &I : Indexes) {
    Indexed.push_back(unwrapOrExit(Tool, CodeIndex::openForReading(I)));
    Idx.push_back(Indexed.back().get());
  }

  DiagnoseOptions Options;
  Options.Threshold = Threshold;
  if (!MappingFile.empty()) {
    Options.Mapping = unwrapOrExit(Tool, readMappingFile(MappingFile));
    CalibratedNoise Noise = unwrapOrExit(Tool, readCalibratedNoise(MappingFile));
    // R against an FP32 reference and R by the noise model without one are
    // other scales: a calibration of one says nothing of the other.
    bool FP32Now = !ReferenceFP32Dir.empty();
    if (!Noise.ByPath.empty() && Noise.AgainstFP32 && *Noise.AgainstFP32 != FP32Now)
      errs() << Tool << ": warning: the calibration's noise in '" << MappingFile
             << "' was measured " << (FP32Now ? "without" : "against")
             << " an FP32 reference and this run has " << (FP32Now ? "one" : "none")
             << ": it is not used (its mappings are)\n";
    else
      Options.CalibratedNoise = std::move(Noise.ByPath);
  }
  Options.UseRecipes = !NoRecipes;
  Options.Greedy = Greedy;
  Options.KeepUncomparable = ShowMapping;
  Diagnosis D = unwrapOrExit(Tool, diagnose(Target, Reference, FP32, Options));
  // The text holds the traces' names (module paths, classes, kernels) and
  // the index's sources: escaped (Printable.h). JSON escapes its own.
  PrintableStream Text(outs());
  // --show-mapping shows the mapping, above all where nothing could be
  // compared: it says why.
  if (!D.NothingCompared.empty()) {
    printMapping(Text, D);
    Text.finish();
    exitWithError(Tool, makeError(D.NothingCompared));
  }

  if (!CalibrateFile.empty()) {
    if (ShowMapping)
      printMapping(Text, D);
    Text.finish();
    writeCalibration(D);
    return 0;
  }

  // The JSON's components say what the mapping says, in JSON.
  if (ShowMapping && !Json)
    printMapping(Text, D);
  SourceLocator Sources(Idx);
  if (Json)
    outs() << formatv("{0:2}", toJSON(D, Sources)) << "\n";
  else
    printText(Text, D, Sources);
  // The report first, whole: a warning never lands inside it.
  Text.finish();
  if (D.Uncompared && D.Result != Diagnosis::Verdict::InputsDiffer)
    errs() << Tool << ": warning: " << D.Uncompared << " of " << D.Curve.size()
           << " target module calls could not be compared (unmapped, not captured, or in "
              "steps the reference did not run); --show-mapping lists them\n";
  if (!HtmlFile.empty()) {
    std::error_code EC;
    raw_fd_ostream OS(HtmlFile, EC);
    if (EC)
      exitWithError(Tool, makeError("cannot write '" + HtmlFile + "': " + EC.message()));
    writeHtml(OS, D, Sources);
    OS.close();
    if (OS.has_error())
      exitWithError(Tool, makeError("cannot write '" + HtmlFile + "'"));
  }
  if (!PerfettoFile.empty())
    writeMarkedTimeline(D, Target);
  return D.Result == Diagnosis::Verdict::NoDivergence ? ExitSuccess : ExitFinding;
}
