//===- Mapping.cpp - Mapping files and the built-in recipes ---------------===//
#include "ekka/Align/Mapping.h"
#include "ekka/Support/Error.h"
#include "ekka/Support/JSON.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"
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
    if (Targets.empty())
      return Bad("component " + Twine(I) + " has no \"target\" string");
    MappingRule Rule;
    Rule.Target = Targets.front();
    if (Calibrated)
      Rule.Source = "calibration";
    std::string Where = ("component " + Twine(I) + " (" + join(Targets, ", ") + ")").str();
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
    // Every star of a reference stands for one of each target's.
    for (const std::string &T : Targets) {
      size_t Stars = StringRef(T).count('*');
      for (const std::string &P : Rule.Reference)
        if (StringRef(P).count('*') > Stars)
          return Bad(Where + ": reference '" + P + "' has more '*' than the target '" + T + "'");
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

// The knowledge base, version 1: serving engines' names (vLLM's and
// SGLang's model code share them) against HuggingFace Transformers'. Of two
// rules for one target, the first that applies is taken. The logits
// processor computes the model's final logits (the head, then Gemma's
// soft-cap, Cohere's or Granite's scale), which HF computes in its
// ForCausalLM's forward after `lm_head`: the root's logits where the root
// returns them, `lm_head`'s otherwise (a recipe onto the root applies only
// where the root is HF's *ForCausalLM or *ForConditionalGeneration and its
// first output has the target's features). An engine's root returns the
// hidden states (vLLM computes the logits in compute_logits, after it):
// HF's base model's output, where the features say so. An engine's act_fn
// that takes gate and up together (SiluAndMul, GeluAndMul) returns what
// HF's down_proj is given (act_fn(gate) * up); it applies only where the
// structure says HF's act_fn is another computation. vLLM's fused MoE
// calls the MoE block's router from inside (`mlp.experts.gate`): HF's
// `mlp.gate`.
static const char *RecipesV1 = R"json({"components": [
  {"target": "model.layers.*.self_attn.qkv_proj",
   "reference": ["model.layers.*.self_attn.q_proj", "model.layers.*.self_attn.k_proj",
                 "model.layers.*.self_attn.v_proj"], "concat_dim": -1},
  {"target": "model.layers.*.mlp.gate_up_proj",
   "reference": ["model.layers.*.mlp.gate_proj", "model.layers.*.mlp.up_proj"],
   "concat_dim": -1},
  {"target": "model.layers.*.mlp.shared_expert.gate_up_proj",
   "reference": ["model.layers.*.mlp.shared_expert.gate_proj",
                 "model.layers.*.mlp.shared_expert.up_proj"], "concat_dim": -1},
  {"target": "logits_processor", "reference": ""},
  {"target": "logits_processor", "reference": "lm_head"},
  {"target": "", "reference": "model"},
  {"target": "model.layers.*.mlp.experts.gate", "reference": "model.layers.*.mlp.gate"},
  {"target": "model.layers.*.mlp.act_fn", "reference": "model.layers.*.mlp.down_proj:input"},
  {"target": "model.layers.*.self_attn.attn", "reference": "model.layers.*.self_attn.o_proj:input"}
]})json";

const std::vector<MappingRule> &builtinRecipes() {
  static const std::vector<MappingRule> Rules = [] {
    auto R = parseMappingRules(RecipesV1, "built-in recipes");
    if (!R) {
      consumeError(R.takeError()); // a test guards the text
      return std::vector<MappingRule>();
    }
    for (MappingRule &Rule : *R)
      Rule.Source = "recipe vllm-hf 1";
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
  SmallVector<StringRef, 8> P, X;
  Pattern.split(P, '.');
  Path.split(X, '.');
  if (P.size() != X.size())
    return std::nullopt;
  std::vector<std::string> Stars;
  for (size_t I = 0; I < P.size(); ++I) {
    if (P[I] == "*")
      Stars.push_back(X[I].str());
    else if (P[I] != X[I])
      return std::nullopt;
  }
  return Stars;
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
