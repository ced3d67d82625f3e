//===- LexicalKernels.cpp - Kernels the parser could not see -------------===//
//
// An index must find every kernel that grep finds: a diagnosis that cannot
// link CUPTI's kernel name to its source is stuck. Real CUDA code hides many
// kernels from a host-side parse behind `#if __CUDA_ARCH__ >= 900` or feature
// macros, so after Clang has indexed a file, a raw lexer walks it once more
// for `__global__` tokens that no recorded kernel covers.
//
//===----------------------------------------------------------------------===//
#include "CxxIndexerInternal.h"

#include "clang/Lex/Lexer.h"

using namespace clang;
using namespace llvm;

namespace ekka {

namespace {

/// `__launch_bounds__(..)`, `__attribute__((..))`, `alignas(..)` and friends:
/// an identifier followed by parentheses that is not the kernel's name.
bool isAttributeLike(StringRef Name) {
  return Name.starts_with("__") || Name == "alignas" || Name == "decltype" ||
         Name == "noexcept";
}

class KernelScanner {
public:
  KernelScanner(FileID FID, const SourceManager &SM, const LangOptions &LangOpts,
                std::vector<Definition> &Defs)
      : FID(FID), SM(SM), Defs(Defs),
        Raw(FID, SM.getBufferOrFake(FID), SM, LangOpts) {
    Buffer = SM.getBufferData(FID);
    for (const Definition &D : Defs)
      if (D.Kind == DefinitionKind::Kernel)
        Covered.push_back({D.LineStart, D.LineEnd});
  }

  void run() {
    lex();
    while (Tok.isNot(tok::eof)) {
      if (Tok.is(tok::hash) && Tok.isAtStartOfLine()) {
        skipDirective();
        StatementStart = std::nullopt;
        continue;
      }
      if (!StatementStart)
        StatementStart = offset();
      if (Tok.is(tok::raw_identifier)) {
        StringRef Id = Tok.getRawIdentifier();
        if (Id == "namespace") {
          lex();
          openNamespace();
          continue;
        }
        if (Id == "__global__") {
          kernelAt();
          continue;
        }
      }
      if (Tok.is(tok::l_brace))
        Scopes.push_back("");
      else if (Tok.is(tok::r_brace) && !Scopes.empty())
        Scopes.pop_back();
      if (Tok.isOneOf(tok::l_brace, tok::r_brace, tok::semi))
        StatementStart = std::nullopt;
      lex();
    }
  }

private:
  void lex() { Raw.LexFromRawLexer(Tok); }
  unsigned offset() const { return SM.getFileOffset(Tok.getLocation()); }
  unsigned line(unsigned Offset) const { return SM.getLineNumber(FID, Offset); }

  void skipDirective() {
    do
      lex();
    while (Tok.isNot(tok::eof) && !Tok.isAtStartOfLine());
  }

  /// After `namespace`: `a::b {` opens named scopes, `{` an anonymous one.
  void openNamespace() {
    std::string Name;
    while (Tok.isOneOf(tok::raw_identifier, tok::coloncolon)) {
      Name += Tok.is(tok::coloncolon) ? "::" : Tok.getRawIdentifier().str();
      lex();
    }
    if (Tok.is(tok::l_brace)) {
      Scopes.push_back(Name.empty() ? "(anonymous namespace)" : Name);
      StatementStart = std::nullopt;
      lex();
    }
  }

  /// Skips a balanced (..), [..] or {..} group starting at the current token;
  /// leaves the closing token current.
  bool skipGroup() {
    tok::TokenKind Open = Tok.getKind();
    tok::TokenKind Close = Open == tok::l_brace   ? tok::r_brace
                           : Open == tok::l_paren ? tok::r_paren
                                                  : tok::r_square;
    unsigned Depth = 1;
    while (true) {
      lex();
      if (Tok.is(tok::eof))
        return false;
      if (Tok.is(tok::hash) && Tok.isAtStartOfLine()) {
        skipDirective();
        if (Tok.is(Open))
          ++Depth;
        else if (Tok.is(Close) && --Depth == 0)
          return true;
        continue;
      }
      if (Tok.is(Open))
        ++Depth;
      else if (Tok.is(Close) && --Depth == 0)
        return true;
    }
  }

  bool covered(unsigned Line) const {
    return llvm::any_of(Covered, [&](auto Span) {
      return Span.first <= Line && Line <= Span.second;
    });
  }

  void kernelAt() {
    unsigned Start = StatementStart.value_or(offset());
    unsigned GlobalLine = line(offset());
    // The name is the last identifier before the parameter list.
    std::string Name, Pending;
    lex();
    while (Tok.isNot(tok::eof) && !Tok.isOneOf(tok::semi, tok::l_brace)) {
      if (Tok.is(tok::hash) && Tok.isAtStartOfLine()) {
        skipDirective();
        continue;
      }
      if (Tok.is(tok::raw_identifier)) {
        if (!StringRef(Pending).ends_with("::"))
          Pending.clear();
        Pending += Tok.getRawIdentifier().str();
      } else if (Tok.is(tok::coloncolon)) {
        Pending += "::";
      } else if (Tok.is(tok::l_paren)) {
        bool IsParams = !Pending.empty() && !isAttributeLike(Pending);
        std::string Candidate = Pending;
        if (!skipGroup())
          return;
        Pending.clear();
        if (IsParams) {
          Name = Candidate;
          lex();
          break;
        }
      } else if (Tok.is(tok::less)) {
        Pending.clear(); // template arguments of the return type
      }
      lex();
    }
    if (Name.empty())
      return;
    // Trailing qualifiers up to the body or the end of a declaration.
    while (Tok.isNot(tok::eof) && !Tok.isOneOf(tok::semi, tok::l_brace)) {
      if (Tok.isOneOf(tok::l_paren, tok::l_square) && !skipGroup())
        return;
      lex();
    }
    bool HasBody = Tok.is(tok::l_brace);
    if (HasBody && !skipGroup())
      return;
    unsigned End = offset() + Tok.getLength();
    StatementStart = std::nullopt;
    lex();
    if (covered(GlobalLine))
      return;

    Definition D;
    StringRef Short = StringRef(Name).rsplit("::").second;
    D.Name = Short.empty() ? Name : Short.str();
    std::string Qualified;
    for (const std::string &S : Scopes)
      if (!S.empty())
        Qualified += S + "::";
    D.QualifiedName = Qualified + Name;
    D.Kind = DefinitionKind::Kernel;
    D.ByteStart = Start;
    D.ByteEnd = End;
    D.LineStart = line(Start);
    D.LineEnd = line(End ? End - 1 : 0);
    D.IsTemplate = StringRef(Buffer).slice(Start, End).contains("template");
    D.FoundByLexer = true;
    Covered.push_back({D.LineStart, D.LineEnd});
    Defs.push_back(std::move(D));
  }

  FileID FID;
  const SourceManager &SM;
  std::vector<Definition> &Defs;
  Lexer Raw;
  StringRef Buffer;
  Token Tok;
  std::vector<std::string> Scopes;
  std::optional<unsigned> StatementStart;
  std::vector<std::pair<unsigned, unsigned>> Covered;
};

} // namespace

void addKernelsMissedByParser(FileID FID, const SourceManager &SM,
                              const LangOptions &LangOpts,
                              std::vector<Definition> &Defs) {
  bool Invalid = false;
  StringRef Buffer = SM.getBufferData(FID, &Invalid);
  if (Invalid || !Buffer.contains("__global__"))
    return;
  KernelScanner(FID, SM, LangOpts, Defs).run();
}

} // namespace ekka
