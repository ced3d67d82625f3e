//===- mapping_fuzzer.cpp - The mapping file and its calibrated noise -----===//
//
// Any bytes as a mapping file (--mapping): its rules and its calibrated
// noise are parsed; each is refused with an error or read whole. A rule
// read is then used as the mapper uses it, its pattern matched and
// substituted, so a rule the parser let through malformed shows.
//
//===----------------------------------------------------------------------===//
#include "ekka/Align/Mapping.h"

#include "llvm/Support/Error.h"

#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *Data, size_t Size) {
  llvm::StringRef Text(reinterpret_cast<const char *>(Data), Size);
  if (auto Rules = ekka::parseMappingRules(Text, "fuzz.json")) {
    for (const ekka::MappingRule &R : *Rules) {
      auto Stars = ekka::matchPath(R.Target, "model.layers.0.self_attn.qkv_proj");
      for (const std::string &Reference : R.Reference)
        (void)ekka::substitute(Reference, Stars ? *Stars : std::vector<std::string>());
    }
  } else {
    llvm::consumeError(Rules.takeError());
  }
  if (auto Noise = ekka::parseCalibratedNoise(Text, "fuzz.json"); !Noise)
    llvm::consumeError(Noise.takeError());
  return 0;
}
