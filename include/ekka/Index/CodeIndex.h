//===- CodeIndex.h - The SQLite code index and its queries -----*- C++ -*-===//
//
// The static view of Ekka (DESIGN.md): every Python class and function and
// every C++/CUDA record, function and kernel of the indexed repositories, in
// one SQLite file that ekka-diagnose (and a user with `sqlite3`) can query.
// The index stores each file's text, so the source it returns is exactly what
// was indexed even after the repository moved on. docs/CodeIndex.md
// documents the schema.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_INDEX_CODEINDEX_H
#define EKKA_INDEX_CODEINDEX_H

#include "ekka/Index/Definition.h"
#include "ekka/Support/SQLite.h"
#include "ekka/Support/SourceFiles.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"

#include <memory>
#include <string>
#include <vector>

namespace ekka {

/// A definition as a query returns it.
struct IndexedDefinition {
  int64_t Id = 0;
  Definition Def;
  std::string File;     ///< Absolute path as indexed.
  std::string Language; ///< python | c | c++ | cuda
  std::string Source;   ///< The exact source text of the definition.
  std::string Relation; ///< For subclasses: "Base" it derives from; for
                        ///< find_kernel: how the symbol was matched.
};

/// What the index remembers of a file, to decide whether to re-parse it.
struct IndexedFileState {
  uint64_t Size = 0;
  int64_t MTimeNs = 0;
  std::string Hash;
  std::string Status; ///< indexed | binary | not-utf8 | too-large | unreadable
  std::string Module; ///< Python module name; empty otherwise.
  std::string RecordedBy; ///< C++: the unit whose parse recorded the file.
};

/// A file about to be stored.
struct IndexedFile {
  std::string Path;
  SourceLanguage Language = SourceLanguage::Python;
  std::string Module; ///< Python module name; empty otherwise.
  uint64_t Size = 0;
  int64_t MTimeNs = 0;
  std::string Hash;
  std::string Status = "indexed";
  /// C++: the translation unit (its main file's path) whose parse recorded
  /// this file's definitions, and, for a main file, every file it included.
  std::string RecordedBy;
  std::vector<std::string> Includes;
  /// C++ main files: where their #includes looked before finding their
  /// files (CxxTranslationUnit::IncludeMisses).
  std::vector<std::string> IncludeMisses;
  /// Keep the includes and misses stored for the file (its own unit did not
  /// run) instead of replacing them with the two above.
  bool KeepIncludes = false;
};

struct IndexCounts {
  uint64_t Files = 0, Skipped = 0, Definitions = 0, Classes = 0, Functions = 0,
           Kernels = 0, SubclassLinks = 0;
};

class CodeIndex {
public:
  /// Version of the schema; a reader refuses an index of another major.
  static constexpr int FormatVersion = 1;
  /// What the indexers extract; an index built by another revision (what
  /// it lacks, or holds wrongly, is in unchanged files too) is parsed again
  /// whole. 2: op registrations from Python, vLLM's sub-libraries and the
  /// stable ABI's blocks. 3: the include search's misses. 4: every header
  /// unit no source records runs, and a header's record no longer depends
  /// on thread order. 5: Python dispatch keys that are not literals. 6:
  /// register_kernel's device_types as the keys a tuple or list names. 7:
  /// also where a comment stands among them.
  static constexpr int ParserRevision = 7;

  /// Opens \p Path for building, creating it if needed. An existing file
  /// that is not an Ekka index is an error, never overwritten.
  static llvm::Expected<std::unique_ptr<CodeIndex>> openForWriting(llvm::StringRef Path);
  /// Makes what was written the index at the path given to openForWriting
  /// (a new index is written beside it and renamed into place). The index
  /// cannot be used afterwards.
  llvm::Error finish();
  ~CodeIndex();

  /// Opens an existing index for queries.
  static llvm::Expected<std::unique_ptr<CodeIndex>> openForReading(llvm::StringRef Path);

  // --- Building -------------------------------------------------------------
  llvm::Expected<llvm::StringMap<IndexedFileState>> fileStates();
  llvm::Error beginBatch();
  llvm::Error commitBatch();
  /// Replaces whatever the index held for F.Path.
  llvm::Error storeFile(const IndexedFile &F, llvm::StringRef Text,
                        const FileDefinitions &Defs);
  /// Records a file that was skipped; F.Status says why.
  llvm::Error storeSkippedFile(const IndexedFile &F);
  /// Content unchanged, only the time stamp moved.
  llvm::Error updateFileTime(llvm::StringRef Path, int64_t MTimeNs);
  llvm::Error removeFile(llvm::StringRef Path);
  /// Main files of the translation units that included any of \p RealPaths.
  llvm::Expected<std::vector<std::string>>
  includersOf(const std::vector<std::string> &RealPaths);
  /// For each of \p RealPaths, the main files of the units that included it.
  llvm::Expected<llvm::StringMap<std::vector<std::string>>>
  includersOfEach(const std::vector<std::string> &RealPaths);
  /// Main files of the translation units whose #include search looked for
  /// any of \p RealPaths and went on (or found nothing).
  llvm::Expected<std::vector<std::string>>
  unitsMissing(const std::vector<std::string> &RealPaths);
  /// Files whose definitions the translation units of \p Mains recorded.
  llvm::Expected<std::vector<std::string>>
  filesRecordedBy(const std::vector<std::string> &Mains);
  /// Recomputes every subclass link from the stored bases and imports.
  llvm::Error rebuildSubclassLinks();
  llvm::Error setMeta(llvm::StringRef Key, llvm::StringRef Value);
  /// The value of meta \p Key; empty if none.
  llvm::Expected<std::string> meta(llvm::StringRef Key);

  // --- Queries ----------------------------------------------------------------
  /// Every class/struct/union named \p Name (simple or qualified, or a dotted
  /// / `::` suffix of the qualified name), with its source.
  llvm::Expected<std::vector<IndexedDefinition>> classDefinitions(llvm::StringRef Name);
  /// Classes deriving from the classes named \p Name: direct ones, or all
  /// descendants with \p Transitive.
  llvm::Expected<std::vector<IndexedDefinition>> subclasses(llvm::StringRef Name,
                                                            bool Transitive);
  /// The definition of a kernel from its runtime symbol (see KernelSymbol.h).
  /// A plain name falls back to Python functions of that name decorated
  /// with triton.jit, autotune or heuristics (Triton kernels); Relation says
  /// which rule matched.
  llvm::Expected<std::vector<IndexedDefinition>> findKernel(llvm::StringRef Symbol);
  /// A PyTorch custom op by its registered name (`zoo::paged_attention`, or
  /// the name without its namespace): its registrations (`def`, `impl`),
  /// then the functions that implement it (Relation: "implements NAME").
  llvm::Expected<std::vector<IndexedDefinition>> findOp(llvm::StringRef Name);
  /// Definitions whose name or qualified name contains \p Text
  /// (case-insensitive), exact names first.
  llvm::Expected<std::vector<IndexedDefinition>> search(llvm::StringRef Text,
                                                        unsigned Limit);
  llvm::Expected<IndexCounts> counts();

private:
  explicit CodeIndex(std::unique_ptr<SQLiteDatabase> Db) : Db(std::move(Db)) {}
  llvm::Error createSchema();
  llvm::Error checkFormat();
  /// Whether it is an Ekka code index of another format than this one's
  /// (which a build replaces).
  bool otherFormat();
  llvm::Expected<std::vector<IndexedDefinition>> selectDefinitions(
      llvm::StringRef Where, llvm::ArrayRef<std::string> Params,
      llvm::StringRef OrderBy = "f.path, d.line_start");
  llvm::Expected<int64_t> fileId(llvm::StringRef Path);
  /// A statement prepared once per index, reset for reuse.
  llvm::Expected<SQLiteStatement *> cached(llvm::StringRef SQL);
  /// Deletes a file's definitions and imports, and its includes and
  /// include misses unless \p KeepIncludes.
  llvm::Error deleteFileContents(int64_t FileId, bool KeepIncludes = false);

  std::unique_ptr<SQLiteDatabase> Db;
  llvm::StringMap<SQLiteStatement> Statements; ///< Before Db in destruction.
  std::string TempPath, FinalPath; ///< Set while a new index is being written.
};

} // namespace ekka

#endif
