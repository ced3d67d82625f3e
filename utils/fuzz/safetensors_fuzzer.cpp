//===- safetensors_fuzzer.cpp - The safetensors header and offsets --------===//
//
// Any bytes as a shard of a trace: SafeTensorsFile::parse either refuses
// them with an error or accepts a header whose every entry's bytes lie in
// the file; those bytes are then read (and their statistics computed, as a
// diagnosis does), so a range the parser let through wrongly is a read out
// of bounds that ASan reports.
//
//===----------------------------------------------------------------------===//
#include "ekka/Trace/SafeTensors.h"
#include "ekka/Trace/TraceFormat.h"

#include "llvm/Support/MemoryBuffer.h"

#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *Data, size_t Size) {
  auto Buffer = llvm::MemoryBuffer::getMemBufferCopy(
      llvm::StringRef(reinterpret_cast<const char *>(Data), Size), "fuzz.safetensors");
  auto File = ekka::SafeTensorsFile::parse(std::move(Buffer), "fuzz.safetensors");
  if (!File) {
    llvm::consumeError(File.takeError());
    return 0;
  }
  for (const ekka::SafeTensorInfo &Info : (*File)->tensors()) {
    llvm::StringRef Bytes = (*File)->bytes(Info);
    if (Bytes.size() != Info.End - Info.Begin || (*File)->find(Info.Name) == nullptr)
      std::abort(); // the parser's promise broken
    (void)ekka::statsOfBytes(Info.Type, Bytes);
  }
  return 0;
}
