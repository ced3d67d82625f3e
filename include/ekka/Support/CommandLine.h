//===- CommandLine.h - llvm::cl parsing with Ekka's error contract -*- C++ -*-===//
#ifndef EKKA_SUPPORT_COMMANDLINE_H
#define EKKA_SUPPORT_COMMANDLINE_H

#include "llvm/ADT/StringRef.h"

namespace ekka {

/// Parses the command line with llvm::cl. On a usage error prints one line,
/// "TOOL: error: " and the first error LLVM gives (those it prints itself,
/// on a value its parser refuses, too), and exits with ExitInputError; every
/// Ekka tool's contract for a wrong flag.
void parseCommandLineOrExit(int Argc, const char *const *Argv, llvm::StringRef Overview);

} // namespace ekka

#endif
