//===- Plural.h - "1 module call", "3 module calls" -------------*- C++ -*-===//
#ifndef EKKA_SUPPORT_PLURAL_H
#define EKKA_SUPPORT_PLURAL_H

#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <string>

namespace ekka {

/// \p N and \p Noun, as a summary counts: "1 module call", "0 module calls",
/// "3 module calls". \p Plural where an "s" does not make it ("processes",
/// "tensors'").
inline std::string countOf(uint64_t N, llvm::StringRef Noun, llvm::StringRef Plural = "") {
  std::string Out = std::to_string(N) + " ";
  if (N == 1)
    return Out + Noun.str();
  return Plural.empty() ? Out + Noun.str() + "s" : Out + Plural.str();
}

} // namespace ekka

#endif
