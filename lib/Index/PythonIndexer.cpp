//===- PythonIndexer.cpp - Python definitions via tree-sitter ------------===//
#include "ekka/Index/PythonIndexer.h"
#include "PythonIndexerInternal.h"
#include "ekka/Support/Error.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <cstdlib>
#include <cstring>
#include <malloc.h>
#include <memory>

extern "C" const TSLanguage *tree_sitter_python(void);

using namespace llvm;

namespace ekka {

namespace {

/// Symbols and fields of the grammar, looked up once.
struct PythonGrammar {
  const TSLanguage *Lang = tree_sitter_python();
  TSSymbol Module, Block, ClassDef, FunctionDef, Decorated, Decorator, If,
      Elif, Else, Try, Except, ExceptGroup, Finally, With, For, While, Match,
      Case, Error, Import, ImportFrom, DottedName, AliasedImport,
      RelativeImport, ImportPrefix, KeywordArgument, DictionarySplat, Comment,
      Identifier;
  TSFieldId Name, Body, Superclasses, Definition, ModuleName, Alias;

  PythonGrammar() {
    auto Sym = [&](const char *N) {
      return ts_language_symbol_for_name(Lang, N, strlen(N), /*named=*/true);
    };
    auto Field = [&](const char *N) {
      return ts_language_field_id_for_name(Lang, N, strlen(N));
    };
    Module = Sym("module");
    Block = Sym("block");
    ClassDef = Sym("class_definition");
    FunctionDef = Sym("function_definition");
    Decorated = Sym("decorated_definition");
    Decorator = Sym("decorator");
    If = Sym("if_statement");
    Elif = Sym("elif_clause");
    Else = Sym("else_clause");
    Try = Sym("try_statement");
    Except = Sym("except_clause");
    ExceptGroup = Sym("except_group_clause");
    Finally = Sym("finally_clause");
    With = Sym("with_statement");
    For = Sym("for_statement");
    While = Sym("while_statement");
    Match = Sym("match_statement");
    Case = Sym("case_clause");
    Error = Sym("ERROR");
    Import = Sym("import_statement");
    ImportFrom = Sym("import_from_statement");
    DottedName = Sym("dotted_name");
    AliasedImport = Sym("aliased_import");
    RelativeImport = Sym("relative_import");
    ImportPrefix = Sym("import_prefix");
    KeywordArgument = Sym("keyword_argument");
    DictionarySplat = Sym("dictionary_splat");
    Comment = Sym("comment");
    Identifier = Sym("identifier");
    Name = Field("name");
    Body = Field("body");
    Superclasses = Field("superclasses");
    Definition = Field("definition");
    ModuleName = Field("module_name");
    Alias = Field("alias");
  }

  /// Statements whose blocks can hold definitions of the enclosing scope.
  bool isContainer(TSSymbol S) const {
    return S == Module || S == Block || S == If || S == Elif || S == Else ||
           S == Try || S == Except || S == ExceptGroup || S == Finally ||
           S == With || S == For || S == While || S == Match || S == Case ||
           S == Error;
  }
};

const PythonGrammar &grammar() {
  static const PythonGrammar G;
  return G;
}

/// What tree-sitter holds while this thread parses a file, and the most
/// it may. Its error recovery can cost far more than the file: a broken
/// line indented by 55 tabs after a broken `def …:` holds 1.6 MB each, so
/// 4.5 KB of them held 65 MB, and 362 KB of a fuzzer's such text held
/// 1.4 GB and took 7 s (a 4 MiB file, the default --max-file-size, would
/// hold some 16 GB). A parse that passes its limit is cancelled
/// (tree-sitter polls Cancel every 100 of its actions) and the file is
/// refused. Counted by allocations, not by time, so a file is refused or
/// not alike on every machine and under any load.
struct ParseMemory {
  int64_t Held = 0;  ///< Bytes allocated since the parse began, less those freed.
  int64_t Limit = 0; ///< 0 while no parse runs on this thread.
  size_t Cancel = 0;
};
thread_local ParseMemory Memory;

void account(int64_t Bytes) {
  Memory.Held += Bytes;
  if (Memory.Limit && Memory.Held > Memory.Limit)
    Memory.Cancel = 1;
}

void *allocated(void *P) {
  if (!P)
    report_bad_alloc_error("tree-sitter: out of memory");
  account(int64_t(malloc_usable_size(P)));
  return P;
}
void *countedMalloc(size_t N) { return allocated(std::malloc(N)); }
void *countedCalloc(size_t N, size_t Size) { return allocated(std::calloc(N, Size)); }
void *countedRealloc(void *Old, size_t N) {
  int64_t Before = Old ? int64_t(malloc_usable_size(Old)) : 0;
  void *P = std::realloc(Old, N);
  if (!P && N)
    report_bad_alloc_error("tree-sitter: out of memory");
  account((P ? int64_t(malloc_usable_size(P)) : 0) - Before);
  return P;
}
void countedFree(void *P) {
  if (P)
    account(-int64_t(malloc_usable_size(P)));
  std::free(P);
}

/// The most a parse of \p SourceSize bytes may hold, with 32 MiB for a
/// small file's own: tree-sitter's tree and stacks take 12 to 60 bytes a
/// byte for torch's and huggingface_hub's largest files (0.4 to 1.4 MB),
/// and up to 280 for the densest code (a statement `a` on every line; a
/// list of two million numbers, 193), where the recovery above takes
/// about 4,000.
int64_t parseMemoryLimit(size_t SourceSize) {
  return (int64_t(32) << 20) + 512 * int64_t(SourceSize);
}

struct ParserDeleter {
  void operator()(TSParser *P) const { ts_parser_delete(P); }
};
struct TreeDeleter {
  void operator()(TSTree *T) const { ts_tree_delete(T); }
};

TSParser *threadParser() {
  thread_local std::unique_ptr<TSParser, ParserDeleter> Parser;
  if (!Parser) {
    static const bool Counted = (ts_set_allocator(countedMalloc, countedCalloc,
                                                  countedRealloc, countedFree),
                                 true);
    (void)Counted;
    Parser.reset(ts_parser_new());
    ts_parser_set_language(Parser.get(), grammar().Lang);
    ts_parser_set_cancellation_flag(Parser.get(), &Memory.Cancel);
  }
  return Parser.get();
}

struct Scope {
  std::string Prefix; ///< Qualified-name prefix for definitions in it.
  int ClassIndex = -1; ///< The class whose body this is, or -1.
  bool IsModule = true;
};

class PythonFileIndexer {
public:
  PythonFileIndexer(StringRef Source, StringRef ModuleName, bool IsPackageInit)
      : Source(Source), G(grammar()), ModuleName(ModuleName),
        IsPackageInit(IsPackageInit) {}

  Expected<FileDefinitions> run() {
    TSParser *Parser = threadParser();
    int64_t Limit = parseMemoryLimit(Source.size());
    Memory = {0, Limit, 0};
    std::unique_ptr<TSTree, TreeDeleter> Tree(
        ts_parser_parse_string(Parser, nullptr, Source.data(), uint32_t(Source.size())));
    Memory.Limit = 0;
    if (!Tree) {
      // Cancelled: what the parse held is let go (a parser keeps it to
      // resume).
      ts_parser_reset(Parser);
      return makeError("recovering from its syntax errors would take more than " +
                       Twine(Limit >> 20) + " MiB of memory");
    }
    Scope Top;
    Top.Prefix = ModuleName.str();
    TSNode Root = ts_tree_root_node(Tree.get());
    visit(Root, Top);
    findPythonOpRegistrations(Root, Source, ModuleName, Out);
    Out.ParseErrors = countErrors(Root);
    return std::move(Out);
  }

private:
  /// Syntax errors tree-sitter recovered from: ERROR and MISSING nodes,
  /// looked for only below nodes that contain one.
  static unsigned countErrors(TSNode N) {
    if (!ts_node_has_error(N))
      return 0;
    if (ts_node_is_missing(N) || ts_node_is_error(N))
      return 1;
    unsigned Count = 0;
    forEachChild(N, [&](TSNode C) { Count += countErrors(C); });
    return Count;
  }

  StringRef text(TSNode N) const {
    uint32_t B = ts_node_start_byte(N), E = ts_node_end_byte(N);
    return Source.slice(B, E);
  }

  void visit(TSNode N, const Scope &S) {
    TSSymbol Sym = ts_node_symbol(N);
    if (Sym == G.Decorated) {
      TSNode Def = ts_node_child_by_field_id(N, G.Definition);
      if (ts_node_is_null(Def))
        return;
      std::vector<std::string> Decorators;
      forEachChild(N, [&](TSNode C) {
        if (ts_node_symbol(C) == G.Decorator)
          Decorators.push_back(text(C).drop_front(1).trim().str());
      });
      addDefinition(Def, N, std::move(Decorators), S);
    } else if (Sym == G.ClassDef || Sym == G.FunctionDef) {
      addDefinition(N, N, {}, S);
    } else if (G.isContainer(Sym)) {
      forEachChild(N, [&](TSNode C) {
        if (ts_node_is_named(C))
          visit(C, S);
      });
    } else if (S.IsModule && (Sym == G.Import || Sym == G.ImportFrom)) {
      addImports(N, Sym == G.ImportFrom);
    }
  }

  void addDefinition(TSNode Def, TSNode Outer,
                     std::vector<std::string> Decorators, const Scope &S) {
    TSNode NameNode = ts_node_child_by_field_id(Def, G.Name);
    if (ts_node_is_null(NameNode))
      return;
    bool IsClass = ts_node_symbol(Def) == G.ClassDef;
    Definition D;
    D.Name = text(NameNode).str();
    D.QualifiedName = S.Prefix.empty() ? D.Name : S.Prefix + "." + D.Name;
    D.Kind = IsClass ? DefinitionKind::Class
             : S.ClassIndex >= 0 ? DefinitionKind::Method
                                 : DefinitionKind::Function;
    D.LineStart = ts_node_start_point(Outer).row + 1;
    D.LineEnd = ts_node_end_point(Outer).row + 1;
    D.ByteStart = ts_node_start_byte(Outer);
    D.ByteEnd = ts_node_end_byte(Outer);
    D.Decorators = std::move(Decorators);
    if (IsClass) {
      TSNode Args = ts_node_child_by_field_id(Def, G.Superclasses);
      if (!ts_node_is_null(Args))
        forEachChild(Args, [&](TSNode A) {
          TSSymbol AS = ts_node_symbol(A);
          // `metaclass=M`, other keywords and `**kw` configure the class;
          // they are not bases.
          if (ts_node_is_named(A) && AS != G.KeywordArgument &&
              AS != G.DictionarySplat && AS != G.Comment)
            D.Bases.push_back(text(A).str());
        });
    } else {
      TSNode First = ts_node_child(Def, 0);
      D.IsAsync = !ts_node_is_null(First) && !ts_node_is_named(First) &&
                  text(First) == "async";
      if (S.ClassIndex >= 0) {
        // A property's setter and @overload variants are one method.
        std::vector<std::string> &Methods = Out.Definitions[S.ClassIndex].Methods;
        if (llvm::find(Methods, D.Name) == Methods.end())
          Methods.push_back(D.Name);
      }
    }

    Scope Inner;
    Inner.IsModule = false;
    if (IsClass) {
      Inner.Prefix = D.QualifiedName;
      Inner.ClassIndex = int(Out.Definitions.size());
    } else {
      Inner.Prefix = D.QualifiedName + ".<locals>";
    }
    Out.Definitions.push_back(std::move(D));
    TSNode Body = ts_node_child_by_field_id(Def, G.Body);
    if (!ts_node_is_null(Body))
      visit(Body, Inner);
  }

  /// The absolute module that a `from` clause names, resolving leading dots
  /// against this file's package.
  std::optional<std::string> resolveFromModule(TSNode ModNode) {
    if (ts_node_symbol(ModNode) != G.RelativeImport)
      return text(ModNode).str();
    unsigned Dots = 0;
    std::string Rest;
    forEachChild(ModNode, [&](TSNode C) {
      if (ts_node_symbol(C) == G.ImportPrefix)
        Dots = unsigned(text(C).count('.'));
      else if (ts_node_symbol(C) == G.DottedName)
        Rest = text(C).str();
    });
    // `.` is this file's package: the module itself for an __init__.py,
    // its parent otherwise; each further dot goes one package up.
    StringRef Package = ModuleName;
    auto Parent = [](StringRef M) {
      return M.contains('.') ? M.rsplit('.').first : StringRef();
    };
    if (!IsPackageInit)
      Package = Parent(Package);
    for (unsigned I = 1; I < Dots; ++I) {
      if (Package.empty())
        return std::nullopt; // beyond the top-level package: binds nothing
      Package = Parent(Package);
    }
    if (Package.empty())
      return Dots ? std::optional<std::string>() : Rest;
    return Rest.empty() ? Package.str() : (Package + "." + Rest).str();
  }

  void addImports(TSNode N, bool IsFrom) {
    std::string FromModule;
    TSNode ModNode = ts_node_child_by_field_id(N, G.ModuleName);
    if (IsFrom) {
      if (ts_node_is_null(ModNode))
        return;
      std::optional<std::string> Resolved = resolveFromModule(ModNode);
      if (!Resolved)
        return;
      FromModule = std::move(*Resolved);
    }
    forEachChild(N, [&](TSNode C) {
      if (IsFrom && ts_node_eq(C, ModNode))
        return; // `from X import ...`: X is the module, not a binding
      TSSymbol CS = ts_node_symbol(C);
      std::string Target, Alias;
      if (CS == G.DottedName) {
        Target = text(C).str();
        // `import a.b` binds `a` (to module `a`); `from m import a` binds `a`.
        Alias = IsFrom ? Target : StringRef(Target).split('.').first.str();
        if (!IsFrom)
          Target = Alias;
      } else if (CS == G.AliasedImport) {
        TSNode NameN = ts_node_child_by_field_id(C, G.Name);
        TSNode AliasN = ts_node_child_by_field_id(C, G.Alias);
        if (ts_node_is_null(NameN) || ts_node_is_null(AliasN))
          return;
        Target = text(NameN).str();
        Alias = text(AliasN).str();
      } else {
        return;
      }
      if (IsFrom)
        Target = FromModule.empty() ? Target : FromModule + "." + Target;
      Out.Imports.push_back({std::move(Alias), std::move(Target)});
    });
  }

  StringRef Source;
  const PythonGrammar &G;
  StringRef ModuleName;
  bool IsPackageInit;
  FileDefinitions Out;
};

} // namespace

Expected<FileDefinitions> indexPythonSource(StringRef Source, StringRef ModuleName,
                                            bool IsPackageInit) {
  return PythonFileIndexer(Source, ModuleName, IsPackageInit).run();
}

bool PythonModuleNamer::isPackageDir(StringRef Dir) {
  auto It = PackageDirs.find(Dir);
  if (It != PackageDirs.end())
    return It->second;
  SmallString<256> Init(Dir);
  sys::path::append(Init, "__init__.py");
  bool IsPackage = sys::fs::exists(Init);
  PackageDirs[Dir] = IsPackage;
  return IsPackage;
}

std::string PythonModuleNamer::moduleName(StringRef Path) {
  StringRef Stem = sys::path::stem(Path);
  SmallVector<StringRef, 8> Parts;
  if (Stem != "__init__")
    Parts.push_back(Stem);
  StringRef Dir = sys::path::parent_path(Path);
  while (!Dir.empty() && isPackageDir(Dir)) {
    Parts.push_back(sys::path::filename(Dir));
    StringRef Parent = sys::path::parent_path(Dir);
    if (Parent == Dir)
      break;
    Dir = Parent;
  }
  std::string Name;
  for (auto It = Parts.rbegin(); It != Parts.rend(); ++It) {
    if (!Name.empty())
      Name += '.';
    Name += It->str();
  }
  return Name;
}

} // namespace ekka
