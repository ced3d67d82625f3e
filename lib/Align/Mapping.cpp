//===- Mapping.cpp - Mapping files and the built-in recipes ---------------===//
#include "ekka/Align/Mapping.h"
#include "ekka/Support/Error.h"
#include "ekka/Support/JSON.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/GlobPattern.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cmath>

using namespace llvm;

namespace ekka {

/// \p Path with its numeric segments as `*`, and those numbers in order.
std::pair<std::string, std::vector<std::string>> starred(StringRef Path) {
  SmallVector<StringRef, 8> Segments;
  Path.split(Segments, '.');
  std::string Out;
  std::vector<std::string> Numbers;
  for (size_t I = 0; I < Segments.size(); ++I) {
    StringRef S = Segments[I];
    if (I)
      Out += '.';
    bool Numeric = !S.empty() && llvm::all_of(S, [](char C) { return C >= '0' && C <= '9'; });
    if (Numeric)
      Numbers.push_back(S.str());
    Out += Numeric ? StringRef("*") : S;
  }
  return {Out, Numbers};
}

Expected<std::vector<MappingRule>> readMappingFile(StringRef Path) {
  auto Buffer = MemoryBuffer::getFile(Path);
  if (!Buffer)
    return makeError("cannot read mapping file '" + Path + "': " + Buffer.getError().message());
  return parseMappingRules((*Buffer)->getBuffer(), ("mapping file '" + Path + "'").str());
}

Expected<CalibratedNoise> readCalibratedNoise(StringRef Path) {
  auto Buffer = MemoryBuffer::getFile(Path);
  if (!Buffer)
    return makeError("cannot read mapping file '" + Path + "': " + Buffer.getError().message());
  return parseCalibratedNoise((*Buffer)->getBuffer(), ("mapping file '" + Path + "'").str());
}

Expected<CalibratedNoise> parseCalibratedNoise(StringRef Text, StringRef Name) {
  auto Bad = [&](const Twine &Why) { return makeError(Name + ": " + Why); };
  Expected<json::Value> V = parseJSON(Text);
  if (!V)
    return Bad("not JSON (" + toString(V.takeError()) + ")");
  CalibratedNoise Out;
  const json::Object *O = V->getAsObject();
  const json::Value *Noise = O ? O->get("noise") : nullptr;
  if (!Noise)
    return Out;
  if (const json::Value *FP32 = O->get("noise_against_fp32")) {
    Out.AgainstFP32 = FP32->getAsBoolean();
    if (!Out.AgainstFP32)
      return Bad("\"noise_against_fp32\" must be true or false");
  }
  const json::Object *ByPath = Noise->getAsObject();
  if (!ByPath)
    return Bad("\"noise\" must map component paths to ratios");
  for (const auto &[Path, Ratio] : *ByPath) {
    std::optional<double> R = Ratio.getAsNumber();
    if (!R || !(*R >= 0) || !std::isfinite(*R))
      return Bad("\"noise\" of '" + Path.str() + "' must be a ratio (a finite number >= 0)");
    Out.ByPath[Path.str()] = *R;
  }
  return Out;
}

/// The one-segment stars of a pattern.
static size_t starCount(StringRef Pattern) {
  SmallVector<StringRef, 8> Segments;
  Pattern.split(Segments, '.');
  return llvm::count(Segments, "*");
}

/// Why a reference's `{...}` is not one of the call-relative paths, if it
/// is not: `{parent}`, `{grandparent}` or `{next}`, at its start.
static std::optional<std::string> badPlaceholder(StringRef Reference) {
  size_t Open = Reference.find('{');
  if (Open == StringRef::npos)
    return std::nullopt;
  for (StringRef Known : {"{parent}", "{grandparent}", "{next}"})
    if (Reference.starts_with(Known)) {
      StringRef Rest = Reference.drop_front(Known.size());
      if (Rest.contains('{'))
        return std::string("only one '{...}', at its start");
      if (Known == "{next}" ? !(Rest.empty() || Rest == ":input" || Rest == ":output")
                            : !(Rest.empty() || Rest.starts_with(".") || Rest.starts_with(":")))
        return std::string("'") + Known.str() + "' must be followed by " +
               (Known == "{next}" ? "nothing or ':input'" : "'.' and a path");
      return std::nullopt;
    }
  return std::string("'{...}' must be {parent}, {grandparent} or {next}, at its start");
}

Expected<std::vector<MappingRule>> parseMappingRules(StringRef Text, StringRef Name) {
  auto Bad = [&](const Twine &Why) { return makeError(Name + ": " + Why); };
  Expected<json::Value> V = parseJSON(Text);
  if (!V)
    return Bad("not JSON (" + toString(V.takeError()) + ")");
  const json::Object *O = V->getAsObject();
  const json::Array *Rules = O ? O->getArray("components") : nullptr;
  if (!Rules)
    return Bad("expected {\"components\": [...]}");
  // A knowledge base written by --calibrate says so.
  bool Calibrated = O->get("calibrated") != nullptr;
  std::vector<MappingRule> Out;
  for (size_t I = 0; I < Rules->size(); ++I) {
    const json::Object *R = (*Rules)[I].getAsObject();
    if (!R)
      return Bad("component " + Twine(I) + " is not an object");
    // "target": one component, or several that together make the one
    // reference component (many-to-one).
    std::vector<std::string> Targets;
    if (auto One = R->getString("target")) {
      Targets.push_back(One->str());
    } else if (const json::Array *Many = R->getArray("target")) {
      for (const json::Value &X : *Many) {
        auto S = X.getAsString();
        if (!S)
          return Bad("component " + Twine(I) + ": \"target\" must hold strings");
        Targets.push_back(S->str());
      }
    }
    // "class": the target's class names (globs), wherever it stands.
    std::vector<std::string> Classes;
    if (const json::Value *Class = R->get("class")) {
      if (auto One = Class->getAsString()) {
        Classes.push_back(One->str());
      } else if (const json::Array *Many = Class->getAsArray()) {
        for (const json::Value &X : *Many)
          if (auto S = X.getAsString())
            Classes.push_back(S->str());
          else
            return Bad("component " + Twine(I) + ": \"class\" must hold strings");
      }
      if (Classes.empty() || llvm::is_contained(Classes, ""))
        return Bad("component " + Twine(I) + ": \"class\" must name a class or several");
      for (const std::string &C : Classes)
        if (auto G = GlobPattern::create(C); !G)
          return Bad("component " + Twine(I) + ": \"class\" '" + C +
                     "' is not a pattern (" + toString(G.takeError()) + ")");
    }
    if (Targets.empty() && !Classes.empty())
      Targets.push_back("**"); // a class's calls wherever they stand
    if (Targets.empty())
      return Bad("component " + Twine(I) + " has no \"target\" string or \"class\"");
    MappingRule Rule;
    Rule.Target = Targets.front();
    Rule.Classes = Classes;
    if (Calibrated)
      Rule.Source = "calibration";
    std::string Where = ("component " + Twine(I) + " (" +
                         (Classes.empty() ? join(Targets, ", ") : "class " + join(Classes, ", ")) +
                         ")")
                            .str();
    if (const json::Value *Ref = R->get("reference")) {
      if (auto One = Ref->getAsString()) {
        Rule.Reference.push_back(One->str());
      } else if (const json::Array *Many = Ref->getAsArray()) {
        for (const json::Value &X : *Many) {
          auto S = X.getAsString();
          if (!S)
            return Bad(Where + ": \"reference\" must hold strings");
          Rule.Reference.push_back(S->str());
        }
      }
    }
    if (Rule.Reference.empty())
      return Bad(Where + " has no \"reference\"");
    if (const json::Value *Dim = R->get("concat_dim")) {
      auto D = Dim->getAsInteger();
      if (!D)
        return Bad(Where + ": \"concat_dim\" must be an integer");
      Rule.ConcatDim = int(*D);
    }
    // "transpose": [i, j], the target output's layout where the shapes
    // leave it open (null: none).
    if (const json::Value *Swap = R->get("transpose"); Swap && !Swap->getAsNull()) {
      const json::Array *A = Swap->getAsArray();
      std::optional<int64_t> I, J;
      if (A && A->size() == 2) {
        I = (*A)[0].getAsInteger();
        J = (*A)[1].getAsInteger();
      }
      if (!I || !J || *I < 0 || *J <= *I)
        return Bad(Where + ": \"transpose\" must be two dimensions [i, j], 0 <= i < j");
      if (Targets.size() != 1 || Rule.Reference.size() != 1)
        return Bad(Where + ": \"transpose\" applies to a one-to-one mapping only");
      Rule.Transpose = std::make_pair(int(*I), int(*J));
    }
    // "noise": how many times the threshold the component is held to, for
    // a computation noisier than the reference's by design (null: none).
    if (const json::Value *Noise = R->get("noise"); Noise && !Noise->getAsNull()) {
      std::optional<double> N = Noise->getAsNumber();
      if (!N || !std::isfinite(*N) || *N < 1)
        return Bad(Where + ": \"noise\" must be a number of at least 1 (times the threshold)");
      Rule.Noise = *N;
    }
    // Every star of a reference stands for one of each target's; `**`
    // (any leading segments) stands for none.
    for (const std::string &T : Targets) {
      if (StringRef(T).contains("**") && !(T == "**" || (StringRef(T).starts_with("**.") &&
                                                        !StringRef(T).drop_front(3).contains("**"))))
        return Bad(Where + ": '**' may only begin a target ('**.qkv_proj'), in '" + T + "'");
      size_t Stars = starCount(T);
      for (const std::string &P : Rule.Reference) {
        if (starCount(P) > Stars)
          return Bad(Where + ": reference '" + P + "' has more '*' than the target '" + T + "'");
        if (auto Why = badPlaceholder(P))
          return Bad(Where + ": reference '" + P + "': " + *Why);
        if (Targets.size() > 1 && StringRef(P).contains('{'))
          return Bad(Where + ": a many-to-one rule's reference is a path, without '{...}'");
      }
    }
    if (Targets.size() == 1) {
      Out.push_back(std::move(Rule));
      continue;
    }
    if (Rule.Reference.size() != 1)
      return Bad(Where + ": several targets need one reference (many-to-one); map them one by "
                         "one otherwise");
    for (size_t K = 0; K < Targets.size(); ++K) {
      MappingRule Part = Rule;
      Part.Target = Targets[K];
      Part.Parts = Targets;
      Part.Part = int(K);
      Out.push_back(std::move(Part));
    }
  }
  return Out;
}

// The knowledge base, version 3: serving engines' layers against
// HuggingFace Transformers' modules. Rules about vLLM's classes (SGLang's
// layers library shares their names) come first: they hold wherever a
// model puts the layer, their reference relative to the call. Then rules
// about vLLM's attribute names, for engines of their own that follow its
// naming with classes of their own (a plain Linear as `qkv_proj`). Of two
// rules for one target, the first that applies is taken.
//
// - QKVParallelLinear and MergedColumnParallelLinear compute HF's separate
//   projections, concatenated along the features.
// - LogitsProcessor computes the model's final logits (the head, then
//   Gemma's soft-cap, Cohere's or Granite's scale), which HF computes in
//   its ForCausalLM's forward after `lm_head`: the root's logits where the
//   root returns them, `lm_head`'s otherwise (a rule onto the root applies
//   only where the root is HF's *ForCausalLM or *ForConditionalGeneration
//   and its first output has the target's features).
// - A vLLM *ForCausalLM root returns the hidden states (vLLM computes the
//   logits in compute_logits, after it): HF's base model's output, where
//   the features say so.
// - An activation that takes gate and up together (SiluAndMul, GeluAndMul,
//   every *AndMul) returns what the next module is given (down_proj, by
//   whatever name); it applies only where the structure says HF's module
//   at its path, if any, is another computation.
// - The attention backend (vLLM's `Attention`, SGLang's RadixAttention:
//   by qualified name, as an engine's own `Attention` is often the whole
//   attention block) returns what the output projection after it is given.
//   It is held to twice the threshold ("noise": 2): it is a kernel of the
//   engine's own (paged, in blocks), not the one HF calls, and rounds
//   differently. vLLM's CPU kernel on a machine without AMX (AVX2, its
//   "vec" path) departs from the FP32 reference 1.4 to 1.6 times as far
//   as HF's in bf16 on the real-vLLM suite's clean pairs (1.9 in one
//   decode step), in every head and growing with the tokens attended;
//   the planted bugs there depart 9.6 times or more (docs/RealVLLM.md).
static const char *RecipesV3 = R"json({"components": [
  {"class": "QKVParallelLinear",
   "reference": ["{parent}.q_proj", "{parent}.k_proj", "{parent}.v_proj"], "concat_dim": -1},
  {"class": "MergedColumnParallelLinear",
   "reference": ["{parent}.gate_proj", "{parent}.up_proj"], "concat_dim": -1},
  {"class": "LogitsProcessor", "reference": ""},
  {"class": "LogitsProcessor", "reference": "lm_head"},
  {"class": ["*ForCausalLM", "*ForConditionalGeneration"], "target": "", "reference": "model"},
  {"class": "*AndMul", "reference": "{next}:input"},
  {"class": ["vllm.*.Attention", "sglang.*.RadixAttention"], "reference": "{next}:input",
   "noise": 2},
  {"target": "**.qkv_proj",
   "reference": ["{parent}.q_proj", "{parent}.k_proj", "{parent}.v_proj"], "concat_dim": -1},
  {"target": "**.gate_up_proj", "reference": ["{parent}.gate_proj", "{parent}.up_proj"],
   "concat_dim": -1},
  {"target": "**.attn", "reference": "{next}:input"}
]})json";

const std::vector<MappingRule> &builtinRecipes() {
  static const std::vector<MappingRule> Rules = [] {
    auto R = parseMappingRules(RecipesV3, "built-in recipes");
    if (!R) {
      consumeError(R.takeError()); // a test guards the text
      return std::vector<MappingRule>();
    }
    for (MappingRule &Rule : *R)
      Rule.Source = "recipe vllm-hf 3";
    return std::move(*R);
  }();
  return Rules;
}

std::pair<std::string, std::string> referenceRole(StringRef Reference) {
  auto [Path, Role] = Reference.rsplit(':');
  if (Role == Reference || (Role != "input" && Role != "output"))
    return {Reference.str(), "output"};
  return {Path.str(), Role.str()};
}

/// Matches \p Path against \p Pattern (`*` = one dot-free segment); the
/// segments the stars took, or none.
std::optional<std::vector<std::string>> matchPath(StringRef Pattern, StringRef Path) {
  if (Pattern == "**")
    return std::vector<std::string>();
  SmallVector<StringRef, 8> P, X;
  Pattern.split(P, '.');
  Path.split(X, '.');
  // `**.rest`: rest matches the path's last segments (all of them, or a
  // tail after a dot).
  size_t Skip = 0;
  if (P.front() == "**") {
    P.erase(P.begin());
    if (X.size() < P.size() || (X.size() == P.size() && Path.empty()))
      return std::nullopt;
    Skip = X.size() - P.size();
  }
  if (P.size() + Skip != X.size())
    return std::nullopt;
  X.erase(X.begin(), X.begin() + Skip);
  std::vector<std::string> Stars;
  for (size_t I = 0; I < P.size(); ++I) {
    if (P[I] == "*")
      Stars.push_back(X[I].str());
    else if (P[I] != X[I])
      return std::nullopt;
  }
  return Stars;
}

bool classMatches(const std::vector<std::string> &Classes, StringRef Name, StringRef Qualname) {
  return llvm::any_of(Classes, [&](const std::string &Glob) {
    auto Pattern = GlobPattern::create(Glob);
    if (!Pattern) {
      consumeError(Pattern.takeError());
      return false;
    }
    return Pattern->match(StringRef(Glob).contains('.') ? Qualname : Name);
  });
}

std::string substitute(StringRef Pattern, const std::vector<std::string> &Stars) {
  SmallVector<StringRef, 8> P;
  Pattern.split(P, '.');
  std::string Out;
  size_t Star = 0;
  for (size_t I = 0; I < P.size(); ++I) {
    if (I)
      Out += '.';
    Out += P[I] == "*" && Star < Stars.size() ? Stars[Star++] : P[I].str();
  }
  return Out;
}

} // namespace ekka
