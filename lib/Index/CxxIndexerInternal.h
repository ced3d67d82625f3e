//===- CxxIndexerInternal.h - Private helpers of CxxIndexer ----*- C++ -*-===//
#ifndef EKKA_LIB_INDEX_CXXINDEXERINTERNAL_H
#define EKKA_LIB_INDEX_CXXINDEXERINTERNAL_H

#include "ekka/Index/Definition.h"

#include "clang/Basic/LangOptions.h"
#include "clang/Basic/SourceManager.h"

#include <vector>

namespace ekka {

/// Adds to \p Defs the `__global__` kernels and the class/struct/union
/// definitions of file \p FID that the parse did not see — in inactive
/// preprocessor branches (`#if __CUDA_ARCH__ >= 900`), or dropped by Clang
/// because a name they use comes from a missing header — by raw lexing, with
/// FoundByLexer set. Definitions already in \p Defs (same name, span covering
/// the head) are not added twice, but get the bases they were written with if
/// Clang had to drop them. Macro definitions are skipped (their uses are what
/// Clang records). Qualified names come from the enclosing namespace and
/// class blocks.
void recoverDefinitionsMissedByParser(clang::FileID FID,
                                      const clang::SourceManager &SM,
                                      const clang::LangOptions &LangOpts,
                                      std::vector<Definition> &Defs);

} // namespace ekka

#endif
