//===- CxxIndexerInternal.h - Private helpers of CxxIndexer ----*- C++ -*-===//
#ifndef EKKA_LIB_INDEX_CXXINDEXERINTERNAL_H
#define EKKA_LIB_INDEX_CXXINDEXERINTERNAL_H

#include "ekka/Index/Definition.h"

#include "clang/Basic/LangOptions.h"
#include "clang/Basic/SourceManager.h"
#include "clang/Lex/Lexer.h"
#include "llvm/ADT/SmallVector.h"

#include <optional>
#include <vector>

namespace ekka {

/// A conditional directive a raw token stream stepped over.
enum class Conditional { If, Else, EndIf, Other };

/// Raw tokens of one file, without the preprocessor: directive lines are
/// stepped over (their conditionals reported), everything else — inactive
/// branches included — comes out as written.
class DirectiveAwareLexer {
public:
  DirectiveAwareLexer(clang::FileID FID, const clang::SourceManager &SM,
                      const clang::LangOptions &LangOpts, unsigned Offset = 0);

  /// The next token outside directives; false at the end of the file.
  /// \p Conds receives the conditionals passed on the way, in order.
  bool next(clang::Token &Tok, llvm::SmallVectorImpl<Conditional> &Conds);
  unsigned offset(const clang::Token &Tok) const {
    return SM.getFileOffset(Tok.getLocation());
  }

private:
  const clang::SourceManager &SM;
  clang::Lexer Raw;
  clang::Token Pending;
  bool HavePending = false;
};

/// Keeps a piece of parse state (a brace depth, a scope stack) consistent
/// across `#if`/`#else` branches that each open or close braces: every branch
/// starts from the state at its `#if`, and after `#endif` the state is the
/// one the first branch left.
template <typename T> class BranchTracker {
public:
  void apply(Conditional C, T &Value) {
    switch (C) {
    case Conditional::If:
      Frames.push_back({Value, std::nullopt});
      break;
    case Conditional::Else:
      if (!Frames.empty()) {
        if (!Frames.back().FirstEnd)
          Frames.back().FirstEnd = Value;
        Value = Frames.back().AtIf;
      }
      break;
    case Conditional::EndIf:
      if (!Frames.empty()) {
        if (Frames.back().FirstEnd)
          Value = *Frames.back().FirstEnd;
        Frames.pop_back();
      }
      break;
    case Conditional::Other:
      break;
    }
  }

private:
  struct Frame {
    T AtIf;
    std::optional<T> FirstEnd;
  };
  std::vector<Frame> Frames;
};

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

/// Adds an `op` definition for each custom op that \p Text registers with
/// TORCH_LIBRARY / TORCH_LIBRARY_IMPL / TORCH_LIBRARY_FRAGMENT (and vLLM's
/// TORCH_LIBRARY_EXPAND): `def` and `impl` calls, named `namespace::op`, with
/// the implementing function as base and the dispatch key as decorator.
void findTorchOpRegistrations(llvm::StringRef Text, const clang::LangOptions &LangOpts,
                              std::vector<Definition> &Defs);

} // namespace ekka

#endif
