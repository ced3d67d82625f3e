//===- SubclassResolver.h - Link classes to their base classes -*- C++ -*-===//
#ifndef EKKA_INDEX_SUBCLASSRESOLVER_H
#define EKKA_INDEX_SUBCLASSRESOLVER_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ekka {

/// A class as the resolver sees it.
struct ClassInfo {
  int64_t Id = 0;
  int64_t FileId = 0;
  std::string Name;
  std::string QualifiedName;
  std::string Module;   ///< Python module of the file; empty for C++.
  bool IsPython = true;
  std::vector<std::string> Bases;
};

/// "Sub derives from Base", and which evidence said so.
struct SubclassLink {
  int64_t BaseId = 0;
  int64_t SubId = 0;
  std::string BaseText; ///< The base as written in Sub.
  std::string How;      ///< same-file | import | qualified | unique-name
};

/// Per file: the names its imports bind (alias -> dotted target).
using ImportTable = llvm::DenseMap<int64_t, llvm::StringMap<std::string>>;

/// Resolves each base of each class to an indexed class, when the evidence is
/// unambiguous, trying in order: a class of that name at the top of the same
/// file (Python); what an import binds the name to, matched by qualified name
/// (`nn.Module` with `from torch import nn` -> `torch.nn.Module`); the exact
/// qualified name (C++, where Clang resolved it); a name that only one class
/// in the index has (re-exports, star imports). Bases that resolve to nothing
/// (library classes outside the index, or ambiguous names) get no link:
/// a guessed link would send a diagnosis to the wrong source.
std::vector<SubclassLink> resolveSubclasses(llvm::ArrayRef<ClassInfo> Classes,
                                            const ImportTable &Imports);

} // namespace ekka

#endif
