//===- Mapping.h - Which target component means which reference one -*- C++ -*-===//
//
// The sources of a component mapping, before pairing by module path: a
// user's mapping file and the built-in, versioned knowledge base of recipes
// for serving engines' naming (docs/Diagnose.md, "Mapping").
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_ALIGN_MAPPING_H
#define EKKA_ALIGN_MAPPING_H

#include "llvm/Support/Error.h"

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ekka {

/// A user's mapping of one target component onto reference components, for
/// code that names or fuses modules differently (docs/Diagnose.md):
///   {"target": "model.layers.*.self_attn.qkv_proj",
///    "reference": ["model.layers.*.self_attn.q_proj", "...k_proj", "...v_proj"],
///    "concat_dim": -1}
/// `*` stands for one path segment and takes the same value on both sides;
/// a target may begin with `**.` (any leading segments).
/// Several reference components are concatenated along `concat_dim`.
///
/// A rule may name the target's class instead of, or besides, its path:
///   {"class": "SiluAndMul", "reference": "{next}:input"}
/// applies to every call of that class, wherever the model puts it. A
/// class is a glob (`*AndMul`); one with a dot is matched against the
/// module's qualified name (`vllm.*.Attention`). A reference may begin with
/// a path relative to the call: `{parent}` (its path less the last
/// segment), `{grandparent}`, or `{next}`, the next call under the same
/// parent (the module given its output).
struct MappingRule {
  std::string Target; ///< A path pattern; "**" where only the class says.
  std::vector<std::string> Classes;
  std::vector<std::string> Reference;
  int ConcatDim = -1;
  /// Many-to-one: the target components that together make the one
  /// reference component, in order along ConcatDim (separate q, k and v
  /// projections against a fused `qkv_proj`); this rule's target is
  /// Parts[Part]. The reference's output is split by the parts' sizes:
  ///   {"target": ["...q_proj", "...k_proj", "...v_proj"],
  ///    "reference": "...qkv_proj", "concat_dim": -1}
  /// is read as one such rule per target part.
  std::vector<std::string> Parts;
  int Part = -1;
  /// The target output's layout where the shapes leave it open (equal
  /// extents: [T, H, D] against [H, T, D] with T == H): the two dimensions
  /// of the target's tensor, leading ones squeezed, to swap. `"transpose":
  /// [0, 1]`; --calibrate writes what the bounded search validated.
  std::optional<std::pair<int, int>> Transpose;
  /// A computation noisier than the reference's by design (an engine's
  /// attention kernel against HF's): it departs above this many times the
  /// threshold, and the call directly around it above the threshold times
  /// its R, up to as many. `"noise": 2`; at least 1.
  std::optional<double> Noise;
  /// Where the rule comes from: the user's file, or a built-in recipe
  /// ("recipe vllm-hf 1"). A recipe whose reference components did not run
  /// does not apply (the call is mapped by path); a user's rule then leaves
  /// the call unmapped.
  std::string Source = "mapping file";
};

/// Reads a mapping file: {"components": [rule, ...]}.
llvm::Expected<std::vector<MappingRule>> readMappingFile(llvm::StringRef Path);
/// Parses mapping rules from JSON text; \p Name names it in errors.
llvm::Expected<std::vector<MappingRule>> parseMappingRules(llvm::StringRef Text,
                                                           llvm::StringRef Name);

/// A calibration's noise (`--calibrate` writes it beside its rules): each
/// component's largest R on the known-good pair, by module path,
/// {"noise": {"model.layers.1.mlp.down_proj": 1.02, ...}}, and whether it
/// was measured against an FP32 reference ("noise_against_fp32"; R means
/// something else without one). Empty for a mapping file without.
struct CalibratedNoise {
  std::map<std::string, double> ByPath;
  std::optional<bool> AgainstFP32; ///< None where the file does not say.
};
llvm::Expected<CalibratedNoise> readCalibratedNoise(llvm::StringRef Path);
llvm::Expected<CalibratedNoise> parseCalibratedNoise(llvm::StringRef Text, llvm::StringRef Name);

/// The built-in knowledge base: recipes that map serving engines' layers
/// (vLLM's and SGLang's classes: fused QKV, merged gate/up, the logits
/// processor, the attention backend; then vLLM's attribute names, for
/// engines of their own) onto HuggingFace Transformers' modules.
/// Versioned; tried after the user's rules.
const std::vector<MappingRule> &builtinRecipes();

/// A rule's reference component and the tensor it means: `path` (its
/// first output) or `path:input` (its first floating input; an engine's
/// attention backend returns what HF's `o_proj` is given).
std::pair<std::string, std::string> referenceRole(llvm::StringRef Reference);

/// Matches \p Path against \p Pattern (`*` = one dot-free segment, a
/// leading `**` any number of them); the segments the stars took, or none.
std::optional<std::vector<std::string>> matchPath(llvm::StringRef Pattern, llvm::StringRef Path);

/// Whether a call of class \p Name (qualified: \p Qualname) is one of
/// \p Classes (globs; one with a dot meets the qualified name).
bool classMatches(const std::vector<std::string> &Classes, llvm::StringRef Name,
                  llvm::StringRef Qualname);

/// \p Pattern with its stars replaced by \p Stars, in order.
std::string substitute(llvm::StringRef Pattern, const std::vector<std::string> &Stars);

/// \p Path with its numeric segments (layer numbers) as `*`, and those
/// numbers in order.
std::pair<std::string, std::vector<std::string>> starred(llvm::StringRef Path);

} // namespace ekka

#endif
