//===- TorchOpRegistrations.cpp - Custom ops registered with TORCH_LIBRARY --===//
//
// A PyTorch custom op is named in a trace by its registered name
// (`zoo::paged_attention`, vLLM's `_C::rms_norm`), not by the C++ function
// that implements it. The registration says which function that is:
//
//   TORCH_LIBRARY(zoo, m) { m.def("paged_attention(Tensor(a!) out, ...) -> ()"); }
//   TORCH_LIBRARY_IMPL(zoo, CPU, m) { m.impl("paged_attention", pagedAttention); }
//   TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) { ops.impl("x", torch::kCUDA, &x); }
//   STABLE_TORCH_LIBRARY_IMPL(_C, CUDA, m) { m.impl("x", TORCH_BOX(&x)); }
//
// A raw lexer finds these blocks (Clang skips function bodies, and the
// macros hide them in a static initializer) and records each `def` and
// `impl` as an `op` definition named `namespace::op`, whose bases are the
// implementing function (and, for an impl, its dispatch key).
//
//===----------------------------------------------------------------------===//
#include "CxxIndexerInternal.h"

#include "clang/Basic/CharInfo.h"
#include "clang/Lex/Lexer.h"

using namespace clang;
using namespace llvm;

namespace ekka {

namespace {

/// The contents of a string literal token (no escapes beyond what an op
/// schema uses): `"..."`, with any encoding prefix, or a raw string
/// `R"delim(...)delim"`.
std::string literalText(StringRef Spelling) {
  size_t Open = Spelling.find('"'), Close = Spelling.rfind('"');
  if (Open == StringRef::npos || Close <= Open)
    return "";
  StringRef Body = Spelling.substr(Open + 1, Close - Open - 1);
  if (Open > 0 && Spelling[Open - 1] == 'R') {
    // The delimiter runs up to the first '(' and mirrors after the last ')'.
    size_t Paren = Body.find('(');
    if (Paren == StringRef::npos || Body.size() < 2 * Paren + 2)
      return "";
    return Body.substr(Paren + 1, Body.size() - 2 * Paren - 2).str();
  }
  return Body.str();
}

/// A macro argument's tokens as the preprocessor would paste them: vLLM's
/// CONCAT(TORCH_EXTENSION_NAME, _cache_ops) becomes
/// `TORCH_EXTENSION_NAME_cache_ops`, the macro kept as written (as a plain
/// TORCH_EXTENSION_NAME is). Anything else is joined as written.
std::string pasted(ArrayRef<StringRef> Toks) {
  std::string Out;
  bool Paste = Toks.size() > 2 && Toks[0].ends_with("CONCAT") && Toks[1] == "(";
  for (size_t I = Paste ? 2 : 0; I < Toks.size(); ++I) {
    bool Inner = I + 1 < Toks.size() && Toks[I + 1] == "(";
    if (!Paste || (isAsciiIdentifierStart(Toks[I].front()) && !Inner))
      Out += Toks[I];
  }
  return Out;
}

class RegistrationScanner {
public:
  RegistrationScanner(StringRef Text, const LangOptions &LangOpts, std::vector<Definition> &Defs)
      : Text(Text), Lex(SourceLocation(), LangOpts, Text.begin(), Text.begin(), Text.end()),
        Defs(Defs) {}

  void run() {
    next();
    while (!Tok.is(tok::eof)) {
      if (Tok.is(tok::raw_identifier) && isBlockMacro(Tok.getRawIdentifier()))
        block();
      else
        next();
    }
  }

private:
  /// TORCH_LIBRARY*, and the stable ABI's STABLE_TORCH_LIBRARY* of the same
  /// shape.
  static bool isBlockMacro(StringRef Id) {
    Id.consume_front("STABLE_");
    return Id.starts_with("TORCH_LIBRARY");
  }

  void next() { Lex.LexFromRawLexer(Tok); }
  unsigned offset() const { return unsigned(Tok.getLocation().getRawEncoding()); }
  unsigned lineOf(unsigned Offset) const { return 1 + Text.take_front(Offset).count('\n'); }
  StringRef spelling() const { return Text.substr(offset(), Tok.getLength()); }

  /// TORCH_LIBRARY*( ns , [key ,] var ) { registrations }
  void block() {
    std::string Macro = Tok.getRawIdentifier().str();
    next();
    if (!Tok.is(tok::l_paren))
      return;
    // Arguments split at top-level commas: vLLM names a sub-library
    // CONCAT(TORCH_EXTENSION_NAME, _cache_ops), with commas of its own.
    std::vector<std::string> Args;
    SmallVector<StringRef, 8> Arg;
    unsigned Depth = 1;
    for (next(); Depth && !Tok.is(tok::eof); next()) {
      if (Tok.is(tok::l_paren)) {
        ++Depth;
      } else if (Tok.is(tok::r_paren) && --Depth == 0) {
        break;
      } else if (Tok.is(tok::comma) && Depth == 1) {
        Args.push_back(pasted(Arg));
        Arg.clear();
        continue;
      }
      Arg.push_back(spelling());
    }
    Args.push_back(pasted(Arg));
    next();
    if (Args.size() < 2 || !Tok.is(tok::l_brace) || Macro == "TORCH_LIBRARY_IMPL_DECLARATION")
      return;
    std::string Namespace = Args.front(), Var = Args.back();
    std::string Key = Args.size() >= 3 ? Args[1] : "";
    Depth = 1;
    for (next(); Depth && !Tok.is(tok::eof); next()) {
      if (Tok.is(tok::l_brace))
        ++Depth;
      else if (Tok.is(tok::r_brace))
        --Depth;
      else if (Tok.is(tok::raw_identifier) && Tok.getRawIdentifier() == Var)
        registration(Namespace, Key);
    }
  }

  /// Skips the balanced group that opens at the current token (`{...}`,
  /// `[...]`, `<...>`) and stops on its closing token. Only its own kind of
  /// bracket counts: a lambda's body may compare with `<`.
  void skipGroup(tok::TokenKind Open, tok::TokenKind Close) {
    for (int Depth = 0; !Tok.is(tok::eof); next()) {
      if (Tok.is(Open))
        ++Depth;
      else if (Tok.is(Close))
        --Depth;
      else if (Close == tok::greater && Tok.is(tok::greatergreater))
        Depth -= 2;
      else if (Close == tok::greater && Tok.is(tok::greatergreatergreater))
        Depth -= 3; // CUDA's launch token, lexed in `a<b<c<int>>>`
      if (Depth <= 0)
        return;
    }
  }

  /// Skips a lambda from its `[` to the `}` of its body.
  void skipLambda() {
    skipGroup(tok::l_square, tok::r_square);
    for (next(); !Tok.isOneOf(tok::l_brace, tok::r_paren, tok::comma, tok::eof); next())
      if (Tok.is(tok::l_paren))
        skipGroup(tok::l_paren, tok::r_paren);
    if (Tok.is(tok::l_brace))
      skipGroup(tok::l_brace, tok::r_brace);
  }

  /// Reads a registration's arguments after its name, up to the closing
  /// `)`, into names: dispatch keys, wrappers and functions. Returns the
  /// offset just past the `)`.
  unsigned registrationArguments(std::vector<std::string> &Rest) {
    std::string Arg;
    unsigned Depth = 1;
    unsigned End = offset();
    bool AfterName = false;
    // Names are split at commas and parentheses at any depth, so that
    // `torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(fn))` gives the
    // wrapper, the key and the function apart.
    for (; Depth && !Tok.is(tok::eof); next()) {
      End = offset() + Tok.getLength();
      bool Split = Tok.isOneOf(tok::l_paren, tok::r_paren, tok::comma);
      if (Split && !Arg.empty()) {
        Rest.push_back(Arg);
        Arg.clear();
      }
      if (Tok.is(tok::l_paren)) {
        ++Depth;
      } else if (Tok.is(tok::r_paren) && --Depth == 0) {
        break;
      } else if (Tok.is(tok::l_brace)) {
        skipGroup(tok::l_brace, tok::r_brace); // tags: `{stride_tag}`
      } else if (Tok.is(tok::l_square) && Arg.empty()) {
        // A lambda is its own implementation, defined right here.
        Rest.push_back(("(lambda at line " + Twine(lineOf(offset())) + ")").str());
        skipLambda();
      } else if (Tok.is(tok::less) && AfterName) {
        skipGroup(tok::less, tok::greater); // `&fn<float>` is found as `fn`
      } else if (Tok.is(tok::raw_identifier) || Tok.is(tok::coloncolon)) {
        Arg += spelling().str();
      }
      AfterName = Tok.is(tok::raw_identifier);
    }
    if (!Arg.empty())
      Rest.push_back(Arg);
    return End;
  }

  /// var . def|impl ( "name..." , args... ) ;
  void registration(const std::string &Namespace, const std::string &BlockKey) {
    unsigned Start = offset();
    next();
    if (!Tok.is(tok::period))
      return;
    next();
    if (!Tok.is(tok::raw_identifier) ||
        (Tok.getRawIdentifier() != "def" && Tok.getRawIdentifier() != "impl"))
      return;
    bool IsDef = Tok.getRawIdentifier() == "def";
    next();
    if (!Tok.is(tok::l_paren))
      return;
    next();
    std::string Schema;
    while (tok::isStringLiteral(Tok.getKind())) { // adjacent literals concatenate
      Schema += literalText(spelling());
      next();
    }
    if (Schema.empty())
      return;
    // The arguments after the name: a dispatch key, the function.
    std::vector<std::string> Rest;
    unsigned End = registrationArguments(Rest);
    StringRef Name = StringRef(Schema).split('(').first.trim();
    Name = Name.split('.').first; // an overload name: `op.out`
    Definition D;
    D.Kind = DefinitionKind::Op;
    D.Name = Name.str();
    D.QualifiedName = Namespace + "::" + D.Name;
    D.ByteStart = Start;
    D.ByteEnd = End;
    D.LineStart = lineOf(Start);
    D.LineEnd = lineOf(End > Start ? End - 1 : Start);
    D.FoundByLexer = true;
    // The implementing function: the last argument that names one
    // (`&fn`, `TORCH_FN(fn)`, the stable ABI's `TORCH_BOX(&fn)`,
    // `torch::kCUDA, fn`); dispatch keys are kept apart.
    std::string Function, Key = BlockKey;
    for (const std::string &A : Rest) {
      StringRef S(A);
      if (S.starts_with("torch::k") || S.starts_with("at::k") || S.starts_with("c10::k") ||
          S.contains("DispatchKey"))
        Key = S.rsplit("::").second.empty() ? A : S.rsplit("::").second.str();
      else if (S == "TORCH_FN" || S == "TORCH_FN_TYPE" || S == "TORCH_BOX" || S == "dispatch" ||
               S.ends_with("::dispatch") || S.empty())
        continue; // wrappers around the function
      else
        Function = S.starts_with("TORCH_FN") ? S.drop_front(8).str() : A;
    }
    if (!Function.empty())
      D.Bases.push_back(Function);
    if (!Key.empty())
      D.Decorators.push_back(Key);
    D.IsDeclaration = IsDef && Function.empty(); // a schema without an implementation
    Defs.push_back(std::move(D));
  }

  StringRef Text;
  Lexer Lex;
  Token Tok;
  std::vector<Definition> &Defs;
};

} // namespace

void findTorchOpRegistrations(StringRef Text, const LangOptions &LangOpts,
                              std::vector<Definition> &Defs) {
  if (!Text.contains("TORCH_LIBRARY"))
    return;
  RegistrationScanner(Text, LangOpts, Defs).run();
}

} // namespace ekka
