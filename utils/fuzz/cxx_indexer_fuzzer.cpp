//===- cxx_indexer_fuzzer.cpp - The C++/CUDA indexer on any bytes ---------===//
//
// Any bytes as a C++/CUDA file (C when it begins with the comment /*C*/)
// of a repository being indexed, parsed as ekka-index build parses it: Clang's libTooling
// in the indexer's lenient mode with the CUDA prelude, then Ekka's walk of
// the AST, the directive-aware lexer and the lexical recovery of what the
// parser did not see. Clang recovers from any syntax error; every
// definition Ekka records must lie within the file, its lines and bytes,
// and only the file the indexer was asked for may be recorded.
//
// Clang itself (Debian's libclang-cpp) is not instrumented: the target
// covers Ekka's sources, and Clang is slow, so inputs are capped at 4 KiB
// (run-fuzzers' -max_len) and the system's headers are out of reach.
//
//===----------------------------------------------------------------------===//
#include "ekka/Index/CxxIndexer.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <cstdlib>
#include <string>

using namespace llvm;

namespace {

/// This process's directory for the file being indexed, made once and
/// removed at exit.
const std::string &sourceDirectory() {
  static const std::string *Dir = [] {
    SmallString<128> Path, Real;
    if (sys::fs::createUniqueDirectory("ekka-fuzz-cxx_indexer", Path) ||
        sys::fs::real_path(Path, Real))
      std::abort(); // no temporary directory: nothing can be fuzzed
    std::atexit([] { (void)sys::fs::remove_directories(sourceDirectory()); });
    return new std::string(Real);
  }();
  return *Dir;
}

/// Lines as Clang counts them: "\n", "\r\n" and a lone "\r" each end one.
uint64_t clangLines(StringRef Source) {
  uint64_t Lines = 1;
  for (size_t I = 0; I < Source.size(); ++I)
    if (Source[I] == '\n' || (Source[I] == '\r' && (I + 1 == Source.size() || Source[I + 1] != '\n')))
      ++Lines;
  return Lines;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *Data, size_t Size) {
  StringRef Source(reinterpret_cast<const char *>(Data), Size);
  bool AsC = Source.starts_with("/*C*/");
  SmallString<128> Path(sourceDirectory());
  sys::path::append(Path, AsC ? "fuzz.c" : "fuzz.cu");
  {
    std::error_code EC;
    raw_fd_ostream OS(Path, EC, sys::fs::OF_None);
    if (EC)
      std::abort();
    OS << Source;
  }
  // A new indexer for each input, as each ekka-index build makes one: its
  // FileManager caches what it stat()ed, and would read this path's next
  // contents with the last one's size.
  //
  // Without the system's include directories (Clang's own builtin headers
  // stay): the fuzzer soon learns to write #include <regex>, and a second
  // spent in libstdc++ is Clang's parse of the system's headers, not Ekka's
  // of the input. A header not found is what an index meets every day.
  //
  // Templates stop being instantiated at 64 MiB of AST, not ekka-index's
  // 1 GiB: 4 KiB of templates can ask for that, which under ASan would run
  // past the 10 s and 2 GB limits of a run; the limit is the same code.
  ekka::CxxIndexerOptions Options;
  Options.ExtraArgs = {"-nostdlibinc", "-nostdinc++"};
  Options.MaxASTMemory = 64 << 20;
  ekka::CxxIndexer Indexer(std::move(Options));
  ekka::CxxTranslationUnit TU = Indexer.indexTranslationUnit(
      Path, AsC ? ekka::SourceLanguage::C : ekka::SourceLanguage::Cuda,
      [&](StringRef RealPath) { return RealPath == Path; });
  uint64_t Lines = clangLines(Source);
  for (const ekka::CxxFileDefinitions &F : TU.Files) {
    if (F.RealPath != Path)
      std::abort(); // a file the indexer was not asked for
    for (const ekka::Definition &D : F.Definitions.Definitions)
      if (D.LineStart < 1 || D.LineEnd < D.LineStart || uint64_t(D.LineEnd) > Lines ||
          D.ByteEnd < D.ByteStart || D.ByteEnd > Size) {
        errs() << "definition outside the file (" << Lines << " lines, " << Size
               << " bytes): " << D.QualifiedName << " (" << ekka::kindName(D.Kind)
               << (D.FoundByLexer ? ", found by the lexer" : "") << ") lines " << D.LineStart
               << "-" << D.LineEnd << ", bytes " << D.ByteStart << "-" << D.ByteEnd << "\n";
        std::abort();
      }
  }
  return 0;
}
