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
/// (`nn.Module` with `from torch import nn` -> `torch.nn.Module`) and followed
/// through re-exports (a package's `__init__` importing the class from a
/// submodule); the exact qualified name (C++, where Clang resolved it); a name
/// that only one class in the index has (star imports, re-exports the
/// imports do not show). A name bound by an import of a package that is not
/// in the index (`torch` when only transformers is indexed) never falls back
/// to the unique-name rule. Bases that resolve to nothing get no link: a
/// guessed link would send a diagnosis to the wrong source.
///
/// \p ModuleFiles maps each indexed Python module to its file.
std::vector<SubclassLink> resolveSubclasses(llvm::ArrayRef<ClassInfo> Classes,
                                            const ImportTable &Imports,
                                            const llvm::StringMap<int64_t> &ModuleFiles = {});

} // namespace ekka

#endif
