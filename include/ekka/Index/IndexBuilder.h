//===- IndexBuilder.h - Build or update a code index -----------*- C++ -*-===//
#ifndef EKKA_INDEX_INDEXBUILDER_H
#define EKKA_INDEX_INDEXBUILDER_H

#include "ekka/Index/CxxIndexer.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <vector>

namespace ekka {

struct IndexBuildOptions {
  std::vector<std::string> Roots; ///< Directories or files to index.
  std::string IndexPath;          ///< The SQLite index, created if absent.
  unsigned Jobs = 0;              ///< Worker threads; 0 means one per core.
  uint64_t MaxFileSize = 4u << 20; ///< Larger files are skipped (generated code).
  /// A C, C++ or CUDA unit instantiates no more templates past this much
  /// AST (CxxIndexerOptions::MaxASTMemory).
  uint64_t MaxUnitMemory = CxxIndexerOptions().MaxASTMemory;
  bool IndexPython = true;
  bool IndexCxx = true;
  std::vector<std::string> IncludeDirs; ///< Added to the guessed ones.
  std::vector<std::string> ExtraArgs;   ///< Extra Clang arguments.
  /// Per-file lines ("parsed", "skipped (binary)") go here when set.
  llvm::raw_ostream *Log = nullptr;
};

struct IndexBuildSummary {
  unsigned Files = 0;     ///< Source files found under the roots.
  unsigned Parsed = 0;    ///< Files (re-)parsed in this run.
  unsigned Unchanged = 0; ///< Files whose content had not changed.
  unsigned Removed = 0;   ///< Files gone from the roots since the last run.
  unsigned Skipped = 0;   ///< Unreadable, binary, non-UTF-8, too large, loops.
  llvm::StringMap<unsigned> SkipReasons;
  /// Each file skipped, with its reason (a key of SkipReasons), by path.
  std::vector<std::pair<std::string, std::string>> SkippedFiles;
  uint64_t Definitions = 0; ///< Definitions in the index after the run.
  double Seconds = 0;
};

/// Indexes the roots into Options.IndexPath, in parallel. On an existing
/// index only files whose content changed are parsed again (size and time
/// stamp first, then a content hash), and files that disappeared are dropped.
/// Python files go through tree-sitter; C, C++ and CUDA through Clang with
/// include directories guessed from each root (`include/`, `csrc/`,
/// `3rdparty/*/include`), each header indexed once: by the first translation
/// unit that includes it, or on its own if none does.
///
/// Bad files are skipped and counted, never fatal; errors are reserved for
/// a root that does not exist or an index that cannot be written.
llvm::Expected<IndexBuildSummary> buildIndex(const IndexBuildOptions &Options);

/// The include directories guessed for \p Root.
std::vector<std::string> guessIncludeDirs(llvm::StringRef Root);

} // namespace ekka

#endif
