//===- CommandLine.cpp ----------------------------------------------------===//
#include "ekka/Support/CommandLine.h"
#include "ekka/Support/Error.h"
#include "ekka/Support/Printable.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdio>
#include <cstdlib>
#include <unistd.h>

using namespace llvm;

namespace ekka {

namespace {

/// Holds back what the process writes on stderr (file descriptor 2) from its
/// construction to held(). LLVM prints a value its parsers refuse ("for the
/// --threshold option: 'abc' value invalid ...") on errs() itself, not on the
/// stream ParseCommandLineOptions is given: only so can it be said as a tool
/// says an error. Where stderr cannot be held back, it is left alone.
class HeldStderr {
public:
  HeldStderr() : File(std::tmpfile()), Saved(File ? dup(STDERR_FILENO) : -1) {
    if (Saved >= 0 && dup2(fileno(File), STDERR_FILENO) < 0) {
      close(Saved);
      Saved = -1;
    }
  }
  ~HeldStderr() {
    restore();
    if (File)
      std::fclose(File);
  }

  /// Puts stderr back and returns what was written on it meanwhile.
  std::string held() {
    restore();
    std::string Text;
    if (!File || std::fseek(File, 0, SEEK_SET) != 0)
      return Text;
    char Buffer[4096];
    while (size_t N = std::fread(Buffer, 1, sizeof(Buffer), File))
      Text.append(Buffer, N);
    return Text;
  }

private:
  void restore() {
    if (Saved < 0)
      return;
    errs().flush();
    dup2(Saved, STDERR_FILENO);
    close(Saved);
    Saved = -1;
  }

  std::FILE *File;
  int Saved;
};

} // namespace

void parseCommandLineOrExit(int Argc, const char *const *Argv, StringRef Overview) {
  // Every error LLVM has goes to errs(), in the order of the arguments, and
  // is held back there. --help and --version exit inside, printing on stdout.
  HeldStderr Stderr;
  bool Parsed = cl::ParseCommandLineOptions(Argc, Argv, Overview, &errs());
  std::string Held = Stderr.held();
  if (Parsed) {
    errs() << Held;
    return;
  }
  // The first error, which LLVM begins with the program's name and no
  // "error:": said as every Ekka error is.
  std::string Tool = sys::path::filename(Argc > 0 ? Argv[0] : "").str();
  StringRef First = StringRef(Held).trim().split('\n').first.trim();
  First.consume_front(Tool + ": ");
  First.consume_front("error: ");
  std::string Message = First.empty() ? "invalid command line" : First.str();
  // "Unknown command line argument", "Not enough positional ...": lower
  // case, as the tools' own messages, for a word that is not a name.
  if (Message.size() > 1 && isUpper(Message[0]) && isLower(Message[1]))
    Message[0] = toLower(Message[0]);
  // LLVM's guess at a misspelt option comes on a line of its own ("Did you
  // mean '--target'?"): kept, on the one line, before the pointer to --help.
  for (StringRef Line : split(Held, '\n')) {
    Line = Line.trim();
    Line.consume_front(Tool + ": ");
    if (!Line.consume_front("Did you mean "))
      continue;
    std::string Guess = " (did you mean " + Line.str() + ")";
    size_t Try = Message.find(".  Try: ");
    Message.insert(Try == std::string::npos ? Message.size() : Try, Guess);
    break;
  }
  // Escaped, as every error line: LLVM quotes the argument as given.
  errs() << printable(Tool) << ": error: " << printable(Message) << "\n";
  std::exit(ExitInputError);
}

} // namespace ekka
