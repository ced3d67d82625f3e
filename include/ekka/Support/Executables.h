//===- Executables.h - What an executable links ----------------*- C++ -*-===//
#ifndef EKKA_SUPPORT_EXECUTABLES_H
#define EKKA_SUPPORT_EXECUTABLES_H

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringRef.h"

#include <string>
#include <vector>

namespace ekka {

/// The shared libraries a 64-bit little-endian ELF executable names
/// (DT_NEEDED); empty for anything else (a script, an unreadable file).
std::vector<std::string> neededLibraries(llvm::StringRef Path);

/// The program interpreter (PT_INTERP: the dynamic loader) that starts
/// the dynamically linked executable \p Path; empty for anything else (a
/// static executable, a script, an unreadable file).
std::string programInterpreter(llvm::StringRef Path);

/// Whether \p Program is an executable that links LibTorch itself: a C++
/// program, which has no Python shim (ekka-trace preloads the runtime into
/// it, and the runtime traces it from its start).
bool linksLibTorch(llvm::StringRef Program);

/// Whether \p Program links LibTorch itself or through the libraries it
/// needs (an engine's own, which links it), theirs, and so on. \p Resolve
/// gives the file a needed name is loaded from; a name it gives no file for
/// is not followed.
bool reachesLibTorch(llvm::StringRef Program,
                     llvm::function_ref<std::string(llvm::StringRef Needed)> Resolve);

} // namespace ekka

#endif
