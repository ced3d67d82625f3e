//===- PythonIndexer.h - Python definitions via tree-sitter ----*- C++ -*-===//
#ifndef EKKA_INDEX_PYTHONINDEXER_H
#define EKKA_INDEX_PYTHONINDEXER_H

#include "ekka/Index/Definition.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <string>

namespace ekka {

/// Indexes one Python file: classes (nested, function-local, under
/// `if TYPE_CHECKING:` or any other compound statement), functions and methods
/// (async too), module-level imports. Qualified names follow Python's
/// `__qualname__` under the module: `pkg.mod.Outer.Inner`,
/// `pkg.mod.make.<locals>.Local`. A decorated definition starts at its first
/// decorator. Bases are kept as written; `metaclass=` and other keywords are
/// not bases. A syntax error costs only the broken part: tree-sitter recovers
/// and everything outside the error is still found.
///
/// \p ModuleName is the dotted module (`pkg.mod`); \p IsPackageInit says the
/// file is a package's `__init__.py`, which changes what `from . import x`
/// means. Thread-safe: each thread uses a parser of its own.
///
/// Fails, with no definitions, when tree-sitter's parse would hold more
/// memory than 32 MiB and 512 bytes for each byte of \p Source: its error
/// recovery on some malformed text costs thousands of bytes a byte
/// (ekka-index then skips the file as `too-costly`).
llvm::Expected<FileDefinitions> indexPythonSource(llvm::StringRef Source,
                                                  llvm::StringRef ModuleName,
                                                  bool IsPackageInit);

/// Names Python modules by their files: a file's module path runs up through
/// every enclosing directory that is a package (has `__init__.py`), so
/// `.../site-packages/transformers/models/llama/modeling_llama.py` becomes
/// `transformers.models.llama.modeling_llama`, wherever indexing started.
/// Caches directory lookups; not thread-safe.
class PythonModuleNamer {
public:
  std::string moduleName(llvm::StringRef Path);

private:
  bool isPackageDir(llvm::StringRef Dir);
  llvm::StringMap<bool> PackageDirs;
};

} // namespace ekka

#endif
