//===- ekka-tree.cpp - Print a trace's module tree ------------------------===//
#include "ekka/Config.h"
#include "ekka/Model/ModelTree.h"
#include "ekka/Support/CommandLine.h"
#include "ekka/Support/Error.h"
#include "ekka/Support/Printable.h"
#include "ekka/Trace/TraceReader.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

using namespace llvm;
using namespace ekka;

namespace {

constexpr const char *Tool = "ekka-tree";
cl::OptionCategory Category("ekka-tree options");
cl::list<std::string> Args(cl::Positional, cl::desc("TRACE"), cl::cat(Category));
cl::opt<bool> Json("json", cl::desc("Print the tree as JSON"), cl::cat(Category));
cl::opt<int> Step("step", cl::init(1), cl::cat(Category),
                  cl::desc("Which forward of the root to show (default 1)"));
cl::opt<int> Rank("rank", cl::init(-1), cl::cat(Category),
                  cl::desc("Of a distributed trace (rank-N/), which rank's tree to show "
                           "(default: the first rank present; the others are named on stderr)"));
cl::opt<bool> NoSource("no-source", cl::desc("Leave out class source file:line"),
                       cl::cat(Category));

/// One line a module: the trace's names escaped (Printable.h).
void print(raw_ostream &OS, const ModelTreeNode &N, unsigned Depth) {
  OS.indent(2 * Depth) << printable(N.Name);
  if (N.Count > 1)
    OS << " \u00d7" << N.Count;
  OS << "  " << printable(N.ClassName);
  if (!NoSource && !N.SourceFile.empty())
    OS << "  " << printable(N.SourceFile) << ":" << N.SourceLine;
  OS << "\n";
  for (const ModelTreeNode &C : N.Children)
    print(OS, C, Depth + 1);
}

json::Value toJSON(const ModelTreeNode &N) {
  json::Array Children;
  for (const ModelTreeNode &C : N.Children)
    Children.push_back(toJSON(C));
  json::Object O{{"name", N.Name},
                 {"path", N.Path},
                 {"class", N.ClassName},
                 {"class_qualname", N.ClassQualname},
                 {"count", int64_t(N.Count)},
                 {"children", std::move(Children)}};
  // Left out, as from the text: null would say the source is unknown.
  if (!NoSource)
    O["source"] = N.SourceFile.empty()
                      ? json::Value(nullptr)
                      : json::Value(N.SourceFile + ":" + std::to_string(N.SourceLine));
  return json::Value(std::move(O));
}

} // namespace

int main(int argc, char **argv) {
  cl::HideUnrelatedOptions({&Category});
  cl::SetVersionPrinter([](raw_ostream &OS) { OS << "ekka-tree " EKKA_VERSION "\n"; });
  parseCommandLineOrExit(
          argc, argv,
          "Print the module tree of a trace, repeated layers folded (layers.{0..31} \u00d732),\n"
          "with each module's class and the file:line that defines it.\n\n"
          "  ekka-tree ref.trace\n  ekka-tree tgt.trace --json\n");
  if (Args.size() != 1)
    exitWithError(Tool, makeError("expected one TRACE directory, got " + Twine(Args.size()) +
                                  " arguments (see ekka-tree --help)"));
  // -1, the default, is no choice; given, a rank is a rank-N/'s N.
  if (Rank.getNumOccurrences() && Rank < 0)
    exitWithError(Tool, makeError("--rank: expected a rank, 0 or more, got " + Twine(Rank)));
  auto Ranks = unwrapOrExit(Tool, TraceReader::openRanks(Args[0]));
  // One rank's tree: pipeline stages each ran a part of the model, so the
  // choice is said, not silent.
  auto RankOf = [](const TraceReader &R) {
    auto It = R.meta().find("rank");
    return It == R.meta().end() ? std::string("0") : It->second;
  };
  size_t Chosen = 0;
  if (Rank >= 0) {
    auto It = llvm::find_if(Ranks, [&](const auto &R) { return RankOf(*R) == std::to_string(Rank); });
    if (It == Ranks.end())
      exitWithError(Tool, makeError("--rank " + Twine(Rank) + ": '" + Args[0] +
                                    "' holds no trace of that rank"));
    Chosen = size_t(It - Ranks.begin());
  }
  if (Ranks.size() > 1) {
    std::string Others;
    for (size_t I = 0; I < Ranks.size(); ++I)
      if (I != Chosen)
        Others += (Others.empty() ? "" : ", ") + RankOf(*Ranks[I]);
    errs() << Tool << ": note: '" << Args[0] << "' has " << Ranks.size()
           << " ranks' traces: rank " << RankOf(*Ranks[Chosen])
           << "'s tree is shown (--rank N for rank " << Others << ")\n";
  }
  auto Calls = unwrapOrExit(Tool, Ranks[Chosen]->moduleCalls());
  std::vector<ModelTreeNode> Roots = buildModelTree(Calls, Step);
  if (Roots.empty())
    exitWithError(Tool, makeError("'" + Args[0] + "' has no module calls at step " + Twine(Step)));
  if (Json) {
    json::Array A;
    for (const ModelTreeNode &R : Roots)
      A.push_back(toJSON(R));
    outs() << formatv("{0:2}", json::Value(std::move(A))) << "\n";
  } else {
    for (const ModelTreeNode &R : Roots)
      print(outs(), R, 0);
  }
  return ExitSuccess;
}
