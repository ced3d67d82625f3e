//===- Diagnosis.h - From two traces to the first diverging component -*- C++ -*-===//
//
// The paper's error ratio along the target's module calls, plus the dataflow
// test the paper lacks: a root cause's output diverges while its own inputs
// do not. Components are mapped by the Align library's rules (a user's
// mapping file, the built-in recipes) or by module path, and made
// comparable by its closed set of transforms (ekka/Align/Transforms.h).
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_ANALYSIS_DIAGNOSIS_H
#define EKKA_ANALYSIS_DIAGNOSIS_H

#include "ekka/Align/Mapping.h"
#include "ekka/Trace/TraceReader.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ekka {

/// The mappings a diagnosis of a known-good pair validated (`--calibrate`):
/// every component mapped by a rule onto other paths whose ratio stayed
/// below the threshold, generalized over layer numbers (`*` for a number
/// that is the same segment on both sides) when every instance validated.
/// A path mapped onto itself is recorded only with a layout the shapes left
/// open (a "transpose" the bounded search validated); else pairing by path
/// finds it.
struct CalibratedRule {
  MappingRule Rule;
  unsigned Validated = 0; ///< Instances (calls) behind it.
  double LargestRatio = 0;
};

struct DiagnoseOptions {
  std::vector<MappingRule> Mapping; ///< Tried before matching paths.
  bool UseRecipes = true;           ///< Then the built-in recipes.
  /// R above this is divergence beyond numerical noise (the paper's 1.5).
  double Threshold = 1.5;
  /// Without an FP32 reference: how many units of roundoff of the traced
  /// precision, relative to the tensor's norm, count as noise.
  double NoiseUnits = 16;
  /// A calibration's noise (readCalibratedNoise): each component's largest
  /// R on a known-good pair, by path. Such a component departs above
  /// max(CalibratedFloor, CalibratedMargin x its noise) instead of
  /// Threshold: a bug that stays below the threshold but raises a
  /// component's R well above its own noise (partial sums kept in bf16)
  /// shows, and a component whose noise lies near the threshold is held
  /// to its own.
  std::map<std::string, double> CalibratedNoise;
  double CalibratedMargin = 1.25;
  double CalibratedFloor = 1.2;
  /// The target decoded greedily: a decode step whose token is not the
  /// argmax of the logits before it is a divergence (of the sampler, which
  /// no module call shows), not only a note.
  bool Greedy = false;
  /// Return the diagnosis even where no component could be compared
  /// (Diagnosis::NothingCompared says so), for --show-mapping to show why;
  /// otherwise that is an error.
  bool KeepUncomparable = false;
};

/// A decode step that consumed a token other than the argmax of the
/// target's logits of the step before: under greedy decoding, its sampler
/// (or what feeds the token back) departs.
struct SamplingDeparture {
  int64_t Step = 0;                 ///< The step that consumed the token.
  int64_t Consumed = 0, Argmax = 0; ///< Argmax of the logits' last row.
  std::string Logits;               ///< The call whose output the logits are.
  int64_t Rows = 0;                 ///< The logits' rows (positions).
  /// The row whose argmax the consumed token is, nearest the last (one
  /// position early: Rows - 2); -1 when none.
  int64_t Row = -1;
};

/// One target module call and how far it departs from the reference.
struct ComponentRatio {
  int64_t CallId = 0;
  int64_t Seq = 0, Step = 0;
  unsigned Depth = 0;
  std::string Path, ClassName, ClassQualname, SourceFile;
  int64_t SourceLine = 0;
  std::optional<double> Ratio;      ///< Of its outputs; none if not comparable.
  std::optional<double> InputRatio; ///< Of its inputs (through the dataflow).
  bool Mapped = true;
  bool InputsCompared = true; ///< Every input could be compared.
  std::string UnmappedReason;
  /// Which rule mapped it ("mapping file", "recipe vllm-hf 1"); empty when
  /// paired by path.
  std::string MappedBy;
  /// Its outputs were a fused add+norm's (output, residual) pair, compared
  /// as their sum with the reference's one output.
  bool ResidualPair = false;
  std::vector<std::string> ReferencePaths; ///< What it was mapped to.
  int ConcatDim = -1; ///< For several reference paths: their outputs' joining dim.
  /// Many-to-one: the target calls (paths) whose outputs together make the
  /// reference's, along ConcatDim; this call is Parts[Part].
  std::vector<std::string> Parts;
  int Part = -1;
  /// Its output's layout where the shapes left it open (dimensions of equal
  /// extent): the target's dimensions (leading ones squeezed) swapped to
  /// meet the reference's, and how that was chosen.
  std::optional<std::pair<int, int>> Transposed;
  std::string LayoutBy;
  /// From a calibration: its largest R on the known-good pair, and the
  /// ratio above which it departs here (instead of the diagnosis's). The
  /// threshold is also raised for an output of few values (ComparedValues).
  std::optional<double> CalibratedNoise, Threshold;
  /// From the rule that mapped it (NoiseOwn; MappingRule::Noise), or, up
  /// to that, the R of a call directly inside it that such a rule mapped:
  /// it departs above this many times the diagnosis's threshold. NoiseFrom
  /// names the call and its rule.
  std::optional<double> RuleNoise;
  bool NoiseOwn = false;
  std::string NoiseFrom;
  /// Its inputs depart (InputRatio above the threshold) only by such a
  /// call's allowed noise upstream, passed on to it: an input within
  /// noise, not a divergence it was given.
  bool InputNoiseByDesign = false;
  /// How many values its R was computed from (the reference output's).
  /// Two noise draws' ratio spreads as about exp(1/sqrt(n)): an output of
  /// few values (a router's one logit per token) departs above
  /// exp(3.09/sqrt(n)) where that is above the threshold (one in a
  /// thousand clean pairs would go further).
  int64_t ComparedValues = 0;
  /// Mapped, but not compared, where the reason is a clue: a call that ran
  /// in fewer of the joined steps than the model did (a decode path that
  /// skips it). Empty otherwise.
  std::string UncomparedReason;
};

/// Inside a suspect: the first op whose output departs from the matching
/// reference op (ops paired by name and order within the call), and the GPU
/// kernels it launched.
struct OpFinding {
  std::string Name, Schema;
  std::optional<double> Ratio;   ///< None when the reference ran no such op.
  std::string ReferenceName;     ///< What the reference ran at that place.
  std::vector<std::string> Kernels;
  std::string Reason;
  /// The target module call the op ran in (its innermost), 0 if unknown.
  int64_t CallId = 0;
  int64_t OpSeq = -1; ///< The op's place in the target's execution order.
  /// Found as the last writer of a tensor a later component read.
  bool LastWriter = false;
  std::string ReadBy; ///< That component (empty: the suspect's own output).
  bool WroteInPlace = false; ///< The value was an argument it wrote (`Tensor(a!)`).
  /// Beneath the op, from its kernels' buffer snapshots (GPU traces with
  /// capture): the kernel that departs first (one of Kernels), why, and its
  /// ratio when compared with the reference's same kernel. Empty when no
  /// snapshot tells.
  std::string Kernel, KernelReason;
  int KernelIndex = -1; ///< Kernel's place in Kernels (a kernel may run twice).
  std::optional<double> KernelRatio;
};

struct Suspect {
  ComponentRatio Component;
  std::string Reason;
  std::vector<ComponentRatio> Before, After; ///< The evidence window.
  std::optional<OpFinding> Op;               ///< When op outputs were captured.
  /// Where the target's steps were joined to meet a one-shot reference:
  /// (step, R) of its first output in each step alone (prefill, then each
  /// decode step), in step order; empty otherwise.
  std::vector<std::pair<int64_t, double>> StepRatios;
  /// The reference calls directly inside its counterpart that no target
  /// call was mapped onto (`model.norm (LlamaRMSNorm)`: a module the
  /// target skipped shows here, and nowhere else), in execution order.
  std::vector<std::string> UnmatchedReference;
  /// What its output is, exactly, in terms of its counterpart's where one
  /// simple relation holds ("the reference's times 2", "all zeros", "the
  /// reference's rows in another order: ..."); empty otherwise.
  std::string Relation;
};

struct Diagnosis {
  enum class Verdict { Divergence, NoDivergence, InputsDiffer } Result = Verdict::NoDivergence;
  std::vector<Suspect> Suspects;      ///< Best first; at most three.
  std::vector<ComponentRatio> Curve;  ///< Every target call, in execution order.
  std::string NoiseModel;             ///< How R was computed.
  /// No component could be compared (with DiagnoseOptions::KeepUncomparable):
  /// the error that would have been returned.
  std::string NothingCompared;
  /// Components whose output departs by a scale the engine undoes before
  /// the next component (Diagnoser::rescaledAfter): not suspects, said.
  std::vector<std::string> Rescaled;
  /// Components above the threshold but within the wider one their few
  /// values allow (ComponentRatio::ComparedValues): not suspects, said.
  std::vector<std::string> FewValues;
  /// Components above the threshold but within the wider one their mapping
  /// rule allows a computation noisier by design (ComponentRatio::
  /// RuleNoise): not suspects, said.
  std::vector<std::string> NoisierByDesign;
  std::string InputsDifference;       ///< For InputsDiffer: where, in words.
  double Threshold = 1.5;
  double MaxRatio = 0;
  /// Target forward steps folded into each component (prefill + decode
  /// steps against a one-shot reference); 1 when none were.
  int64_t MergedSteps = 1;
  /// Target calls that could not be compared (unmapped, not captured, or in
  /// steps the reference did not run).
  unsigned Uncompared = 0;
  /// The decode steps whose token was checked against the target's logits
  /// before it, and those that were not its argmax. With
  /// DiagnoseOptions::Greedy, a departure where no module call departs is
  /// the divergence (no suspects: no module computed it).
  unsigned SamplingChecked = 0;
  std::vector<SamplingDeparture> Sampling;
  /// DiagnoseOptions::Greedy: the target decoded greedily.
  bool Greedy = false;
};

llvm::StringRef verdictName(Diagnosis::Verdict V);

/// The ratio above which \p C departs: its calibrated one, or \p D's.
inline double thresholdOf(const ComponentRatio &C, const Diagnosis &D) {
  return C.Threshold.value_or(D.Threshold);
}

/// A calibration's noise: the largest R of every compared component of a
/// known-good pair's diagnosis, by path.
std::map<std::string, double> calibratedNoise(const Diagnosis &D);

std::vector<CalibratedRule> calibratedRules(const Diagnosis &D);

/// Compares \p Target with \p Reference (the same precision), using
/// \p ReferenceFP32 (optional) as the accurate answer.
llvm::Expected<Diagnosis> diagnose(TraceReader &Target, TraceReader &Reference,
                                   TraceReader *ReferenceFP32, const DiagnoseOptions &Options);

/// How a multi-rank target's ranks relate: the same modules on every rank
/// (tensor parallelism: rank 0 is compared, sharded tensors gathered from
/// all ranks), different ones (pipeline stages: joined into one call
/// sequence), or both (stages whose ranks are tensor-parallel: each
/// stage's first ranks joined and compared, the others' joined likewise to
/// lend their shards).
enum class RankLayout { Single, SameModules, Stages, TensorParallelStages };
llvm::Expected<RankLayout> rankLayout(llvm::ArrayRef<TraceReader *> Ranks);

/// A target of several pipeline stages is diagnosed as one call sequence:
/// its module call ids, op ids and op places (`seq`) carry their stage
/// above this bit, the rest being the id in that stage's first rank's trace.
constexpr int PipelineStageShift = 40;

/// The ranks (indices into \p Ranks) of each pipeline stage, first stage
/// first, each stage's ranks in order. Ranks of which one ran the same
/// modules as another, or only more (a sampler on rank 0 alone), are one
/// stage's tensor-parallel ranks. An error when the stages do not have as
/// many ranks each.
llvm::Expected<std::vector<std::vector<size_t>>>
rankStages(llvm::ArrayRef<TraceReader *> Ranks);

/// The same, for a target of several ranks (first to last).
llvm::Expected<Diagnosis> diagnose(llvm::ArrayRef<TraceReader *> TargetRanks,
                                   TraceReader &Reference, TraceReader *ReferenceFP32,
                                   const DiagnoseOptions &Options);

/// The same, for references of several ranks too (\p FP32Ranks empty
/// without an FP32 reference). A reference's pipeline stages are joined;
/// a tensor-parallel reference is compared through its first ranks, shard
/// for shard with the target's, and needs as many ranks per stage as the
/// target has.
llvm::Expected<Diagnosis> diagnose(llvm::ArrayRef<TraceReader *> TargetRanks,
                                   llvm::ArrayRef<TraceReader *> ReferenceRanks,
                                   llvm::ArrayRef<TraceReader *> FP32Ranks,
                                   const DiagnoseOptions &Options);

} // namespace ekka

#endif
