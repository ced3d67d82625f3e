//===- Plural.h - "1 module call", "3 module calls" -------------*- C++ -*-===//
#ifndef EKKA_SUPPORT_PLURAL_H
#define EKKA_SUPPORT_PLURAL_H

#include "llvm/ADT/ArrayRef.h"
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

/// Ascending numbers as ranges, as a summary says them: "2-5", "1, 4",
/// "2, 4-6".
inline std::string rangesOf(llvm::ArrayRef<int64_t> Numbers) {
  std::string Out;
  for (size_t I = 0; I < Numbers.size();) {
    size_t J = I;
    while (J + 1 < Numbers.size() && Numbers[J + 1] == Numbers[J] + 1)
      ++J;
    // Appended piece by piece: GCC 12 takes `"-" + std::to_string(...)`,
    // inlined here, for an overlapping memcpy (a -Wrestrict false
    // positive, GCC bug 105329) and says so in every file that includes it.
    if (!Out.empty())
      Out += ", ";
    Out += std::to_string(Numbers[I]);
    if (J > I) {
      Out += '-';
      Out += std::to_string(Numbers[J]);
    }
    I = J + 1;
  }
  return Out;
}

} // namespace ekka

#endif
