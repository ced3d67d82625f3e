//===- python_indexer_fuzzer.cpp - The Python indexer on any bytes --------===//
//
// Any bytes as a Python file of a repository being indexed (ekka-index
// build skips binary and non-UTF-8 files before parsing; the indexer itself
// must still survive them): tree-sitter recovers from any syntax error, and
// every definition found must lie within the file, its lines and bytes. A
// file whose parse would hold more than its memory limit is refused, with
// an error and no definitions.
//
//===----------------------------------------------------------------------===//
#include "ekka/Index/PythonIndexer.h"

#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *Data, size_t Size) {
  llvm::StringRef Source(reinterpret_cast<const char *>(Data), Size);
  bool Init = Size && (Data[0] & 1);
  llvm::Expected<ekka::FileDefinitions> Defs = ekka::indexPythonSource(Source, "fuzz.mod", Init);
  if (!Defs) {
    llvm::consumeError(Defs.takeError());
    return 0;
  }
  uint64_t Lines = uint64_t(Source.count('\n')) + 1;
  for (const ekka::Definition &D : Defs->Definitions)
    if (D.LineStart < 1 || D.LineEnd < D.LineStart || uint64_t(D.LineEnd) > Lines ||
        D.ByteEnd < D.ByteStart || D.ByteEnd > Size)
      std::abort(); // a definition outside the file
  return 0;
}
