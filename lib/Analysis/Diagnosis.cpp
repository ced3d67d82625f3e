//===- Diagnosis.cpp - From two traces to the first diverging component ---===//
#include "ekka/Analysis/Diagnosis.h"
#include "ekka/Analysis/ServedRequests.h"
#include "Diagnoser.h"
#include "ekka/Align/Transforms.h"
#include "ekka/Analysis/TensorMath.h"
#include "ekka/Support/Error.h"
#include "ekka/Support/Plural.h"
#include "ekka/Support/Progress.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
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

/// The last part of a module path: `norm` of `model.norm`, the name a
/// module goes by in its parent.
static StringRef leafName(StringRef Path) {
  StringRef Leaf = Path.rsplit('.').second;
  return Leaf.empty() ? Path : Leaf;
}

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
    if (C.NoiseOwn)
      Rule.Noise = C.RuleNoise;
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
    if (!C.Ratio || *C.Ratio >= (C.NoiseOwn ? thresholdOf(C, D) : D.Threshold)) {
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

std::map<std::string, double> calibratedNoise(const Diagnosis &D) {
  std::map<std::string, double> Out;
  for (const ComponentRatio &C : D.Curve)
    if (C.Mapped && C.Ratio)
      Out[C.Path] = std::max(Out[C.Path], *C.Ratio);
  return Out;
}

using namespace detail;

namespace detail {

Diagnosis Diagnoser::run() {
  Diagnosis D;
  D.Threshold = O.Threshold;
  D.Greedy = O.Greedy;
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
  if (!O.CalibratedNoise.empty())
    D.NoiseModel += formatv("; a component with a calibrated noise departs above {0} times "
                            "it (at least {1})",
                            format("%g", O.CalibratedMargin), format("%g", O.CalibratedFloor))
                        .str();
  if (checkInputs(D))
    return D;
  reservePaths();
  computeRatios(D);
  // The change point, the drill-down into ops and kernels, and the checks
  // after them: a phase of its own on a terminal.
  ProgressBar Phase("localizing the divergence");
  CurveSoFar = D.Curve;
  CurveStepRatios = std::move(StepRatios);
  StepRatios.clear();
  localize(D);
  // A rescaled component's ratio measures a factoring, not noise.
  if (!RescaledCalls.empty()) {
    D.MaxRatio = 0;
    for (const ComponentRatio &C : D.Curve)
      if (C.Ratio && !RescaledCalls.count(C.CallId))
        D.MaxRatio = std::max(D.MaxRatio, *C.Ratio);
  }
  for (const ComponentRatio &C : D.Curve) {
    if (!C.Ratio || *C.Ratio <= O.Threshold || !C.Threshold || C.CalibratedNoise ||
        *C.Ratio > *C.Threshold)
      continue;
    if (C.RuleNoise && *C.Threshold <= O.Threshold * *C.RuleNoise)
      D.NoisierByDesign.push_back(
          formatv("{0}: R = {1}, within the {2} allowed a computation noisier than the "
                  "reference's by design ({3}, noise {4})",
                  C.Path.empty() ? "(root)" : C.Path, format("%.3g", *C.Ratio),
                  format("%.3g", *C.Threshold), C.NoiseFrom, format("%.3g", *C.RuleNoise))
              .str());
    else
      D.FewValues.push_back(formatv("{0}: R = {1} of {2} values, within the {3} that so few "
                                    "allow",
                                    C.Path.empty() ? "(root)" : C.Path, format("%.3g", *C.Ratio),
                                    C.ComparedValues, format("%.3g", *C.Threshold))
                                .str());
  }
  checkSampling(D);
  // Greedy decoding that did not take its logits' argmax: the sampler's
  // divergence, which no module call shows.
  if (O.Greedy && !D.Sampling.empty() && D.Result == Diagnosis::Verdict::NoDivergence)
    D.Result = Diagnosis::Verdict::Divergence;
  // The names the target's calls go by (the last part of each path).
  StringSet<> TargetNames;
  for (const ModuleCallRecord &M : T.Calls)
    TargetNames.insert(leafName(M.Path));
  for (Suspect &S : D.Suspects) {
    if (auto It = CurveStepRatios.find(S.Component.CallId); It != CurveStepRatios.end())
      S.StepRatios = It->second;
    S.Relation = relation(S.Component);
    if (const ModuleCallRecord *RC = refCall(S.Component.CallId)) {
      // Each once, with how many times it ran (Gemma3's rotary_emb, twice).
      // One whose name the target calls elsewhere was moved, not skipped
      // (HF's model-level rotary_emb, an engine's in each attention).
      std::vector<std::pair<std::string, unsigned>> Unmatched;
      for (const ModuleCallRecord &X : R.Calls) {
        if (X.ParentId != RC->Id || UsedRef.count(X.Id) || TargetNames.count(leafName(X.Path)))
          continue;
        std::string Name = (X.Path.empty() ? std::string("(root)") : X.Path) + " (" +
                           X.ClassName + ")";
        auto It = llvm::find_if(Unmatched, [&](const auto &U) { return U.first == Name; });
        if (It == Unmatched.end())
          Unmatched.emplace_back(std::move(Name), 1);
        else
          ++It->second;
      }
      for (auto &[Name, Times] : Unmatched)
        S.UnmatchedReference.push_back(Times > 1 ? Name + " x" + std::to_string(Times)
                                                 : std::move(Name));
    }
  }
  return D;
}

/// For \p Requests served step by step: the target's joined rows (every
/// token; each segment's last, the logits), request after request, where
/// that differs from the steps' order.
static std::map<int64_t, std::vector<size_t>>
requestRowOrders(const std::vector<ServedRequest> &Requests) {
  std::map<int64_t, int64_t> Tokens, Segments; // per step
  for (const ServedRequest &R : Requests)
    for (const ServedRequest::Segment &S : R.Segments) {
      Tokens[S.Step] += S.End - S.Begin;
      Segments[S.Step] += 1;
    }
  std::map<int64_t, int64_t> TokenAt, SegmentAt; // each step's first row
  int64_t NT = 0, NS = 0;
  for (auto &[Step, N] : Tokens) {
    TokenAt[Step] = NT;
    NT += N;
  }
  for (auto &[Step, N] : Segments) {
    SegmentAt[Step] = NS;
    NS += N;
  }
  std::vector<size_t> ByToken, BySegment;
  for (const ServedRequest &R : Requests)
    for (const ServedRequest::Segment &S : R.Segments) {
      for (int64_t Row = S.Begin; Row < S.End; ++Row)
        ByToken.push_back(size_t(TokenAt[S.Step] + Row));
      BySegment.push_back(size_t(SegmentAt[S.Step] + S.IndexInStep));
    }
  std::map<int64_t, std::vector<size_t>> Out;
  auto Identity = [](const std::vector<size_t> &V) {
    for (size_t I = 0; I < V.size(); ++I)
      if (V[I] != I)
        return false;
    return true;
  };
  if (!Identity(ByToken))
    Out[NT] = std::move(ByToken);
  if (!Identity(BySegment) && NS != NT)
    Out[NS] = std::move(BySegment);
  return Out;
}

/// The vocabulary of a reference: its root's first output's last extent
/// (HF's logits), or 0.
static int64_t vocabOf(const Side &S) {
  for (const ModuleCallRecord &M : S.Calls)
    if (!M.ParentId)
      if (const TensorRecord *X = S.tensor(M.Id, "output", 0); X && !X->Shape.empty())
        return X->Shape.back();
  return 0;
}

/// The first call without a parent: the root of the first step.
static const ModuleCallRecord *firstRoot(const Side &S) {
  for (const ModuleCallRecord &M : S.Calls)
    if (!M.ParentId)
      return &M;
  return nullptr;
}

/// A root's first integer input: the token ids. Other integer inputs
/// (positions, an attention mask) are passed differently by each program;
/// floating inputs (embeddings fed directly) are compared as components are.
static const TensorRecord *tokenIds(const Side &S, int64_t Root) {
  for (int64_t I = 0; const TensorRecord *X = S.tensor(Root, "input", I); ++I)
    if (unitRoundoff(X->Type) == 0)
      return X;
  return nullptr;
}

std::string Diagnoser::relation(const ComponentRatio &C) {
  const ModuleCallRecord *RC = refCall(C.CallId);
  // Not of one within noise (a producer named for what it wrote elsewhere).
  if (!RC || !C.Ratio || !departs(C) || C.ReferencePaths.size() != 1 || C.Transposed ||
      C.ResidualPair || !Peers.empty())
    return "";
  const TensorRecord *A = T.tensor(C.CallId, "output", 0), *B = R.tensor(RC->Id, "output", 0);
  if (!A || !B || B->Shape.empty())
    return "";
  auto XT = targetValues(A, C.CallId, B->Shape);
  LastJoined = JoinedSteps();
  auto XR = R.values(B);
  if (!XT || !XR || XT->size() != XR->size() || XT->empty())
    return "";
  std::optional<Elements> YF;
  if (const ModuleCallRecord *FC = F ? fp32Call(RC) : nullptr)
    if (const TensorRecord *Z = F->tensor(FC->Id, "output", 0))
      YF = F->values(Z);
  if (YF && YF->size() != XR->size())
    YF.reset();
  const Elements &X = *XT, &Y = *XR;
  // A relation holds where the target's output, undone by it, agrees with
  // the reference's within noise.
  auto Agrees = [&](const Elements &Undone) {
    auto Ratio = ratioValues(Undone, A->Type, Y, B->Type,
                             YF ? ArrayRef<double>(*YF) : ArrayRef<double>());
    return Ratio && *Ratio <= O.Threshold;
  };
  double XX = 0, YY = 0, XY = 0;
  for (size_t I = 0; I < X.size(); ++I) {
    XX += X[I] * X[I];
    YY += Y[I] * Y[I];
    XY += X[I] * Y[I];
  }
  if (!std::isfinite(XX) || !std::isfinite(YY) || YY == 0)
    return "";
  if (XX == 0)
    return "all zeros";
  // A scale: X = c Y.
  if (double Scale = XY / YY; Scale != 0 && std::fabs(Scale - 1) > 0.01) {
    Elements Undone(X);
    for (double &V : Undone)
      V /= Scale;
    if (Agrees(Undone))
      return formatv("the reference's times {0}", format("%.3g", Scale)).str();
  }
  // Its rows (tokens, or pooled sequences) are the reference's, reordered:
  // each row's nearest reference row, checked together. Nearest on at most
  // 256 evenly spread features: rows x rows of a vocabulary's would take a
  // minute (the check on every element rejects a wrong pairing).
  size_t Features = size_t(B->Shape.back());
  size_t Rows = Features ? X.size() / Features : 0;
  if (Rows < 2 || Rows > 512 || Rows * Features != X.size())
    return "";
  size_t Probe = std::min<size_t>(Features, 256);
  Elements XP(Rows * Probe), YP(Rows * Probe);
  for (size_t I = 0; I < Rows; ++I)
    for (size_t K = 0; K < Probe; ++K) {
      XP[I * Probe + K] = X[I * Features + K * Features / Probe];
      YP[I * Probe + K] = Y[I * Features + K * Features / Probe];
    }
  std::vector<size_t> From(Rows);
  std::vector<bool> Taken(Rows, false);
  Elements Undone(X.size());
  for (size_t I = 0; I < Rows; ++I) {
    double Best = std::numeric_limits<double>::infinity();
    for (size_t J = 0; J < Rows; ++J) {
      double D = 0;
      for (size_t K = 0; K < Probe; ++K) {
        double Diff = XP[I * Probe + K] - YP[J * Probe + K];
        D += Diff * Diff;
      }
      if (D < Best) {
        Best = D;
        From[I] = J;
      }
    }
    if (Taken[From[I]])
      return "";
    Taken[From[I]] = true;
    std::copy_n(X.begin() + I * Features, Features, Undone.begin() + From[I] * Features);
  }
  size_t First = 0;
  while (First < Rows && From[First] == First)
    ++First;
  if (First == Rows || !Agrees(Undone))
    return "";
  return formatv("the reference's rows in another order (its row {0} is the reference's row {1})",
                 First, From[First])
      .str();
}

void Diagnoser::checkSampling(Diagnosis &D) {
  // The vocabulary: the last extent of the reference root's output (HF's
  // *ForCausalLM returns the logits).
  const ModuleCallRecord *RR = firstRoot(R);
  // A language model's head: HF's generating classes (a base model's
  // output is its hidden states).
  StringRef Class = RR ? StringRef(RR->ClassName) : StringRef();
  if (!Class.ends_with("ForCausalLM") && !Class.ends_with("LMHeadModel") &&
      !Class.ends_with("ForConditionalGeneration"))
    return;
  const TensorRecord *RefLogits = R.tensor(RR->Id, "output", 0);
  if (!RefLogits || RefLogits->Shape.size() < 2 || unitRoundoff(RefLogits->Type) == 0)
    return;
  int64_t Vocab = RefLogits->Shape.back();
  // Per step: its root's token ids, and the last call's output that has
  // the vocabulary's extent (an engine's logits processor after its model).
  std::map<int64_t, const TensorRecord *> Tokens, Logits;
  std::map<int64_t, std::string> LogitsBy;
  for (const ModuleCallRecord &M : T.Calls) {
    if (!M.ParentId && !Tokens.count(M.Step))
      if (const TensorRecord *X = tokenIds(T, M.Id))
        Tokens[M.Step] = X;
    const TensorRecord *Out = T.tensor(M.Id, "output", 0);
    if (Out && unitRoundoff(Out->Type) != 0 && !Out->Shape.empty() && Out->Shape.back() == Vocab) {
      Logits[M.Step] = Out;
      LogitsBy[M.Step] = M.Path.empty() ? "(root) " + M.ClassName : M.Path;
    }
  }
  auto ElementsOf = [](const TensorRecord *X) {
    int64_t N = 1;
    for (int64_t E : X->Shape)
      N *= E;
    return N;
  };
  for (const auto &[Step, Given] : Tokens) {
    // A decode step of one sequence: one token, fed back from the step
    // before (a prefill chunk's tokens are the prompt's).
    auto Before = Logits.find(Step - 1);
    if (Step < 2 || Before == Logits.end() || ElementsOf(Given) != 1)
      continue;
    // After a step of several tokens, one token may still be the prompt's
    // last, prefilled alone (a chunked prefill whose last chunk is one
    // token): there only the argmax of the row before the last, or of the
    // first, tells a departure (a sampler that read the wrong position; a
    // language model's rows predict prompt tokens, any row's may be it).
    auto Previous = Tokens.find(Step - 1);
    bool MaybePrompt = Previous != Tokens.end() && ElementsOf(Previous->second) > 1;
    auto Token = T.values(Given);
    auto Scores = T.values(Before->second);
    if (!Token || Token->size() != 1 || !Scores || Scores->size() < size_t(Vocab) ||
        Scores->size() % size_t(Vocab))
      continue;
    int64_t Rows = int64_t(Scores->size()) / Vocab;
    auto ArgmaxOf = [&](int64_t Row) {
      auto First = Scores->begin() + Row * Vocab;
      return int64_t(std::max_element(First, First + Vocab) - First);
    };
    int64_t Consumed = int64_t((*Token)[0]), Last = ArgmaxOf(Rows - 1);
    // A tie with the maximum is the argmax too.
    if (Consumed == Last || (Consumed >= 0 && Consumed < Vocab &&
                             (*Scores)[(Rows - 1) * Vocab + Consumed] ==
                                 (*Scores)[(Rows - 1) * Vocab + Last])) {
      ++D.SamplingChecked;
      continue;
    }
    SamplingDeparture S;
    S.Step = Step;
    S.Consumed = Consumed;
    S.Argmax = Last;
    S.Logits = LogitsBy[Step - 1];
    S.Rows = Rows;
    for (int64_t Row = Rows - 2; Row >= 0 && S.Row < 0; --Row)
      if (ArgmaxOf(Row) == Consumed)
        S.Row = Row;
    if (MaybePrompt && !(Rows >= 2 && (ArgmaxOf(Rows - 2) == Consumed || ArgmaxOf(0) == Consumed)))
      continue; // not checked: the prompt's token, as far as it shows
    ++D.SamplingChecked;
    D.Sampling.push_back(std::move(S));
  }
}

/// How two token sequences differ, in words: a token missing or extra at
/// the start (a BOS token), one sequence the other's beginning, or shifted.
static std::string tokensDiffer(ArrayRef<double> A, ArrayRef<double> B) {
  auto Id = [](double V) { return formatv("{0}", format("%g", V)).str(); };
  if (A.size() + 1 == B.size() && A == B.drop_front())
    return "the target lacks the reference's first token (id " + Id(B.front()) + ")";
  if (B.size() + 1 == A.size() && B == A.drop_front())
    return "the target has a first token the reference lacks (id " + Id(A.front()) + ")";
  if (A.size() < B.size() && A == B.take_front(A.size()))
    return "the target's tokens are the reference's first " + std::to_string(A.size()) +
           ": the reference has " + std::to_string(B.size() - A.size()) + " more after them";
  if (B.size() < A.size() && B == A.take_front(B.size()))
    return "the reference's tokens are the target's first " + std::to_string(B.size()) +
           ": the target has " + std::to_string(A.size() - B.size()) + " more after them";
  if (A.size() == B.size() && A.size() > 1 && A.drop_front() == B.drop_back())
    return "the target's tokens are the reference's shifted one position later";
  if (A.size() == B.size() && A.size() > 1 && A.drop_back() == B.drop_front())
    return "the target's tokens are the reference's shifted one position earlier";
  return "the token ids differ";
}

std::optional<std::vector<double>> Diagnoser::joinedIds(const TensorRecord *A, int64_t Call) {
  std::vector<double> Out;
  auto First = T.values(A);
  if (!First)
    return std::nullopt;
  Out = std::move(*First);
  if (auto Later = LaterSteps.find(Call); Later != LaterSteps.end())
    for (const ModuleCallRecord *M : Later->second)
      if (const TensorRecord *X = T.tensor(M->Id, A->Role, A->Index))
        if (auto V = T.values(X))
          Out.insert(Out.end(), V->begin(), V->end());
  return Out;
}

bool Diagnoser::checkInputs(Diagnosis &D) {
  const ModuleCallRecord *TR = firstRoot(T), *RR = firstRoot(R);
  if (!TR || !RR)
    return false;
  const TensorRecord *A = tokenIds(T, TR->Id), *B = tokenIds(R, RR->Id);
  if (!A || !B)
    return false;
  auto VA = targetValues(A, TR->Id, B->Shape), VB = R.values(B);
  // Steps whose tokens do not add up to the reference's: every step's ids,
  // in order, to say how they differ.
  if (!VA && MergeSteps)
    VA = joinedIds(A, TR->Id);
  if (!VA || !VB)
    return false;
  auto Diff = firstDifference(*VA, *VB);
  // The same ids, however laid out: [batch, seq] and the flattened tokens
  // of a serving engine are the same inputs.
  if (!Diff && VA->size() == VB->size())
    return false;
  size_t P = Diff.value_or(std::min(VA->size(), VB->size()));
  std::string Msg;
  raw_string_ostream OS(Msg);
  OS << "input " << A->Index << " of the root (" << (TR->Path.empty() ? TR->ClassName : TR->Path)
     << ") differs: ";
  auto Value = [](const std::vector<double> &V, size_t P) {
    return P < V.size() ? formatv("{0}", format("%g", V[P])).str() : std::string("(none)");
  };
  OS << tokensDiffer(*VA, *VB) << " (" << VA->size() << " tokens against " << VB->size()
     << ", shape " << shape(A->Shape) << " against " << shape(B->Shape)
     << "); first difference at position " << P << ": target " << Value(*VA, P)
     << ", reference " << Value(*VB, P);
  D.Result = Diagnosis::Verdict::InputsDiffer;
  D.InputsDifference = Msg;
  return true;
}

void Diagnoser::computeRatios(Diagnosis &D) {
  DenseMap<int64_t, unsigned> Depth;
  std::map<int64_t, int64_t> FirstRootOfStep;
  for (const ModuleCallRecord &M : T.Calls)
    if (!M.ParentId)
      FirstRootOfStep.try_emplace(M.Step, M.Id);
  // On a terminal only (lit and logs stay clean): comparing a large
  // model's captured tensors over many decode steps takes a while.
  ProgressBar Bar("comparing module calls", T.Calls.size(), "calls");
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
        // A call on its own after the step's forward that no reference
        // call matches: an engine's sampler, which a teacher-forced
        // reference does not run.
        if (!TC.ParentId && StringRef(TC.Path).starts_with("<") && FirstRootOfStep.count(TC.Step) &&
            FirstRootOfStep[TC.Step] != TC.Id)
          C.UnmappedReason = "called on its own after the step's forward (a sampler): the "
                             "reference has no counterpart; the tokens chosen are checked "
                             "against the logits instead (sampling)";
      }
    } else if (std::string Why = structureDiffers(TC, *RIt->second); !Why.empty()) {
      C.Mapped = false;
      C.UnmappedReason = Why;
    } else {
      pair(TC, *RIt->second, C);
    }
    if (const TensorRecord *Out = T.tensor(TC.Id, "output", 0))
      if (auto It = Chosen.find(Out->Id); It != Chosen.end()) {
        C.Transposed = It->second.Swap;
        C.LayoutBy = It->second.How;
      }
    if (auto Noise = O.CalibratedNoise.find(C.Path); Noise != O.CalibratedNoise.end()) {
      C.CalibratedNoise = Noise->second;
      C.Threshold = std::max(O.CalibratedFloor, O.CalibratedMargin * Noise->second);
    } else if (C.RuleNoise) {
      C.Threshold = O.Threshold * *C.RuleNoise;
    }
    // An R of few values is a noisy one (ComparedValues).
    if (const ModuleCallRecord *RC =
            C.Mapped && C.Ratio && !C.CalibratedNoise ? refCall(TC.Id) : nullptr)
      if (const TensorRecord *RO = R.tensor(RC->Id, "output", 0)) {
        C.ComparedValues = std::max<int64_t>(1, numElements(RO->Shape));
        double Spread = std::exp(3.09 / std::sqrt(double(C.ComparedValues)));
        if (Spread > C.Threshold.value_or(O.Threshold))
          C.Threshold = Spread;
      }
    if (MergeSteps && C.Mapped && !C.Ratio) {
      // Its outputs over the steps it ran do not make the reference's
      // tokens: say which steps it missed.
      std::set<int64_t> Ran = {TC.Step};
      if (auto Later = LaterSteps.find(TC.Id); Later != LaterSteps.end())
        for (const ModuleCallRecord *M : Later->second)
          Ran.insert(M->Step);
      std::vector<int64_t> Missed;
      for (int64_t S = 1; S <= D.MergedSteps; ++S)
        if (!Ran.count(S))
          Missed.push_back(S);
      if (!Missed.empty())
        C.UncomparedReason = "it ran in " + countOf(Ran.size(), "step") + " of " +
                             std::to_string(D.MergedSteps) + ", not in " +
                             (Missed.size() == 1 ? "step " : "steps ") + rangesOf(Missed);
    }
    if (C.Ratio)
      D.MaxRatio = std::max(D.MaxRatio, *C.Ratio);
    else
      ++D.Uncompared;
    D.Curve.push_back(std::move(C));
  }
  // The call around one noisier by design (the attention block around its
  // backend), where it is mapped, is noisier by as much as the inner call
  // was here (its output is the inner call's, projected), up to the rule's
  // noise: held to the threshold times the inner call's R. Calls further
  // out (the decoder layer, the root) add a residual to it and keep the
  // threshold.
  // By call id, for this and for localize (which takes D.Curve as is).
  CurveIndex.clear();
  for (size_t I = 0; I < D.Curve.size(); ++I)
    CurveIndex[D.Curve[I].CallId] = I;
  for (size_t I = 0; I < D.Curve.size(); ++I) {
    const ComponentRatio &Inner = D.Curve[I];
    if (!Inner.RuleNoise || !Inner.NoiseOwn || !Inner.Mapped || !Inner.Ratio)
      continue;
    const ModuleCallRecord *M = T.CallById.lookup(Inner.CallId);
    const ModuleCallRecord *Parent = M ? parentOf(T, *M) : nullptr;
    auto It = Parent ? CurveIndex.find(Parent->Id) : CurveIndex.end();
    if (It == CurveIndex.end() || !D.Curve[It->second].Mapped)
      continue;
    ComponentRatio &Outer = D.Curve[It->second];
    double Noise = std::min(*Inner.RuleNoise, std::max(1.0, *Inner.Ratio));
    if (Outer.CalibratedNoise || Outer.NoiseOwn || (Outer.RuleNoise && *Outer.RuleNoise >= Noise))
      continue;
    Outer.RuleNoise = Noise;
    Outer.NoiseFrom = "inside it: " + (Inner.Path.empty() ? std::string("(root)") : Inner.Path) +
                      " at R = " + formatv("{0}", format("%.3g", *Inner.Ratio)).str() + ", " +
                      Inner.NoiseFrom;
    Outer.Threshold = std::max(Outer.Threshold.value_or(0), O.Threshold * Noise);
  }
}

} // namespace detail

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
  return diagnose(TargetRanks, Ref,
                  ReferenceFP32 ? ArrayRef<TraceReader *>(FP32) : ArrayRef<TraceReader *>(),
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
Error loadReference(Side &S, ArrayRef<TraceReader *> Ranks, size_t TargetParallel, StringRef Flag) {
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
  // Reading a large trace's calls, ops and tensor statistics takes a while:
  // each side is a phase on a terminal.
  ProgressBar Phase("reading the target trace");
  auto Stages = rankStages(TargetRanks);
  if (!Stages)
    return Stages.takeError();
  if (Error E = loadColumn(T, TargetRanks, *Stages, 0))
    return E;
  Phase.restart("reading the reference trace");
  // Tensor-parallel ranks: the first is compared, the others lend their
  // shards — unless the reference is sharded alike (then shard meets shard).
  size_t Parallel = Stages->front().size();
  if (Error E = loadReference(R, ReferenceRanks, Parallel, "reference"))
    return E;
  if (ReferenceFP32) {
    Phase.restart("reading the FP32 reference");
    if (Error E = loadReference(F, FP32Ranks, Parallel, "FP32 reference"))
      return E;
  }
  if (Parallel > 1)
    Phase.restart("reading the other ranks");
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
  // Why not, where the trace says (a C++ LibTorch program's has none).
  auto NoCalls = [](StringRef Which, const TraceReader &Trace) {
    auto Why = Trace.meta().find("module_calls");
    return makeError("the " + Which + " trace '" + Trace.directory() + "' has no module calls" +
                     (Why != Trace.meta().end() ? " (" + Why->second + ")" : std::string()));
  };
  if (T.Calls.empty())
    return NoCalls("target", Target);
  if (R.Calls.empty())
    return NoCalls("reference", Reference);
  // A reference of one step per request (ekka.reference's) against a
  // target that served them in more steps: the reference's steps joined,
  // the target's rows put in request order.
  std::map<int64_t, std::vector<size_t>> RowOrders;
  auto StepsOf = [](const Side &S) {
    int64_t Max = 0;
    for (const ModuleCallRecord &M : S.Calls)
      Max = std::max(Max, M.Step);
    return Max;
  };
  // Only a reference that ekka.reference ran (--reference-model): an
  // ordinary multi-step reference (HF's generate) keeps its steps.
  auto RanByEkka = [](const TraceReader &Trace) {
    auto It = Trace.meta().find("command_line");
    return It != Trace.meta().end() && StringRef(It->second).contains("-m ekka.reference ");
  };
  if (int64_t RefSteps = StepsOf(R); RefSteps > 1 && RanByEkka(Reference)) {
    auto Requests = servedRequests(T, vocabOf(R));
    if (!Requests)
      return makeError("the reference ran " + Twine(RefSteps) + " requests, one a step, but " +
                       toString(Requests.takeError()));
    if (int64_t(Requests->size()) != RefSteps)
      return makeError("the reference ran " + Twine(RefSteps) + " requests, one a step, and the "
                       "target's trace shows " + Twine(Requests->size()));
    if (R.joinSteps() == 1 || (ReferenceFP32 && F.joinSteps() == 1))
      return makeError("the reference's requests did not run the same module calls: they "
                       "cannot be joined into one forward");
    RowOrders = requestRowOrders(*Requests);
  }
  Phase.finish();
  Diagnoser Run(T, R, ReferenceFP32 ? &F : nullptr, Options);
  Run.setRowOrders(std::move(RowOrders));
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
      llvm::none_of(D.Curve, [](const ComponentRatio &C) { return C.Ratio.has_value(); })) {
    std::string Why = "no target component could be compared with the reference: the module "
                      "paths differ (different models?) or nothing was captured; "
                      "--show-mapping lists the components";
    if (!Options.KeepUncomparable)
      return makeError(Why);
    D.NothingCompared = Why;
  }
  return D;
}

} // namespace ekka
