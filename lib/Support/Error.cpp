//===- Error.cpp ----------------------------------------------------------===//
#include "ekka/Support/Error.h"
#include "ekka/Support/Printable.h"

#include "llvm/Support/raw_ostream.h"

#include <cstdlib>

using namespace llvm;

namespace ekka {

Error makeError(const Twine &Message) {
  return createStringError(inconvertibleErrorCode(), Message);
}

void exitWithError(StringRef Tool, Error E) {
  errs().flush();
  handleAllErrors(std::move(E), [&](const ErrorInfoBase &Info) {
    // A message names what the user gave, and what a trace or a repository
    // holds (a shard's name): escaped, so that it acts on no terminal and
    // stays one line.
    errs() << Tool << ": error: " << printable(Info.message()) << "\n";
  });
  errs().flush();
  outs().flush();
  std::exit(ExitInputError);
}

} // namespace ekka
