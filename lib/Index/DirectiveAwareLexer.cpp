//===- DirectiveAwareLexer.cpp - Raw tokens, directives stepped over -----===//
#include "CxxIndexerInternal.h"

#include "llvm/ADT/StringSwitch.h"

using namespace clang;
using namespace llvm;

namespace ekka {

DirectiveAwareLexer::DirectiveAwareLexer(FileID FID, const SourceManager &SM,
                                         const LangOptions &LangOpts, unsigned Offset)
    : SM(SM), Raw(SM.getLocForStartOfFile(FID), LangOpts,
                  SM.getBufferData(FID).begin(),
                  SM.getBufferData(FID).begin() + Offset,
                  SM.getBufferData(FID).end()) {}

bool DirectiveAwareLexer::next(Token &Tok, SmallVectorImpl<Conditional> &Conds) {
  while (true) {
    if (HavePending) {
      Tok = Pending;
      HavePending = false;
    } else {
      Raw.LexFromRawLexer(Tok);
    }
    if (Tok.is(tok::eof))
      return false;
    if (!Tok.is(tok::hash) || !Tok.isAtStartOfLine())
      return true;
    // A directive: note a conditional, step over the whole line (escaped
    // newlines included, as the raw lexer joins them).
    Raw.LexFromRawLexer(Tok);
    if (Tok.is(tok::raw_identifier) && !Tok.isAtStartOfLine()) {
      std::optional<Conditional> C =
          StringSwitch<std::optional<Conditional>>(Tok.getRawIdentifier())
              .Cases("if", "ifdef", "ifndef", Conditional::If)
              .Cases("else", "elif", "elifdef", "elifndef", Conditional::Else)
              .Case("endif", Conditional::EndIf)
              .Default(Conditional::Other);
      Conds.push_back(*C);
    } else {
      Conds.push_back(Conditional::Other);
    }
    while (Tok.isNot(tok::eof) && !Tok.isAtStartOfLine())
      Raw.LexFromRawLexer(Tok);
    if (Tok.is(tok::eof))
      return false;
    Pending = Tok;
    HavePending = true;
  }
}

} // namespace ekka
