//===- CxxIndexerInternal.h - Private helpers of CxxIndexer ----*- C++ -*-===//
#ifndef EKKA_LIB_INDEX_CXXINDEXERINTERNAL_H
#define EKKA_LIB_INDEX_CXXINDEXERINTERNAL_H

#include "ekka/Index/Definition.h"

#include "clang/Basic/LangOptions.h"
#include "clang/Basic/SourceManager.h"

#include <vector>

namespace ekka {

/// Finds the `__global__` kernels of file \p FID that the parse did not see —
/// those in inactive preprocessor branches (`#if __CUDA_ARCH__ >= 900`,
/// `#ifdef ENABLE_FP8`) or in code Clang could not make sense of — by raw
/// lexing, and appends them to \p Defs with FoundByLexer set. A kernel already
/// in \p Defs (its span covers the `__global__`) is not added twice; macro
/// definitions are skipped (their uses are what Clang records). Qualified
/// names come from the `namespace` blocks around the kernel.
void addKernelsMissedByParser(clang::FileID FID, const clang::SourceManager &SM,
                              const clang::LangOptions &LangOpts,
                              std::vector<Definition> &Defs);

} // namespace ekka

#endif
