//===- kernel_symbol_fuzzer.cpp - A kernel's name as CUPTI reports it -----===//
//
// Any bytes as the mangled name of a kernel (find_kernel's input, from a
// trace or a user): it is recognised or not, and demangled to the
// qualified name find_kernel looks up, without a crash or a hang.
//
//===----------------------------------------------------------------------===//
#include "ekka/Index/KernelSymbol.h"

#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *Data, size_t Size) {
  llvm::StringRef Symbol(reinterpret_cast<const char *>(Data), Size);
  (void)ekka::isMangledName(Symbol);
  (void)ekka::kernelQualifiedName(Symbol);
  return 0;
}
