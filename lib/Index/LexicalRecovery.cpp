//===- LexicalRecovery.cpp - What the parser could not see ---------------===//
//
// An index must find every kernel and class that grep finds: a diagnosis that
// cannot link CUPTI's kernel name to its source is stuck. A host-side parse
// without the project's build flags misses some of them — behind
// `#if __CUDA_ARCH__ >= 900`, in the other branch of a feature macro, or in a
// specialization whose arguments come from a header that is not there
// (`template <> struct vec_cast<half, __nv_fp4x2_e2m1>`), which Clang drops.
// So after Clang has indexed a file, a raw lexer walks it once more and adds
// the `__global__` kernels and class definitions that no recorded definition
// covers, with qualified names from the enclosing namespace and class blocks.
// It also gives a parsed class the bases it was written with when Clang had
// to drop them (a base from a missing header).
//
//===----------------------------------------------------------------------===//
#include "CxxIndexerInternal.h"

#include "llvm/ADT/StringExtras.h"
#include "clang/Lex/Lexer.h"

using namespace clang;
using namespace llvm;

namespace ekka {

namespace {

/// `__launch_bounds__(..)`, `__attribute__((..))`, `alignas(..)` and friends:
/// an identifier followed by parentheses that is not a name being defined.
bool isAttributeLike(StringRef Name) {
  return Name.starts_with("__") || Name == "alignas" || Name == "decltype" ||
         Name == "noexcept";
}

/// `public Base<T>` -> `Base<T>`, whitespace collapsed.
std::string cleanBase(StringRef Written) {
  SmallVector<StringRef, 8> Words;
  SplitString(Written, Words);
  std::string Out;
  for (StringRef W : Words) {
    if (Out.empty() && (W == "public" || W == "protected" || W == "private" ||
                        W == "virtual"))
      continue;
    if (!Out.empty())
      Out += ' ';
    Out += W.str();
  }
  return Out;
}

/// Splits a base clause at the commas outside <>, () and [].
std::vector<std::string> splitBases(StringRef Clause) {
  std::vector<std::string> Bases;
  int Depth = 0;
  size_t Start = 0;
  for (size_t I = 0; I <= Clause.size(); ++I) {
    char C = I < Clause.size() ? Clause[I] : ',';
    if (C == '<' || C == '(' || C == '[')
      ++Depth;
    else if ((C == '>' || C == ')' || C == ']') && Depth > 0)
      --Depth;
    else if (C == ',' && Depth == 0) {
      std::string B = cleanBase(Clause.slice(Start, I));
      if (!B.empty())
        Bases.push_back(std::move(B));
      Start = I + 1;
    }
  }
  return Bases;
}

class LexicalScanner {
public:
  LexicalScanner(FileID FID, const SourceManager &SM, const LangOptions &LangOpts,
                 std::vector<Definition> &Defs)
      : FID(FID), SM(SM), Defs(Defs), Stream(FID, SM, LangOpts) {
    Buffer = SM.getBufferData(FID);
    for (size_t I = 0; I < Defs.size(); ++I)
      if (Defs[I].Kind == DefinitionKind::Kernel || isRecordKind(Defs[I].Kind))
        Parsed.push_back(I);
  }

  void run() {
    lex();
    while (Tok.isNot(tok::eof)) {
      if (!StatementStart)
        StatementStart = offset();
      if (Tok.is(tok::raw_identifier)) {
        StringRef Id = Tok.getRawIdentifier();
        bool AfterEnum = PrevIdentifier == "enum";
        PrevIdentifier = Id;
        if (Id == "namespace") {
          lex();
          openNamespace();
          continue;
        }
        if (Id == "__global__") {
          kernelAt();
          continue;
        }
        if ((Id == "class" || Id == "struct" || Id == "union") && !AfterEnum) {
          recordAt(Id);
          continue;
        }
      } else {
        PrevIdentifier = "";
      }
      if (Tok.is(tok::l_brace))
        Scopes.push_back({"", std::nullopt});
      else if (Tok.is(tok::r_brace))
        closeScope();
      if (Tok.isOneOf(tok::l_brace, tok::r_brace, tok::semi))
        StatementStart = std::nullopt;
      lex();
    }
  }

private:
  struct Scope {
    std::string Name;
    std::optional<size_t> Record; ///< A lexer-found record awaiting its end.
  };

  /// Next token. Conditionals passed on the way keep the brace structure:
  /// the scope stack in the main scan, the depth inside a skipped group.
  void lex() {
    Conds.clear();
    Stream.next(Tok, Conds);
    for (Conditional C : Conds) {
      if (GroupDepth)
        GroupBranches->apply(C, *GroupDepth);
      else
        ScopeBranches.apply(C, Scopes);
      StatementStart = std::nullopt;
    }
  }
  unsigned offset() const { return Stream.offset(Tok); }
  unsigned line(unsigned Offset) const { return SM.getLineNumber(FID, Offset); }

  std::string qualified(StringRef Name) const {
    std::string Q;
    for (const Scope &S : Scopes)
      if (!S.Name.empty())
        Q += S.Name + "::";
    return Q + Name.str();
  }

  void closeScope() {
    if (Scopes.empty())
      return;
    if (Scopes.back().Record) {
      Definition &D = Defs[*Scopes.back().Record];
      D.ByteEnd = offset() + Tok.getLength();
      D.LineEnd = line(D.ByteEnd - 1);
    }
    Scopes.pop_back();
  }

  /// After `namespace`: `a::b {` opens named scopes, `{` an anonymous one.
  void openNamespace() {
    std::string Name;
    while (Tok.isOneOf(tok::raw_identifier, tok::coloncolon)) {
      Name += Tok.is(tok::coloncolon) ? "::" : Tok.getRawIdentifier().str();
      lex();
    }
    if (Tok.is(tok::l_brace)) {
      Scopes.push_back({Name.empty() ? "(anonymous namespace)" : Name, std::nullopt});
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
    BranchTracker<unsigned> Branches;
    unsigned *SavedDepth = GroupDepth;
    BranchTracker<unsigned> *SavedBranches = GroupBranches;
    GroupDepth = &Depth;
    GroupBranches = &Branches;
    bool Closed = false;
    while (true) {
      lex();
      if (Tok.is(tok::eof))
        break;
      if (Tok.is(Open))
        ++Depth;
      else if (Tok.is(Close) && --Depth == 0) {
        Closed = true;
        break;
      }
    }
    GroupDepth = SavedDepth;
    GroupBranches = SavedBranches;
    return Closed;
  }

  /// Skips template arguments `<...>` starting at the current token, nested
  /// ones and `>>` included; leaves the closing token current.
  bool skipAngles() {
    int Depth = 1;
    while (Depth > 0) {
      lex();
      if (Tok.isOneOf(tok::eof, tok::semi, tok::l_brace))
        return false;
      if (Tok.is(tok::less))
        ++Depth;
      else if (Tok.is(tok::greater))
        --Depth;
      else if (Tok.is(tok::greatergreater))
        Depth -= 2;
      else if (Tok.isOneOf(tok::l_paren, tok::l_square) && !skipGroup())
        return false;
    }
    return true;
  }

  /// The parsed record of this name whose span covers \p Line, if any.
  Definition *parsedRecordCovering(StringRef Name, unsigned Line) {
    for (size_t I : Parsed) {
      Definition &D = Defs[I];
      if (isRecordKind(D.Kind) && D.Name == Name && D.LineStart <= Line &&
          Line <= D.LineEnd)
        return &D;
    }
    return nullptr;
  }

  /// Whether a parsed kernel spans \p Line. Kernels do not nest, so any
  /// kernel there is this one, whatever name a macro gave it
  /// (`__global__ void KNAME(foo)(int*)`).
  bool parsedKernelCovers(unsigned Line) const {
    return llvm::any_of(Parsed, [&](size_t I) {
      const Definition &D = Defs[I];
      return D.Kind == DefinitionKind::Kernel && D.LineStart <= Line && Line <= D.LineEnd;
    });
  }

  Definition &add(StringRef Name, DefinitionKind Kind, unsigned Start) {
    Definition D;
    StringRef Short = Name.rsplit("::").second;
    D.Name = Short.empty() ? Name.str() : Short.str();
    D.QualifiedName = qualified(Name);
    D.Kind = Kind;
    D.ByteStart = Start;
    D.LineStart = line(Start);
    D.FoundByLexer = true;
    Defs.push_back(std::move(D));
    return Defs.back();
  }

  /// At `class`/`struct`/`union`: a definition if the head reaches `{`.
  void recordAt(StringRef Keyword) {
    unsigned Start = StatementStart.value_or(offset());
    unsigned KeywordLine = line(offset());
    DefinitionKind Kind = Keyword == "union"    ? DefinitionKind::Union
                          : Keyword == "struct" ? DefinitionKind::Struct
                                                : DefinitionKind::Class;
    std::string Name;
    int Angles = 0;
    std::optional<unsigned> BasesBegin;
    lex();
    while (Tok.isNot(tok::eof)) {
      if (Tok.is(tok::less)) {
        ++Angles;
      } else if (Tok.is(tok::greater) && Angles > 0) {
        --Angles;
      } else if (Tok.is(tok::greatergreater) && Angles > 1) {
        Angles -= 2;
      } else if (Angles > 0) {
        if (Tok.isOneOf(tok::l_paren, tok::l_square) && !skipGroup())
          return;
        if (Tok.isOneOf(tok::semi, tok::l_brace, tok::r_brace))
          return; // not a template argument list after all
      } else if (Tok.is(tok::l_brace)) {
        break;
      } else if (BasesBegin) {
        if (Tok.isOneOf(tok::l_paren, tok::l_square) && !skipGroup())
          return;
        if (Tok.isOneOf(tok::semi, tok::r_brace))
          return;
      } else if (Tok.is(tok::raw_identifier)) {
        StringRef Id = Tok.getRawIdentifier();
        if (Id != "final")
          Name = Id.str();
      } else if (Tok.is(tok::coloncolon)) {
        Name += "::";
      } else if (Tok.is(tok::colon)) {
        BasesBegin = offset() + 1;
      } else if (Tok.is(tok::l_paren) && isAttributeLike(Name)) {
        if (!skipGroup())
          return;
        Name.clear();
      } else if (Tok.is(tok::l_square)) {
        if (!skipGroup()) // [[attributes]]
          return;
      } else {
        return; // `;` forward declaration, `*` a use, `>` a template parameter
      }
      lex();
    }
    if (Tok.isNot(tok::l_brace))
      return;
    std::vector<std::string> Bases;
    if (BasesBegin)
      Bases = splitBases(Buffer.slice(*BasesBegin, offset()));
    StringRef Short = StringRef(Name).rsplit("::").second;
    if (Short.empty())
      Short = Name;
    Scope S{Short.str(), std::nullopt};
    if (Name.empty() || isAttributeLike(Name)) {
      S.Name.clear(); // an anonymous struct
    } else if (Definition *P = parsedRecordCovering(Short, KeywordLine)) {
      if (P->Bases.empty())
        P->Bases = std::move(Bases);
    } else {
      Definition &D = add(Name, Kind, Start);
      D.Bases = std::move(Bases);
      D.IsTemplate = Buffer.slice(Start, offset()).contains("template");
      S.Record = Defs.size() - 1;
    }
    Scopes.push_back(std::move(S));
    StatementStart = std::nullopt;
    lex();
  }

  void kernelAt() {
    unsigned Start = StatementStart.value_or(offset());
    unsigned GlobalLine = line(offset());
    // The name is the identifier before the last parenthesized group ahead
    // of the body: in `__global__ void LAUNCH_BOUNDS(256) k<int>(T* x) {`
    // an attribute macro comes first, template arguments come between.
    std::string Name, Pending;
    lex();
    while (Tok.isNot(tok::eof) && !Tok.isOneOf(tok::semi, tok::l_brace)) {
      if (Tok.is(tok::raw_identifier)) {
        if (!StringRef(Pending).ends_with("::"))
          Pending.clear();
        Pending += Tok.getRawIdentifier().str();
      } else if (Tok.is(tok::coloncolon)) {
        Pending += "::";
      } else if (Tok.is(tok::less) && !Pending.empty()) {
        if (!skipAngles())
          return;
      } else if (Tok.isOneOf(tok::l_paren, tok::l_square)) {
        if (Tok.is(tok::l_paren) && !Pending.empty() && !isAttributeLike(Pending))
          Name = Pending;
        if (!skipGroup())
          return;
        Pending.clear();
      } else {
        Pending.clear();
      }
      lex();
    }
    if (Name.empty())
      return;
    bool Known = parsedKernelCovers(GlobalLine);
    std::optional<size_t> Index;
    if (!Known) {
      Definition &D = add(Name, DefinitionKind::Kernel, Start);
      D.ByteEnd = offset() + Tok.getLength();
      D.LineEnd = line(D.ByteEnd - 1);
      D.IsDeclaration = Tok.isNot(tok::l_brace);
      Index = Defs.size() - 1;
    }
    StatementStart = std::nullopt;
    // The body is scanned like any block (it may define local classes); the
    // kernel ends with it.
    if (Tok.is(tok::l_brace))
      Scopes.push_back({"", Index});
    if (Index)
      Defs[*Index].IsTemplate = Buffer.slice(Start, offset()).contains("template");
    lex();
  }

  FileID FID;
  const SourceManager &SM;
  std::vector<Definition> &Defs;
  DirectiveAwareLexer Stream;
  SmallVector<Conditional, 2> Conds;
  BranchTracker<std::vector<Scope>> ScopeBranches;
  unsigned *GroupDepth = nullptr; ///< Set while a group is being skipped.
  BranchTracker<unsigned> *GroupBranches = nullptr;
  StringRef Buffer;
  Token Tok;
  StringRef PrevIdentifier;
  std::vector<Scope> Scopes;
  std::optional<unsigned> StatementStart;
  std::vector<size_t> Parsed; ///< Indices of Clang's kernels and records.
};

} // namespace

void recoverDefinitionsMissedByParser(FileID FID, const SourceManager &SM,
                                      const LangOptions &LangOpts,
                                      std::vector<Definition> &Defs) {
  bool Invalid = false;
  SM.getBufferData(FID, &Invalid);
  if (Invalid)
    return;
  LexicalScanner(FID, SM, LangOpts, Defs).run();
  findTorchOpRegistrations(SM.getBufferData(FID), LangOpts, Defs);
  // A record whose closing brace never came (unbalanced #if branches, the
  // end of the file) ends where its head does; its end was never set, which
  // at byte 0 leaves no byte before the start but line 0 (found by
  // ekka-fuzz-cxx_indexer).
  for (Definition &D : Defs)
    if (D.FoundByLexer && (D.ByteEnd < D.ByteStart || D.LineEnd < D.LineStart)) {
      D.ByteEnd = D.ByteStart;
      D.LineEnd = D.LineStart;
    }
}

} // namespace ekka
