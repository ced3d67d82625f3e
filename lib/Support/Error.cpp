//===- Error.cpp ----------------------------------------------------------===//
#include "ekka/Support/Error.h"

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
    errs() << Tool << ": error: " << Info.message() << "\n";
  });
  errs().flush();
  outs().flush();
  std::exit(ExitInputError);
}

} // namespace ekka
