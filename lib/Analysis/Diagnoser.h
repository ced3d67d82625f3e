//===- Diagnoser.h - The comparison of two traces, call by call ----*- C++ -*-===//
//
// Internal to lib/Analysis: the state of one diagnosis and its steps, defined
// in Diagnosis.cpp (the driver, the inputs check), Compare.cpp (alignment and
// the error ratio), ComponentMapping.cpp (rules, paths, evidence),
// ChangePoint.cpp (localization) and KernelDrillDown.cpp (ops and kernels).
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_LIB_ANALYSIS_DIAGNOSER_H
#define EKKA_LIB_ANALYSIS_DIAGNOSER_H

#include "Side.h"

#include "ekka/Analysis/Diagnosis.h"
#include "ekka/Analysis/TensorMath.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringRef.h"

#include <map>
#include <set>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace ekka {
namespace detail {

using namespace llvm;

/// One diagnosis: the target side T compared with the reference side R (and
/// the FP32 reference F), call by call, then localized and drilled down.
class Diagnoser {
public:
  Diagnoser(Side &T, Side &R, Side *F, const DiagnoseOptions &O) : T(T), R(R), F(F), O(O) {}
  void setRowOrders(std::map<int64_t, std::vector<size_t>> Orders) { RowOrders = std::move(Orders); }

  Diagnosis run();

private:
  /// The root calls' inputs (token ids) of the first step must agree before
  /// any module can be blamed: a missing BOS token shows up here.
  bool checkInputs(Diagnosis &D);
  /// The target's tensor \p A of root \p Call and its later steps' alike,
  /// one after the other, whatever their shapes (token ids).
  std::optional<std::vector<double>> joinedIds(const TensorRecord *A, int64_t Call);
  /// Each decode step's token against the argmax of the target's logits of
  /// the step before (D.Sampling).
  void checkSampling(Diagnosis &D);
  /// Suspect::Relation of a one-to-one mapped component.
  std::string relation(const ComponentRatio &C);

  static std::string shape(llvm::ArrayRef<int64_t> S) {
    std::string Out = "[";
    for (size_t I = 0; I < S.size(); ++I)
      Out += (I ? ", " : "") + std::to_string(S[I]);
    return Out + "]";
  }

  /// The ratio for one pair of same-role tensors (and the FP32 reference's).
  std::optional<double> ratio(const TensorRecord *A, const TensorRecord *B, const TensorRecord *C,
                              int64_t TargetCall = 0);
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::optional<double>> Ratios;

  /// A layout the shapes leave open ([T, H, D] against [1, H, T, D] with
  /// T == H): the swap of the target tensor's dimensions (leading ones
  /// squeezed) that meets the reference's, none for as is, and how it was
  /// chosen (empty: nothing but the default).
  struct LayoutChoice {
    std::optional<std::pair<int, int>> Swap;
    std::string How;
  };
  /// By (target tensor, reference tensor), once chosen.
  std::map<std::pair<int64_t, int64_t>, LayoutChoice> Layouts;
  /// Target output tensors whose open layout a rule, an earlier call or the
  /// search swapped, for the report.
  DenseMap<int64_t, LayoutChoice> Chosen;
  /// The layout of the comparison in progress where it was open (unset:
  /// what the shapes say).
  std::optional<std::optional<std::pair<int, int>>> Current;
  /// What the calls of a component validated or their shapes forced, by
  /// layoutKey(): its later open calls follow it, so a bug in one layer is
  /// not explained away by a layout its other calls did not have.
  std::map<std::string, std::optional<std::pair<int, int>>> Learned;
  /// The reference's tensor read in its memory order for the comparison in
  /// progress (the swap its strides show), when only that meets the target.
  std::optional<std::pair<int, int>> RefSwap;

  /// When reference tensor \p B, as the program laid it out, is not
  /// comparable with target tensor \p A but its memory order is (a view
  /// such as Gemma-3's heads-first `q_norm` input against an engine's
  /// [tokens, heads * dim]): the swap that reads B in its memory order.
  std::optional<std::pair<int, int>> memoryOrder(const TensorRecord *A,
                                                 const TensorRecord *B) const;

  /// \p S with dimensions \p Swap exchanged.
  static Dims swapped(Dims S, std::pair<int, int> Swap) {
    std::swap(S[size_t(Swap.first)], S[size_t(Swap.second)]);
    return S;
  }

  /// Components whose search found nothing: not searched again.
  std::set<std::string> SearchFailed;
  /// Target call -> its mapping rule's "transpose".
  DenseMap<int64_t, std::pair<int, int>> RuleLayouts;

  /// Whether the layout of target tensor \p A against reference tensor
  /// \p B is open: their shapes agree, and dimensions of equal extent could
  /// have been swapped.
  bool layoutOpen(const TensorRecord *A, const TensorRecord *B) const;

  /// A component's tensor as the layouts it validated are remembered: its
  /// path with layer numbers starred, its role and position. Empty for an
  /// op's and a kernel's tensors, which are compared as they are.
  std::string layoutKey(const TensorRecord *A) const;

  /// The layout of \p A when something other than its values settles it:
  /// its call's mapping rule (for the call's output), else what the
  /// component's earlier calls validated or their shapes forced.
  std::optional<LayoutChoice> settledLayout(const TensorRecord *A) const;

  /// The bounded search for an open layout, run when \p A as it is departs
  /// from \p B and nothing settled it: the swaps of two dimensions of equal
  /// extent that one of the tensors' recorded strides shows (a transposed
  /// view: what one program did in memory), validated on the tensor sums
  /// (the norms, which no layout changes, must agree) and on sampled
  /// elements (within the threshold). Exactly one swap must pass; none or
  /// several leave the tensor as it is. The caller then validates it on every
  /// element. The set is closed: it only reorders elements.
  LayoutChoice searchLayout(const TensorRecord *A, const TensorRecord *B, const TensorRecord *C);

  /// The ratio of the target's values \p XT (of dtype \p TargetType) to
  /// reference tensor \p B, with FP32 reference tensor \p C if any.
  std::optional<double> ratioOf(std::optional<std::vector<double>> XT, DType TargetType,
                                const TensorRecord *B, const TensorRecord *C);
  /// ratioValues, and where the target's steps were joined into \p XT (the
  /// last targetValues of an output), each step's alone (StepRatios).
  std::optional<double> joinedRatio(ArrayRef<double> XT, DType TargetType, ArrayRef<double> XR,
                                    ArrayRef<double> YR, DType RefType);

  /// R from finite sums: against the FP32 reference when \p WithFP32,
  /// else by the noise model.
  double ratioFromSums(const RatioSums &S, bool WithFP32, DType TargetType, DType RefType) const;

  /// The ratio straight from the captured bytes, when the three tensors are
  /// compared as recorded (no transform moves an element: no steps merged,
  /// no shards, no padding, no transposition) and every value is finite.
  std::optional<double> ratioFromBytes(const TensorRecord *A, const TensorRecord *B,
                                       const TensorRecord *C, int64_t TargetCall);

  /// The error ratio of target values \p XT against reference values \p XR
  /// (of dtype \p RefType) and, if as large (not empty), FP32 reference
  /// values \p YR; none when the sizes of \p XT and \p XR differ.
  std::optional<double> ratioValues(ArrayRef<double> XT, DType TargetType, ArrayRef<double> XR,
                                    DType RefType, ArrayRef<double> YR) const;

  /// The largest ratio over a call's tensors of one role. \p AllCompared
  /// (if given) says whether every such tensor could be compared.
  std::optional<double> callRatio(const ModuleCallRecord &TC, const ModuleCallRecord &RC,
                                  const ModuleCallRecord *FC, StringRef Role,
                                  bool *AllCompared = nullptr, bool *ResidualPair = nullptr);

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
  std::vector<const TensorRecord *> uncomparedInputs(const ComponentRatio &C);

  /// The floating inputs of \p C that were not compared: uncomparedInputs,
  /// or all of them where it has no reference call whose inputs meet them
  /// (a backend mapped onto o_proj's input).
  std::vector<const TensorRecord *> inputsNotCompared(const ComponentRatio &C);

  /// The first floating input of \p C that departs from the reference's (or
  /// its first floating input, when none could be told apart).
  const TensorRecord *departingInput(const ComponentRatio &C);

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
  static RoleTensors roleTensors(const Side &S, int64_t Call, StringRef Role);
  /// Whether input \p X is an additive attention mask ([batch, 1, q, k]:
  /// zeros and the dtype's lowest), left out of the inputs compared.
  static bool additiveMask(const Side &S, const TensorRecord *X);

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
                                          const RoleTensors &FT, bool &Summed);

  /// A fused residual-add + norm's second output, the residual (output +
  /// residual in, added): the reference norm returns only its output, and
  /// took that sum as its input. The ratio of the residual against it, when
  /// \p TC is such a call (its input pair adds up to the reference's input
  /// by residualPairRatio, and its outputs are two tensors of one shape
  /// against the reference's one); none otherwise. A norm that forgets to
  /// store the sum returns a stale residual its own output does not show.
  std::optional<double> residualOutputRatio(const ModuleCallRecord &TC,
                                            const ModuleCallRecord &RC,
                                            const ModuleCallRecord *FC, const RoleTensors &TT,
                                            const RoleTensors &RT);

  /// The swap that puts target tensor \p A in the reference's layout (of
  /// shape \p RefShape): the one chosen for the comparison in progress
  /// where the shapes left it open, else the one the shapes make (none: as
  /// it is).
  std::optional<std::pair<int, int>> layoutOf(const TensorRecord *A, const Dims &RefShape) const {
    if (Current)
      return *Current;
    return transposition(A->Shape, RefShape);
  }

  /// The target's values for tensor \p A of call \p Call. When the target
  /// served the prompt as a prefill and then decode steps against a
  /// reference that ran the whole sequence in one forward, a component's
  /// tensors of every step are concatenated along the token dimension — the
  /// one where the steps' shapes differ and add up to the reference's.
  std::optional<std::vector<double>> targetValues(const TensorRecord *A, int64_t Call,
                                                  const Dims &RefShape);

  /// Prefill and decode steps against a one-shot reference: group each
  /// target call of step 1 with the same module's calls in later steps.
  void groupSteps();

  bool MergeSteps = false;
  /// Where the reference ran each request in a step of its own (joined by
  /// Side::joinSteps) and the target served them together: for a number
  /// of joined rows (every token, or each segment's last: the logits), the
  /// target's row that goes to each place, request after request.
  std::map<int64_t, std::vector<size_t>> RowOrders;
  /// What the last targetValues joined along the tokens (its first
  /// dimension): the tensor, its call, and each step's rows in order.
  struct JoinedSteps {
    const TensorRecord *A = nullptr;
    int64_t Call = 0;
    std::vector<std::pair<int64_t, int64_t>> Rows;
  } LastJoined;
  /// Call -> its outputs' R in each step alone (the largest), where its
  /// steps were joined along the tokens (a departure in decode steps only
  /// shows).
  DenseMap<int64_t, std::vector<std::pair<int64_t, double>>> StepRatios;
  /// StepRatios as the curve's ratios left them (later comparisons, the
  /// drill-down's, compare other tensors): what the suspects report.
  DenseMap<int64_t, std::vector<std::pair<int64_t, double>>> CurveStepRatios;
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
                                  const std::vector<bool> &Inputs);

  /// The tensors of the other tensor-parallel ranks that stand where \p X
  /// stands on rank 0: the same call (step, path, occurrence), role and
  /// index. Empty unless every rank has one.
  std::vector<const TensorRecord *> peerTensors(const TensorRecord *X) const;

  /// The record holding \p X's statistics: an input that is an earlier
  /// output has them on that output.
  static const TensorRecord *producer(const Side &S, const TensorRecord *X) {
    for (unsigned Hops = 0; X && X->SourceId && Hops < 4; ++Hops)
      X = S.TensorById.lookup(*X->SourceId);
    return X;
  }

  /// Whether \p X is the same on every tensor-parallel rank (by its
  /// statistics; unknown counts as the same).
  bool replicated(const TensorRecord *X) const;

  /// Whether \p X is one rank's share of a tensor of \p RefShape: the
  /// ranks' features side by side make the reference's (a column-parallel
  /// layer's output, a row-parallel one's input).
  bool sharded(const TensorRecord *X, const Dims &RefShape) const;

  /// When a fused module is compared with the concatenation of several
  /// reference modules (a recipe: qkv_proj against q, k and v), their
  /// features; each rank holds its share of every part, so the gathered
  /// tensor is regrouped part by part.
  std::vector<int64_t> GatherParts;

  /// \p X gathered from every rank: each token's features, rank after rank
  /// (part after part, each part rank after rank, with GatherParts).
  std::optional<std::vector<double>> gathered(const TensorRecord *X, int64_t Local) const;

  /// Structural evidence against a pairing by path: the same name for a
  /// different computation (vLLM's `act_fn` is SiluAndMul, which takes the
  /// gate and up projections together; HF's is the activation alone). Their
  /// first input's or first output's last dimension (the feature size)
  /// differ. Empty when nothing speaks against the pair.
  std::string structureDiffers(const ModuleCallRecord &TC, const ModuleCallRecord &RC);

  /// \p Pattern (a rule's reference, stars substituted) with a path
  /// relative to \p TC resolved: `{parent}`, `{grandparent}`, `{next}`;
  /// none where \p TC has no such relative.
  std::optional<std::string> relativePath(StringRef Pattern, const ModuleCallRecord &TC) const;

  /// The call after \p TC under the same parent (the module an activation
  /// or an attention backend hands its output to); null if none.
  const ModuleCallRecord *nextSibling(const ModuleCallRecord &TC) const;

  /// Structural evidence that \p TC computes more than \p RC, at its
  /// path: it calls, itself or through a helper of its own, a module
  /// named elsewhere (one it borrows) whose
  /// counterpart the reference runs after \p RC, outside it — its output
  /// holds work the reference does later (vLLM's shared expert applies the
  /// sigmoid gate HF's MoE block applies to its output; its fused-experts
  /// runner adds the shared expert in). A module borrowed to make an input
  /// (a router the runner calls first) is no such evidence. Empty if none.
  std::string laterWorkInside(const ModuleCallRecord &TC, const ModuleCallRecord &RC);

  /// Applies the first mapping rule that matches \p TC; true if one did.
  bool applyRule(const ModuleCallRecord &TC, ComponentRatio &C);

  /// Whether the root calls among \p RC (a recipe onto the reference's
  /// root) return what \p TC does: their first outputs have its features.
  bool rootHolds(const ModuleCallRecord &TC,
                 const std::vector<const ModuleCallRecord *> &RC) const;

  /// A many-to-one rule: target call \p TC is one of several parts whose
  /// outputs together make one reference call's. The reference output (and
  /// the FP32 one) is split along the rule's dimension by the parts' sizes
  /// there, and \p TC's own part compared.
  bool applyPartRule(const ModuleCallRecord &TC, const MappingRule &Rule,
                     const std::vector<std::string> &Stars, ComponentRatio &C);

  void computeRatios(Diagnosis &D);

  /// Pairs target call \p TC with reference call \p RC and compares them.
  void pair(const ModuleCallRecord &TC, const ModuleCallRecord &RC, ComponentRatio &C);

  /// The reference calls that target calls pair with by path: not free for
  /// the evidence below.
  void reservePaths();

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
  bool mapByEvidence(const ModuleCallRecord &TC, ComponentRatio &C);

  static const ModuleCallRecord *parentOf(const Side &S, const ModuleCallRecord &M) {
    return M.ParentId ? S.CallById.lookup(*M.ParentId) : nullptr;
  }

  /// Whether target tensor \p A (of call \p Call, its decode steps merged
  /// and shards gathered as the comparison does) holds as many elements as
  /// reference tensor \p B, with the same features per token.
  bool comparableShapes(const TensorRecord *A, const TensorRecord *B, int64_t Call) const;

  /// Whether two tensors' norms, from their recorded statistics, are close
  /// enough for their values to agree within noise (R at most the threshold
  /// puts them within a few units of noise, far below 10 %). Unknown (no
  /// statistics, or the values are not the recorded tensor's: padding
  /// dropped, steps merged, shards gathered) counts as close.
  bool plausibleNorms(const TensorRecord *A, const TensorRecord *B) const;

  /// Target call -> the reference call it was mapped to.
  DenseMap<int64_t, const ModuleCallRecord *> RefOf;
  /// Reference calls taken by a path, a rule or evidence.
  DenseSet<int64_t> UsedRef;
  /// Calls that have children, on each side.
  DenseSet<int64_t> TargetParents, ReferenceParents;
  /// The sequence number of the reference call mapped last.
  int64_t Cursor = -1;

  bool elevated(const std::optional<double> &X) const { return X && *X > O.Threshold; }
  /// Whether \p C's output departs: above its own threshold where it has
  /// one (a calibration's, a rule's noise, few values). Inputs are held to
  /// the diagnosis's.
  /// For an infinite ratio: the NaN and Inf its outputs hold, against the
  /// reference's (empty when they hold none: a finite value off by more
  /// than the scale can say).
  std::string nonFinite(const ComponentRatio &C) const;
  bool departs(const ComponentRatio &C) const {
    return C.Ratio && *C.Ratio > C.Threshold.value_or(O.Threshold);
  }

  void localize(Diagnosis &D);
  /// Whether the departure of D.Curve[I] is a scale that the engine undoes
  /// before the next component, which is given what its counterpart is
  /// (Gemma's embedding: vLLM multiplies by sqrt(hidden) after
  /// embed_tokens, HF's scaled embedding inside it). Then it is no root
  /// cause: its output is only another factoring of the same tensor, and
  /// a note says so (Diagnosis::Rescaled).
  bool rescaledAfter(Diagnosis &D, size_t I);
  DenseSet<int64_t> RescaledCalls;

  /// For a call whose inputs could not all be compared: whether what flows
  /// into it had already departed, as far as the calls around it tell —
  /// the inputs of its nearest mapped ancestor, or the output of a mapped
  /// call that ran before it inside that ancestor (an engine's attention
  /// backend after a layer whose input departed; a logits processor after
  /// the model whose output departed). Such a call passes a divergence on.
  bool divergedUpstream(const Diagnosis &D, size_t Index) const;

  /// Whether \p C's elevated inputs are the outputs of mapped calls within
  /// the wider noise their rule allows them (ComponentRatio::RuleNoise: an
  /// attention backend's), directly or through mapped calls that only
  /// passed it on, and its input's R is within that noise too: noise,
  /// held to the threshold times the input's R like an input within
  /// noise, not a divergence entering from a call without a counterpart.
  bool inputNoiseByDesign(const Diagnosis &D, const ComponentRatio &C) const;
  /// Whether every elevated input of \p At comes from a call within the
  /// noise its rule allows, or from one that only passed such an input on
  /// (up to 8 calls back), and one does; \p Allowed: the least such
  /// call's threshold.
  bool explainedByNoise(const Diagnosis &D, const ComponentRatio &At, int Depth,
                        std::optional<double> &Allowed) const;

  /// The nearest mapped call around curve entry \p Index, or null.
  const ComponentRatio *mappedAncestor(const Diagnosis &D, size_t Index) const;

  /// A call paired by structure alone (nothing on the reference side agreed
  /// with it) may be paired wrongly — a module only the target has, set
  /// against a free reference call of the same shapes — and would then
  /// depart for that reason alone. It is a candidate only when the mapped
  /// call around it departs too.
  bool containerDeparts(const Diagnosis &D, size_t Index) const {
    const ComponentRatio *Ancestor = mappedAncestor(D, Index);
    return Ancestor && elevated(Ancestor->Ratio);
  }

  /// A component without a reference counterpart whose output a suspect
  /// was given as an input.
  struct UnmappedProducer {
    size_t Index; ///< In the curve.
    std::string Why; ///< What the reference's op statistics said of it.
    /// They found its output nowhere among the reference's ops: it
    /// computed something else (not merely unchecked).
    bool Disagrees;
  };
  /// The first producer of \p C's inputs without a reference counterpart
  /// that the reference's op statistics do not clear, if any.
  std::optional<UnmappedProducer> unmappedProducer(const Diagnosis &D, const ComponentRatio &C);

  /// For the candidate at \p Index, with inputs that could not be compared
  /// and that no module returned (an op wrote them in place: a fused q/k
  /// norm + rope that the attention block calls itself): the captured op
  /// inside its mapped ancestor that last wrote one, when the reference's
  /// op statistics find what it wrote (over the steps joined) nowhere in
  /// the ancestor's counterpart. The curve index of the mapped call around
  /// the op, and the op.
  std::optional<std::pair<size_t, OpFinding>> disagreeingOpProducer(const Diagnosis &D,
                                                                    size_t Index);

  /// Whether every output of the unmapped component at \p Index has the
  /// statistics of an op output of the reference inside its mapped
  /// ancestor's counterpart: what it computed is there, op by op. Empty
  /// when they could not tell, with \p Why set to the reason.
  std::optional<bool> agreesByStatistics(const Diagnosis &D, size_t Index, std::string &Why);

  /// For a candidate with inputs that could not be compared: a mapped
  /// component that produced one of them with a lower precision than the
  /// reference's counterpart produced its output. Its index in the curve and
  /// the reason.
  std::optional<std::pair<size_t, std::string>> lowerPrecisionProducer(const Diagnosis &D,
                                                                       const ComponentRatio &C);

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
  std::optional<size_t> mappedCallAround(const Diagnosis &D, int64_t Call, int64_t Stop) const;

  /// Target call id -> its entry in the curve (computeRatios builds it).
  DenseMap<int64_t, size_t> CurveIndex;

  /// The ops of a call (its own, not its children's) with captured outputs,
  /// in execution order.
  static std::vector<const OpRecord *> capturedOps(const Side &S, int64_t Call);

  /// Ops that only move or relabel values already computed (views, copies,
  /// dtype and layout changes): not where a value was made.
  static bool movesOnly(StringRef Name);

  /// Ops whose output is storage still to be written (an `out=` buffer being
  /// sized) or a view of an input: what they "computed" says nothing.
  static bool allocatesOnly(StringRef Name) {
    return Name == "aten::resize_" || Name == "aten::empty" || Name == "aten::empty_like" ||
           Name == "aten::empty_strided" || Name == "aten::new_empty" || Name == "aten::alias" ||
           Name == "aten::set_";
  }

  /// The first op of the suspect whose output departs from the reference's
  /// op at the same place (same name, same occurrence), or the first op the
  /// reference did not run.
  std::optional<OpFinding> drillDown(const ComponentRatio &C);

  /// Inside suspect \p C, the first op that wrote a paged KV cache
  /// ([blocks, block_size, ...], written in place) other than what it was
  /// given: the cache, un-paged by the op's slot mapping (an integer input
  /// of one slot per token, as vLLM's reshape_and_cache takes), departs from
  /// the op's floating input of as many elements (the keys, the values; the
  /// i-th cache against the i-th such input). Needs the op's inputs captured
  /// (ekka-trace --capture-op-inputs); none otherwise.
  std::optional<OpFinding> cacheWriteDrillDown(const ComponentRatio &C);

  std::optional<OpFinding> pairedDrillDown(const ComponentRatio &C);

  /// Inside a suspect whose own computation has no reference counterpart
  /// (a serving engine's attention: its custom ops and unmapped children),
  /// the divergence first shows as the elevated input of a mapped child
  /// (`o_proj`): the op that last wrote that tensor is the one that made
  /// it. It is found by value — the op's captured output or written
  /// argument holds exactly what the child was given — among the suspect's
  /// ops (its children's included) that ran before the child.
  std::optional<OpFinding> lastWriter(const ComponentRatio &C, bool OfOutput = false);

  /// The last op inside suspect \p C, before call \p Before's first op (or
  /// anywhere in it, for its own output), whose captured output or
  /// in-place write holds exactly \p Given's values.
  std::optional<OpFinding> writerOf(const ComponentRatio &C, const TensorRecord *Given,
                                    int64_t Before, const ComponentRatio *Child);

  /// Beneath op \p OpId, from its kernels' buffer snapshots (taken after
  /// each kernel, on a GPU): the first kernel whose buffers depart from the
  /// reference's same kernel, when \p RefOp launched the same kernels in
  /// the same order (a kernel developer's old and new build); else the
  /// first kernel after which a buffer held the op's departing value
  /// \p Value — the kernel that wrote it. Nothing when no snapshot tells.
  void refineToKernel(OpFinding &F, int64_t OpId, const OpRecord *RefOp, const TensorRecord *Value);

  /// The kernels op \p OpId launched, in launch order.
  std::vector<std::string> kernelNames(int64_t OpId) const;

  /// The same values, a NaN equal to a NaN.
  static bool sameValues(const Elements &A, const Elements &B);

  /// The components compared so far, for the drill-down.
  std::vector<ComponentRatio> CurveSoFar;

  Side &T, &R;
  Side *F;
  const DiagnoseOptions &O;

public:
  /// The target's other tensor-parallel ranks (rank 0 is T).
  std::vector<Side *> Peers;
};

} // namespace detail
} // namespace ekka

#endif
