//===- CxxIndexer.h - C++/CUDA definitions via Clang libTooling -*- C++ -*-===//
#ifndef EKKA_INDEX_CXXINDEXER_H
#define EKKA_INDEX_CXXINDEXER_H

#include "ekka/Index/Definition.h"
#include "ekka/Support/SourceFiles.h"

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringRef.h"

#include "llvm/ADT/IntrusiveRefCntPtr.h"

#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace clang {
class FileManager;
}

namespace ekka {

struct CxxIndexerOptions {
  /// -I directories for every translation unit (guessed by the builder:
  /// include/, csrc/, 3rdparty/*/include of each root, plus the user's).
  std::vector<std::string> IncludeDirs;
  /// Extra compiler arguments, appended last (`-DFOO`, `-std=c++20`).
  std::vector<std::string> ExtraArgs;
  /// Clang's builtin headers; the default is the one found at build time.
  std::string ResourceDir;
  /// Larger C, C++ and CUDA files are not opened, #included or not (the
  /// builder's --max-file-size).
  uint64_t MaxSourceSize = UINT64_MAX;
  /// A unit whose AST grows past this many bytes instantiates no more
  /// templates (the rest of it is still parsed): seven lines of templates
  /// that instantiate two of themselves a level can ask for millions of
  /// classes and take minutes and gigabytes.
  uint64_t MaxASTMemory = uint64_t(1) << 30;
};

/// The definitions one translation unit contributed to one file.
struct CxxFileDefinitions {
  std::string RealPath;
  FileDefinitions Definitions;
};

/// What parsing one translation unit gave.
struct CxxTranslationUnit {
  /// The definitions of each wanted file the unit contains, the main file
  /// (if wanted) first.
  std::vector<CxxFileDefinitions> Files;
  /// Real paths of every file the unit included: when one changes, the unit
  /// must be parsed again.
  std::vector<std::string> Includes;
  /// Paths (real directory, then the name as written) that an `#include`
  /// looked for in a user search directory before the one it was found in,
  /// or in every one when it was not found: a file created at one of them
  /// changes what the unit includes.
  std::vector<std::string> IncludeMisses;
  unsigned ParseErrors = 0; ///< Errors Clang recovered from.
  /// Template instantiation stopped at MaxASTMemory; what came after it
  /// lost the members and bases that instantiation would have given.
  bool StoppedInstantiating = false;
};

/// Indexes C, C++ and CUDA with Clang, without a compilation database.
///
/// Every translation unit is parsed leniently: function bodies are skipped
/// (a definition's span still covers its body), missing headers do not stop
/// the parse, and CUDA is read in host mode with a small prelude that declares
/// the CUDA qualifiers and types (`__global__`, `dim3`, `half`, bf16, fp8)
/// instead of the toolkit's own headers, which Clang 19 cannot read for
/// CUDA 13. What is recorded: classes/structs/unions with their bases (as
/// Clang resolves them) and methods, functions, methods, namespaces, and
/// every `__global__` kernel, templates and macro-made ones included, at the
/// place the macro was used.
///
/// A translation unit records only the files that \p Wanted accepts (the ones
/// that need indexing); the caller picks, among the units that include a
/// header, the one whose record of it to keep. One CxxIndexer may be used
/// from many threads at once.
class CxxIndexer {
public:
  explicit CxxIndexer(CxxIndexerOptions Options);
  ~CxxIndexer();

  /// Parses \p MainFile (read as \p Language) and returns the definitions of
  /// each wanted file it contains and the files it included.
  CxxTranslationUnit
  indexTranslationUnit(llvm::StringRef MainFile, SourceLanguage Language,
                       llvm::function_ref<bool(llvm::StringRef RealPath)> Wanted);

  /// The compiler command line used for \p MainFile (for --verbose output).
  std::vector<std::string> commandLine(llvm::StringRef MainFile,
                                       SourceLanguage Language) const;

  /// Precompiles the CUDA prelude and the common standard headers into
  /// \p PCHPath, which later translation units load instead of parsing those
  /// headers again. Call before indexing, from one thread. Returns false,
  /// and indexing goes on without it, when Clang cannot build it.
  bool precompilePrelude(llvm::StringRef PCHPath);

private:
  clang::FileManager &threadFileManager();

  CxxIndexerOptions Options;
  std::string PrecompiledPrelude;
  std::mutex FileManagersMutex;
  std::map<std::thread::id, llvm::IntrusiveRefCntPtr<clang::FileManager>> FileManagers;
};

/// Text of the CUDA prelude force-included in lenient CUDA mode.
llvm::StringRef cudaPrelude();

} // namespace ekka

#endif
