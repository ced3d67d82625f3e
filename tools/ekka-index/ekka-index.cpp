//===- ekka-index.cpp - Build and query Ekka's code index -----------------===//
//
// A thin driver over the Index library: parse options, call buildIndex or a
// CodeIndex query, print. Exit codes: 0 success, 1 a query found nothing,
// 2 usage or input error.
//
//===----------------------------------------------------------------------===//
#include "ekka/Config.h"
#include "ekka/Index/CodeIndex.h"
#include "ekka/Index/IndexBuilder.h"
#include "ekka/Support/CommandLine.h"
#include "ekka/Support/Error.h"
#include "ekka/Support/Progress.h"
#include "ekka/Support/Plural.h"
#include "ekka/Support/Printable.h"

#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/WithColor.h"
#include "llvm/Support/raw_ostream.h"

using namespace llvm;
using namespace ekka;

namespace {

constexpr const char *Tool = "ekka-index";

cl::OptionCategory BuildCategory("ekka-index build options");
cl::OptionCategory QueryCategory("ekka-index query options");

cl::SubCommand BuildCmd(
    "build",
    "Index Python, C, C++ and CUDA sources into an SQLite index.\n"
    "  ekka-index build PATH... -o INDEX\n"
    "  Re-running on an existing INDEX re-parses only files whose content changed.");
cl::SubCommand QueryCmd(
    "query",
    "Query an index.\n"
    "  ekka-index query INDEX get_class_definition NAME   every class NAME, with source\n"
    "  ekka-index query INDEX subclasses NAME             classes deriving from NAME\n"
    "  ekka-index query INDEX find_kernel SYMBOL          a kernel by mangled name (as\n"
    "                                                     CUPTI reports it) or demangled name\n"
    "  ekka-index query INDEX find_op NAME                a PyTorch custom op by registered\n"
    "                                                     name (zoo::paged_attention): its\n"
    "                                                     TORCH_LIBRARY registrations and the\n"
    "                                                     functions implementing it\n"
    "  ekka-index query INDEX search TEXT                 definitions whose name contains TEXT\n"
    "  NAME may be simple (LlamaAttention), qualified\n"
    "  (transformers.models.llama.modeling_llama.LlamaAttention) or a qualified suffix\n"
    "  (modeling_llama.LlamaAttention). Exit code 1 when nothing matches.");
cl::SubCommand InfoCmd("info", "Print what an index holds.\n  ekka-index info INDEX");

// build
cl::list<std::string> BuildPaths(cl::Positional, cl::sub(BuildCmd),
                                 cl::desc("<repository or file>..."),
                                 cl::cat(BuildCategory));
cl::opt<std::string> OutputIndex("o", cl::sub(BuildCmd),
                                 cl::value_desc("INDEX"),
                                 cl::desc("The index to create or update (SQLite)"),
                                 cl::cat(BuildCategory));
cl::opt<unsigned> Jobs("j", cl::Prefix, cl::sub(BuildCmd), cl::init(0), cl::value_desc("N"),
                       cl::desc("Worker threads (default 0: one per core)"),
                       cl::cat(BuildCategory));
cl::opt<std::string> Languages(
    "languages", cl::sub(BuildCmd), cl::init("python,cxx"),
    cl::desc("What to index: python, cxx (C, C++ and CUDA) or both (default python,cxx)"),
    cl::cat(BuildCategory));
cl::list<std::string> IncludeDirs(
    "I", cl::Prefix, cl::sub(BuildCmd), cl::value_desc("DIR"),
    cl::desc("Extra include directory for C++/CUDA, on top of the guessed "
             "include/, csrc/ and 3rdparty/*/include of each path"),
    cl::cat(BuildCategory));
cl::list<std::string> ExtraArgs("extra-arg", cl::sub(BuildCmd), cl::value_desc("ARG"),
                                cl::desc("Extra Clang argument, e.g. --extra-arg=-DUSE_FP8"),
                                cl::cat(BuildCategory));
// The defaults are IndexBuildOptions'; the help text says them from there.
const unsigned DefaultMaxFileSizeKiB = unsigned(IndexBuildOptions().MaxFileSize >> 10);
const unsigned DefaultMaxUnitMemoryMiB = unsigned(IndexBuildOptions().MaxUnitMemory >> 20);
const std::string MaxFileSizeDesc =
    "Skip larger files (usually generated code), #included ones too (default " +
    std::to_string(DefaultMaxFileSizeKiB) + " KiB)";
const std::string MaxUnitMemoryDesc =
    "Instantiate no more templates in a C++/CUDA unit whose AST has grown past "
    "this: a few lines of templates can ask for millions of classes (default " +
    std::to_string(DefaultMaxUnitMemoryMiB) + " MiB; torch/torch.h's unit takes about 300)";
cl::opt<unsigned> MaxFileSizeKiB("max-file-size", cl::sub(BuildCmd),
                                 cl::init(DefaultMaxFileSizeKiB), cl::value_desc("KiB"),
                                 cl::desc(MaxFileSizeDesc), cl::cat(BuildCategory));
cl::opt<unsigned> MaxUnitMemoryMiB("max-unit-memory", cl::sub(BuildCmd),
                                   cl::init(DefaultMaxUnitMemoryMiB), cl::value_desc("MiB"),
                                   cl::desc(MaxUnitMemoryDesc), cl::cat(BuildCategory));
cl::opt<bool> Verbose("verbose", cl::sub(BuildCmd),
                      cl::desc("Print a line per parsed or skipped file"),
                      cl::cat(BuildCategory));

// query and info
cl::list<std::string> QueryArgs(cl::Positional, cl::sub(QueryCmd),
                                cl::desc("INDEX QUERY ARGUMENT"), cl::cat(QueryCategory));
cl::opt<bool> Json("json", cl::sub(QueryCmd),
                   cl::desc("Print a JSON list of definitions (name, qualified_name, "
                            "language, kind, file, line_start, line_end, bases, "
                            "methods, source, ...)"),
                   cl::cat(QueryCategory));
cl::opt<bool> Transitive("transitive", cl::sub(QueryCmd),
                         cl::desc("subclasses: all descendants, not only direct ones"),
                         cl::cat(QueryCategory));
cl::opt<unsigned> Limit("limit", cl::sub(QueryCmd), cl::init(50),
                        cl::desc("search: at most this many results (default 50)"),
                        cl::cat(QueryCategory));
cl::list<std::string> InfoArgs(cl::Positional, cl::sub(InfoCmd),
                               cl::desc("INDEX"), cl::cat(QueryCategory));

json::Value toJSON(const IndexedDefinition &R, StringRef Query) {
  const Definition &D = R.Def;
  json::Object O{
      {"name", D.Name},
      {"qualified_name", D.QualifiedName},
      {"language", R.Language},
      {"kind", kindName(D.Kind)},
      {"file", R.File},
      {"line_start", int64_t(D.LineStart)},
      {"line_end", int64_t(D.LineEnd)},
      {"bases", json::Array(D.Bases)},
      {"methods", json::Array(D.Methods)},
      {"decorators", json::Array(D.Decorators)},
      {"is_async", D.IsAsync},
      {"is_template", D.IsTemplate},
      {"source", R.Source},
  };
  if (!D.MangledName.empty())
    O["mangled_name"] = D.MangledName;
  O["found_by"] = D.FoundByLexer ? "lexer" : "parser";
  O["is_declaration"] = D.IsDeclaration;
  if (Query == "subclasses")
    O["derives_from"] = R.Relation;
  if (Query == "find_kernel")
    O["match"] = R.Relation;
  if (Query == "find_op" && !R.Relation.empty())
    O["implements"] = StringRef(R.Relation).drop_front(strlen("implements ")).str();
  return json::Value(std::move(O));
}

std::string joined(const std::vector<std::string> &Items) {
  std::string Out;
  for (const std::string &S : Items)
    Out += (Out.empty() ? "" : ", ") + S;
  return Out;
}

void printHeader(raw_ostream &OS, const IndexedDefinition &R) {
  const Definition &D = R.Def;
  // One line, whatever the names hold: a newline in a file's name
  // would start another.
  OS << printable(D.QualifiedName) << "  " << R.Language << ' ' << (D.IsAsync ? "async " : "")
     << (D.IsTemplate ? "template " : "") << kindName(D.Kind)
     << (D.IsDeclaration ? " declaration" : "") << "  " << printable(R.File)
     << ':' << D.LineStart << '-' << D.LineEnd;
}

void printWithSource(raw_ostream &OS, const IndexedDefinition &R) {
  OS << "# ";
  printHeader(OS, R);
  OS << '\n';
  bool IsOp = R.Def.Kind == DefinitionKind::Op;
  if (!R.Def.Bases.empty())
    OS << (IsOp ? "# implemented by: " : "# bases: ") << joined(R.Def.Bases)
       << (!IsOp || R.Def.Decorators.empty() ? std::string()
           : R.Def.Decorators == std::vector<std::string>{"Fake"}
               ? " (fake implementation)"
               : " (dispatch key " + joined(R.Def.Decorators) + ")")
       << '\n';
  if (!R.Def.Methods.empty())
    OS << "# methods: " << joined(R.Def.Methods) << '\n';
  if (!R.Def.MangledName.empty())
    OS << "# mangled: " << R.Def.MangledName << '\n';
  if (IsOp)
    OS << (R.Language == "python" ? "# registered from Python (torch.library)"
                                  : "# registered in a TORCH_LIBRARY block")
       << (R.Def.IsDeclaration ? " (schema)" : "") << '\n';
  else if (R.Def.FoundByLexer)
    OS << "# found by the lexer: in code the parser did not see (an inactive #if branch, "
          "or names from a missing header)\n";
  OS << R.Source << "\n\n";
}

int runBuild() {
  if (BuildPaths.empty())
    exitWithError(Tool, makeError("build needs at least one PATH to index (see ekka-index build --help)"));
  if (OutputIndex.empty())
    exitWithError(Tool, makeError("build needs -o INDEX, the index to write (see ekka-index build --help)"));
  IndexBuildOptions Options;
  Options.Roots.assign(BuildPaths.begin(), BuildPaths.end());
  Options.IndexPath = OutputIndex;
  Options.Jobs = Jobs;
  Options.MaxFileSize = uint64_t(MaxFileSizeKiB) * 1024;
  if (MaxUnitMemoryMiB == 0)
    exitWithError(Tool, makeError("--max-unit-memory must be at least 1 (MiB)"));
  Options.MaxUnitMemory = uint64_t(MaxUnitMemoryMiB) << 20;
  Options.IncludeDirs.assign(IncludeDirs.begin(), IncludeDirs.end());
  Options.ExtraArgs.assign(ExtraArgs.begin(), ExtraArgs.end());
  Options.IndexPython = Options.IndexCxx = false;
  SmallVector<StringRef, 4> Langs;
  StringRef(Languages).split(Langs, ',', -1, false);
  for (StringRef L : Langs) {
    if (L == "python")
      Options.IndexPython = true;
    else if (L == "cxx" || L == "c++" || L == "cuda")
      Options.IndexCxx = true;
    else if (L == "both")
      Options.IndexPython = Options.IndexCxx = true;
    else
      exitWithError(Tool, makeError("--languages: unknown language '" + L +
                                    "' (expected python, cxx or both)"));
  }
  if (!Options.IndexPython && !Options.IndexCxx)
    exitWithError(Tool, makeError("--languages: nothing to index (expected python, cxx or both)"));
  // The log's lines go to stdout as they come: a progress line on the
  // terminal would be written into them.
  // The log names the repository's files, escaped where it writes them
  // (buildIndex, Printable.h), as the warnings below are.
  if (Verbose) {
    Options.Log = &outs();
    ProgressBar::disable();
  }
  IndexBuildSummary S = unwrapOrExit(Tool, buildIndex(Options));
  outs() << "indexed " << countOf(S.Files, "file") << " (" << S.Parsed << " parsed, "
         << S.Unchanged << " unchanged, " << S.Removed << " removed), "
         << countOf(S.Definitions, "definition") << ", " << S.Skipped << " skipped";
  if (!S.SkipReasons.empty()) {
    std::vector<std::pair<std::string, unsigned>> ByReason;
    for (const auto &E : S.SkipReasons)
      ByReason.push_back({E.getKey().str(), E.getValue()});
    llvm::sort(ByReason);
    std::vector<std::string> Reasons;
    for (const auto &[Reason, Count] : ByReason)
      Reasons.push_back(std::to_string(Count) + " " + Reason);
    outs() << " (" << joined(Reasons) << ")";
  }
  outs() << format(", %.2f s\n", S.Seconds);
  // What it skipped is warned of on stderr, whatever the options: the
  // first files by name, then how many more (--verbose names each).
  outs().flush();
  constexpr size_t Named = 5;
  for (size_t I = 0; I < S.SkippedFiles.size() && I < Named; ++I)
    errs() << Tool << ": warning: skipped " << printable(S.SkippedFiles[I].first) << " ("
           << S.SkippedFiles[I].second << ")\n";
  if (S.SkippedFiles.size() > Named)
    errs() << Tool << ": warning: skipped "
           << countOf(S.SkippedFiles.size() - Named, "more file") << " (--verbose names each)\n";
  return ExitSuccess;
}

int runQuery() {
  if (QueryArgs.size() != 3)
    exitWithError(Tool, makeError("query takes INDEX QUERY ARGUMENT, got " +
                                  Twine(QueryArgs.size()) +
                                  " arguments (see ekka-index query --help)"));
  StringRef Query = QueryArgs[1], Arg = QueryArgs[2];
  if (Limit == 0)
    exitWithError(Tool, makeError("--limit must be at least 1"));
  auto Index = unwrapOrExit(Tool, CodeIndex::openForReading(QueryArgs[0]));
  Expected<std::vector<IndexedDefinition>> Results =
      StringSwitch<std::function<Expected<std::vector<IndexedDefinition>>()>>(Query)
          .Case("get_class_definition", [&] { return Index->classDefinitions(Arg); })
          .Case("subclasses", [&] { return Index->subclasses(Arg, Transitive); })
          .Case("find_kernel", [&] { return Index->findKernel(Arg); })
          .Case("find_op", [&] { return Index->findOp(Arg); })
          .Case("search", [&] { return Index->search(Arg, Limit); })
          .Default([&]() -> Expected<std::vector<IndexedDefinition>> {
            return makeError("unknown query '" + Query +
                             "' (expected get_class_definition, subclasses, "
                             "find_kernel, find_op or search)");
          })();
  std::vector<IndexedDefinition> Defs = unwrapOrExit(Tool, std::move(Results));
  // Text holds the repository's names and code: escaped (Printable.h).
  PrintableStream Out(outs());
  if (Json) {
    json::Array A;
    for (const IndexedDefinition &R : Defs)
      A.push_back(toJSON(R, Query));
    outs() << formatv("{0:2}", json::Value(std::move(A))) << '\n';
  } else if (Query == "get_class_definition" || Query == "find_kernel" || Query == "find_op") {
    for (const IndexedDefinition &R : Defs) {
      if (Query == "find_op" && !R.Relation.empty())
        Out << "(" << printable(R.Relation) << ")\n";
      printWithSource(Out, R);
    }
  } else {
    for (const IndexedDefinition &R : Defs) {
      printHeader(Out, R);
      if (Query == "subclasses")
        Out << "  derives from " << printable(R.Relation);
      Out << '\n';
    }
  }
  Out.finish();
  if (Defs.empty()) {
    errs() << Tool << ": no match for " << Query << " '" << Arg << "'\n";
    return ExitFinding;
  }
  return ExitSuccess;
}

int runInfo() {
  if (InfoArgs.size() != 1)
    exitWithError(Tool, makeError("info takes one INDEX, got " + Twine(InfoArgs.size()) +
                                  " arguments"));
  auto Index = unwrapOrExit(Tool, CodeIndex::openForReading(InfoArgs[0]));
  IndexCounts C = unwrapOrExit(Tool, Index->counts());
  outs() << "files: " << C.Files << "\nskipped files: " << C.Skipped
         << "\ndefinitions: " << C.Definitions << "\nclasses: " << C.Classes
         << "\nfunctions and methods: " << C.Functions
         << "\nkernels: " << C.Kernels << "\nsubclass links: " << C.SubclassLinks
         << '\n';
  return ExitSuccess;
}

} // namespace

int main(int argc, char **argv) {
  cl::HideUnrelatedOptions({&BuildCategory, &QueryCategory});
  for (cl::SubCommand *Sub : {&BuildCmd, &QueryCmd, &InfoCmd})
    cl::HideUnrelatedOptions({&BuildCategory, &QueryCategory}, *Sub);
  cl::SetVersionPrinter([](raw_ostream &OS) { OS << "ekka-index " EKKA_VERSION "\n"; });
  parseCommandLineOrExit(
      argc, argv,
      "Ekka's code index: the static view of a diagnosis.\n\n"
      "Indexes every Python class and function (tree-sitter) and every C++/CUDA\n"
      "record, function and __global__ kernel (Clang) of one or more\n"
      "repositories into one SQLite file, then answers the questions a\n"
      "diagnosis asks: where is this class defined, what derives from it, which\n"
      "source does this CUDA kernel come from.\n\n"
      "  ekka-index build ~/src/flashinfer -o flashinfer.idx\n"
      "  ekka-index query flashinfer.idx get_class_definition BatchPrefillWithPagedKVCacheWrapper\n"
      "  ekka-index query flashinfer.idx find_kernel _ZN10flashinfer...\n\n"
      "Run 'ekka-index build --help' or 'ekka-index query --help' for each command.\n");
  if (BuildCmd)
    return runBuild();
  if (QueryCmd)
    return runQuery();
  if (InfoCmd)
    return runInfo();
  errs() << Tool << ": error: missing command: build, query or info (see ekka-index --help)\n";
  return ExitInputError;
}
