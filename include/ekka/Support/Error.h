//===- Error.h - Errors as values, and how tools report them ---*- C++ -*-===//
//
// Libraries return llvm::Error / llvm::Expected with a message that names the
// file or record and what was expected. Tools turn them into one line on
// stderr and exit code 2 (usage or input error), the contract that lit suites
// and scripts rely on.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_SUPPORT_ERROR_H
#define EKKA_SUPPORT_ERROR_H

#include "llvm/ADT/StringRef.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/Error.h"

namespace ekka {

/// Exit codes shared by every Ekka tool.
enum ExitCode : int {
  ExitSuccess = 0,    ///< Nothing found / the command did what was asked.
  ExitFinding = 1,    ///< A divergence (or a failed query) was found.
  ExitInputError = 2, ///< Usage error or bad input: one line on stderr says which.
};

/// An error carrying \p Message, for the library boundary.
llvm::Error makeError(const llvm::Twine &Message);

/// Prints "TOOL: error: MESSAGE" for each error in \p E, the message
/// escaped as printable() does, and exits with ExitInputError. For tools
/// only; libraries return errors.
[[noreturn]] void exitWithError(llvm::StringRef Tool, llvm::Error E);

/// Unwraps \p V or exits as exitWithError does.
template <typename T> T unwrapOrExit(llvm::StringRef Tool, llvm::Expected<T> V) {
  if (!V)
    exitWithError(Tool, V.takeError());
  return std::move(*V);
}

} // namespace ekka

#endif
