//===- Executables.h - What an executable links ----------------*- C++ -*-===//
#ifndef EKKA_SUPPORT_EXECUTABLES_H
#define EKKA_SUPPORT_EXECUTABLES_H

#include "llvm/ADT/StringRef.h"

#include <string>
#include <vector>

namespace ekka {

/// The shared libraries a 64-bit little-endian ELF executable names
/// (DT_NEEDED); empty for anything else (a script, an unreadable file).
std::vector<std::string> neededLibraries(llvm::StringRef Path);

/// Whether \p Program is an executable that links LibTorch itself: a C++
/// program, which has no Python shim (ekka-trace preloads the runtime into
/// it, and the runtime traces it from its start).
bool linksLibTorch(llvm::StringRef Program);

} // namespace ekka

#endif
