//===- CommandLine.cpp ----------------------------------------------------===//
#include "ekka/Support/CommandLine.h"
#include "ekka/Support/Error.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdlib>

using namespace llvm;

namespace ekka {

void parseCommandLineOrExit(int Argc, const char *const *Argv, StringRef Overview) {
  std::string Errors;
  raw_string_ostream ErrOS(Errors);
  if (cl::ParseCommandLineOptions(Argc, Argv, Overview, &ErrOS))
    return;
  // Some option errors LLVM prints itself; the rest are collected here.
  StringRef First = StringRef(Errors).trim().split('\n').first;
  if (!First.empty())
    errs() << First << "\n";
  std::exit(ExitInputError);
}

} // namespace ekka
