//===- KernelSymbol.h - From a kernel's runtime name to its source name -*- C++ -*-===//
#ifndef EKKA_INDEX_KERNELSYMBOL_H
#define EKKA_INDEX_KERNELSYMBOL_H

#include "llvm/ADT/StringRef.h"

#include <string>

namespace ekka {

/// The qualified name of the function a kernel symbol names, without template
/// arguments or parameters — the name the kernel's definition has in source.
/// Accepts what CUPTI reports (an Itanium-mangled name such as
/// `_ZN10flashinfer6kernelILj128EEEvPf`), a demangled signature
/// (`void flashinfer::kernel<128u>(float*)`), or a plain name (Triton,
/// `extern "C"`). Returns the input unchanged when it cannot be read.
std::string kernelQualifiedName(llvm::StringRef Symbol);

/// Whether \p Symbol looks Itanium-mangled.
bool isMangledName(llvm::StringRef Symbol);

} // namespace ekka

#endif
