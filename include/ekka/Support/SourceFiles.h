//===- SourceFiles.h - Find and vet the source files of a tree -*- C++ -*-===//
//
// What ekka-index walks: every Python, C, C++ and CUDA file under a set of
// roots, without following a symlink into a directory it has already seen
// (symlink loops are counted, not followed) or out of the root. Content checks
// (binary, UTF-8, size) are separate so the walk itself only stats.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_SUPPORT_SOURCEFILES_H
#define EKKA_SUPPORT_SOURCEFILES_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ekka {

enum class SourceLanguage { Python, C, Cxx, Cuda };

/// "python", "c", "c++" or "cuda".
llvm::StringRef languageName(SourceLanguage L);

/// The language a file is indexed as, by its extension; none for other files.
/// .cu/.cuh are CUDA; .h is C++ (headers of mixed projects are read as C++).
std::optional<SourceLanguage> languageForPath(llvm::StringRef Path);

/// Whether a C-family path is a header (parsed on its own only when no
/// translation unit that includes it was indexed).
bool isHeaderPath(llvm::StringRef Path);

struct SourceFile {
  std::string Path;     ///< Absolute, symlinks resolved.
  std::string RealPath; ///< The same: how a compiler names it.
  uint64_t Size = 0;
  int64_t MTimeNs = 0;
  SourceLanguage Language = SourceLanguage::Python;
};

struct WalkStats {
  unsigned SymlinkLoops = 0;   ///< Directories reached again through a link, links to themselves.
  unsigned OutsideRoot = 0;    ///< Links to directories or sources outside the root.
  unsigned Unreadable = 0;     ///< Source files or directories that could not be read.
  unsigned OtherFiles = 0;     ///< Files that are not source code.
  /// Each skipped path and why: "symlink-loop", "outside-root", and for the
  /// unreadable "special-file" (a FIFO, device or socket under a source
  /// name), "dangling-symlink", "vanished" (gone since it was listed),
  /// "path-too-long" (past PATH_MAX), "not-utf8-name" or "unreadable".
  std::vector<std::pair<std::string, std::string>> Skipped;
};

/// Lists the source files under \p Roots (each a directory or a file) by their
/// real paths, sorted, duplicates removed (a root given twice, or inside
/// another, or reached through a symlinked path, is walked once). Hidden
/// directories (.git, .venv, ...) and __pycache__ are not entered; a symlink
/// back into a directory already walked is counted as a loop, and one that
/// leads out of the root's real path is not followed (counted as
/// outside-root). Names that are not UTF-8 are skipped: the index is UTF-8
/// text (SQLite, JSON, Python's sqlite3), and such a path could not be shown
/// or looked up as it is. A root that does not exist is an error.
llvm::Expected<std::vector<SourceFile>>
collectSourceFiles(llvm::ArrayRef<std::string> Roots, WalkStats &Stats);

/// Why a file's content cannot be indexed as source text.
enum class ContentProblem { None, Binary, NotUTF8 };

/// NUL bytes mean binary; otherwise the text must be valid UTF-8.
ContentProblem classifyContent(llvm::StringRef Content);

/// Reads a file the walk listed into \p Text, refusing what it may have
/// become since: something other than a regular file (a FIFO is opened
/// without waiting for a writer, and not read) or more than \p MaxSize
/// bytes. Returns why it was not read, as the walk names skips
/// ("special-file", "too-large", "vanished", "unreadable"), or "" once read.
llvm::StringRef readSourceText(llvm::StringRef Path, uint64_t MaxSize, std::string &Text);

} // namespace ekka

#endif
