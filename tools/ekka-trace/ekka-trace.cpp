//===- ekka-trace.cpp - Record what a PyTorch program computed ------------===//
//
//   ekka-trace -o DIR [options] -- CMD ARGS...   run CMD with tracing on
//   ekka-trace show DIR                          print a trace readably
//   ekka-trace export --perfetto OUT.json DIR    its timeline, for Perfetto
//
// A thin driver: it prepares the environment that makes every Python process
// of CMD load the shim and the runtime, runs CMD, returns CMD's own exit code
// and prints a one-line summary read back from the trace.
//
//===----------------------------------------------------------------------===//
#include "ekka/Config.h"
#include "ekka/Support/CommandLine.h"
#include "ekka/Support/Error.h"
#include "ekka/Support/Executables.h"
#include "ekka/Support/Plural.h"
#include "ekka/Support/Printable.h"
#include "ekka/Trace/Timeline.h"
#include "ekka/Trace/TraceReader.h"
#include "ekka/Trace/TraceWriter.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/raw_ostream.h"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <fcntl.h>
#include <regex>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace llvm;
using namespace ekka;

extern char **environ;

namespace {

constexpr const char *Tool = "ekka-trace";

cl::OptionCategory TraceCategory("ekka-trace options");
cl::SubCommand ShowCmd("show", "Print a trace's metadata and call sequence.\n"
                               "  ekka-trace show DIR");

cl::SubCommand ExportCmd(
    "export", "Write a trace's timeline for Perfetto and chrome://tracing.\n"
              "  ekka-trace export --perfetto OUT.json DIR\n\n"
              "Module calls and ops go on the threads that ran them, GPU kernels on their\n"
              "streams (within the ops that launched them: kernel times are not recorded),\n"
              "each with args naming its trace ids and captured tensors (shard and key).\n"
              "Open OUT.json at https://ui.perfetto.dev or chrome://tracing. Needs a trace\n"
              "of format 1.8 or newer (docs/Tracing.md).");

cl::opt<std::string> OutputDir("o", cl::value_desc("DIR"),
                               cl::desc("The trace directory to write"), cl::cat(TraceCategory));
cl::opt<bool> Force("force", cl::desc("Replace a trace already in DIR"), cl::cat(TraceCategory));
cl::opt<std::string> Capture(
    "capture", cl::init("modules"), cl::value_desc("modules|none"),
    cl::desc("Capture every module call's outputs, and its inputs that no module call "
             "returned (the root's; what a parent computed with plain ops before calling a "
             "child) (default), or none of them (statistics and metadata only; the ops that "
             "--capture-ops selects are still captured)"),
    cl::cat(TraceCategory));
cl::opt<std::string> CaptureModules("capture-modules", cl::value_desc("REGEX"),
                                    cl::desc("Capture only modules whose path matches "
                                             "(and the root's inputs)"),
                                    cl::cat(TraceCategory));
cl::opt<std::string> CaptureOps("capture-ops", cl::value_desc("REGEX"),
                                cl::desc("Also capture the outputs of ops whose name matches "
                                         "(e.g. 'zoo::|aten::mm')"),
                                cl::cat(TraceCategory));
cl::opt<bool> CaptureOpInputs(
    "capture-op-inputs",
    cl::desc("Also capture the inputs of the ops --capture-ops selects, as they were when the "
             "op began (a KV-cache write's keys and slot mapping: ekka-diagnose un-pages the "
             "cache it wrote with them)"),
    cl::cat(TraceCategory));
cl::opt<bool> OpStats("op-stats", cl::desc("Statistics for every op's tensors, not only modules'"),
                      cl::cat(TraceCategory));
cl::opt<int> Steps("steps", cl::init(-1), cl::value_desc("N"),
                   cl::desc("Capture in the first N forward passes of the root only "
                            "(default: all); the root's inputs are captured in every pass"),
                   cl::cat(TraceCategory));
cl::opt<unsigned> BudgetMiB("budget", cl::init(0), cl::value_desc("MiB"),
                            cl::desc("Stop capturing after this many MiB (default 0: no limit)"),
                            cl::cat(TraceCategory));
cl::opt<bool> NoGpuKernels(
    "no-gpu-kernels",
    cl::desc("Do not trace GPU kernels: leave CUPTI to a profiler the program runs itself "
             "(torch.profiler gets no GPU events while ekka-trace holds CUPTI)"),
    cl::cat(TraceCategory));
cl::opt<bool> Timings(
    "timings",
    cl::desc("Record the tracer's own time on the program's threads, by part (op observer, "
             "module calls, statistics, GPU launch callbacks), in the trace's meta "
             "`tracer_time`: where a traced run's extra time goes"),
    cl::cat(TraceCategory));
cl::opt<bool> Native(
    "native",
    cl::desc("Trace a C++ LibTorch program started through a wrapper (a shell script): preload "
             "the runtime into every process, and trace each whose executable links LibTorch "
             "(itself or through its libraries). An executable named directly is recognised "
             "without it. Its ops and "
             "record_function scopes are traced, and its GPU kernels; "
             "C++ modules have no hooks, so no module calls"),
    cl::cat(TraceCategory));
cl::opt<std::string> Framework("framework", cl::value_desc("LABEL"),
                               cl::desc("A label stored in the trace: hf, vllm, sglang, ..."),
                               cl::cat(TraceCategory));

// main() takes the program from after `--` itself: this names it in the
// USAGE line, and holds what a user put before the `--` instead.
cl::list<std::string> MisplacedCommand(cl::Positional, cl::desc("-- CMD ARGS..."),
                                       cl::cat(TraceCategory));

cl::list<std::string> ShowArgs(cl::Positional, cl::sub(ShowCmd), cl::desc("DIR"),
                               cl::cat(TraceCategory));
cl::opt<unsigned> ShowLimit("limit", cl::sub(ShowCmd), cl::init(200),
                            cl::desc("Print at most this many module calls (default 200)"),
                            cl::cat(TraceCategory));

cl::list<std::string> ExportArgs(cl::Positional, cl::sub(ExportCmd), cl::desc("DIR"),
                                 cl::cat(TraceCategory));
cl::opt<std::string> ExportPerfetto("perfetto", cl::sub(ExportCmd), cl::value_desc("OUT.json"),
                                    cl::desc("Write Chrome trace-event JSON to this file "
                                             "('-': standard output)"),
                                    cl::cat(TraceCategory));

/// Where the shim and the runtime are: beside this executable in a build
/// tree (bin/ -> lib/), the Python package in the source tree.
struct Resources {
  std::string RuntimeLibrary, PythonDir, BootstrapDir;
  /// The torch the runtime was built against (empty: unknown, or a runtime
  /// the user named), and the runtimes built for other torches, as
  /// "VERSION=PATH" entries: a build's torch-VERSION/ directories
  /// (utils/install-vllm's), beside this build or inside it.
  std::string RuntimeTorch, OtherRuntimes;
};

/// The torch version a build's runtime library was built against, from the
/// file written beside it; empty where there is none.
std::string runtimeTorch(StringRef Library) {
  auto Buffer = MemoryBuffer::getFile((sys::path::parent_path(Library) +
                                       "/libekka_runtime.torch-version").str());
  return Buffer ? (*Buffer)->getBuffer().trim().str() : std::string();
}

/// Every runtime of \p BuildDir and of its torch-*/ builds, with their torch.
void addRuntimes(StringRef BuildDir, std::map<std::string, std::string> &Out) {
  auto Add = [&](StringRef Dir) {
    SmallString<256> Lib(Dir);
    sys::path::append(Lib, "lib", "libekka_runtime.so");
    std::string Version = runtimeTorch(Lib);
    if (!Version.empty() && sys::fs::exists(Lib))
      Out.try_emplace(Version, std::string(Lib));
  };
  Add(BuildDir);
  std::error_code EC;
  for (sys::fs::directory_iterator It(BuildDir, EC), End; It != End && !EC; It.increment(EC))
    if (sys::path::filename(It->path()).starts_with("torch-"))
      Add(It->path());
}

Resources findResources(const char *Argv0) {
  std::string Exe = sys::fs::getMainExecutable(Argv0, (void *)&findResources);
  SmallString<256> Lib(sys::path::parent_path(sys::path::parent_path(Exe)));
  sys::path::append(Lib, "lib", "libekka_runtime.so");
  Resources R;
  R.RuntimeLibrary = std::string(Lib);
  R.PythonDir = EKKA_PYTHON_SOURCE_DIR;
  R.BootstrapDir = R.PythonDir + "/ekka/_bootstrap";
  if (const char *Env = std::getenv("EKKA_RUNTIME_LIB")) {
    R.RuntimeLibrary = Env; // the user's choice: not second-guessed
    return R;
  }
  R.RuntimeTorch = runtimeTorch(R.RuntimeLibrary);
  // This build's, its torch-*/ builds', and, in such a build, the main
  // build's and its siblings'.
  std::map<std::string, std::string> Runtimes;
  StringRef Build = sys::path::parent_path(sys::path::parent_path(Exe));
  addRuntimes(Build, Runtimes);
  if (sys::path::filename(Build).starts_with("torch-"))
    addRuntimes(sys::path::parent_path(Build), Runtimes);
  for (auto &[Version, Path] : Runtimes)
    if (Version != R.RuntimeTorch)
      R.OtherRuntimes += (R.OtherRuntimes.empty() ? "" : ":") + Version + "=" + Path;
  return R;
}

std::string captureOptions() {
  std::string O;
  auto Add = [&](StringRef K, StringRef V) { O += (K + "=" + V + ";").str(); };
  if (Capture == "none")
    Add("capture", "none");
  if (!CaptureModules.empty())
    Add("modules", CaptureModules);
  if (!CaptureOps.empty())
    Add("ops", CaptureOps);
  if (OpStats)
    Add("op_stats", "1");
  if (CaptureOpInputs)
    Add("op_inputs", "1");
  if (Timings)
    Add("timings", "1");
  if (Steps >= 0)
    Add("steps", std::to_string(Steps));
  if (BudgetMiB)
    Add("budget", std::to_string(uint64_t(BudgetMiB) << 20));
  if (!Framework.empty())
    Add("framework", Framework);
  if (NoGpuKernels)
    Add("gpu_kernels", "off");
  return O;
}

/// Whether \p Dir holds a trace: its own, a rank's or (with \p Processes)
/// another process's.
bool holdsTrace(StringRef Dir, bool Processes = true) {
  if (sys::fs::exists(Dir + "/" + TraceDatabaseName))
    return true;
  std::error_code EC;
  for (sys::fs::directory_iterator It(Dir, EC), End; It != End && !EC; It.increment(EC)) {
    StringRef Name = sys::path::filename(It->path());
    if ((Name.starts_with("rank-") || (Processes && Name.starts_with("process-"))) &&
        sys::fs::exists(It->path() + "/" + TraceDatabaseName.str()))
      return true;
  }
  return false;
}

/// Holds \p Dir for this run, until ekka-trace ends however it ends (an
/// flock on the directory): a second ekka-trace writing into it at the same
/// time is refused, whose processes would find this run's trace.db taken
/// and write theirs beside it as if they were this run's. Where the file
/// system has no flock (some network ones), the run goes on unheld.
void holdDirectory(StringRef Dir, StringRef Shown) {
  int Fd = ::open(Dir.str().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (Fd < 0)
    exitWithError(Tool, makeError("cannot open '" + Shown + "': " + std::strerror(errno)));
  if (::flock(Fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK)
    exitWithError(Tool, makeError("'" + Shown + "' is being written by another ekka-trace now "
                                  "(wait for it to end, or give another -o DIR)"));
  // Fd stays open: the hold ends with the process.
}

/// The LibTorch (its libtorch_cpu.so) that the dynamic loader would give
/// \p Program, itself or through its libraries, as ldd shows it: the
/// program's own loader (\p Loader, its PT_INTERP) is asked to list what it
/// loads (`--list`, which glibc's and musl's loaders know, and which never
/// runs the program), without LD_PRELOAD (what the program needs, not what
/// the environment adds). Empty if it names none, or could not be asked.
std::string libTorchOf(StringRef Loader, StringRef Program) {
  SmallString<128> Listing;
  if (sys::fs::createTemporaryFile("ekka-trace-ldd", "txt", Listing))
    return "";
  std::vector<StringRef> Args = {Loader, "--list", Program};
  std::vector<std::string> EnvStrings;
  for (char **E = environ; *E; ++E)
    if (!StringRef(*E).starts_with("LD_PRELOAD=") &&
        !StringRef(*E).starts_with("LD_TRACE_LOADED_OBJECTS="))
      EnvStrings.push_back(*E);
  std::vector<StringRef> EnvRefs(EnvStrings.begin(), EnvStrings.end());
  std::optional<StringRef> Redirects[] = {StringRef(""), StringRef(Listing), StringRef("")};
  sys::ExecuteAndWait(Loader, Args, EnvRefs, Redirects, /*SecondsToWait=*/30);
  std::string Found;
  if (auto Text = MemoryBuffer::getFile(Listing)) {
    SmallVector<StringRef> Lines;
    (*Text)->getBuffer().split(Lines, '\n');
    for (StringRef Line : Lines) {
      auto [Name, Rest] = Line.trim().split(" => ");
      if (Name == "libtorch_cpu.so")
        Found = Rest.rsplit(" (").first.str();
    }
  }
  sys::fs::remove(Listing);
  return Found;
}

/// \p Command's program as a shell finds it; exits on failure.
std::string findProgram(const std::vector<std::string> &Command) {
  std::string Program = Command[0];
  if (Program.find('/') == std::string::npos) {
    auto Found = sys::findProgramByName(Program);
    if (!Found)
      exitWithError(Tool, makeError("cannot run '" + Program + "': not found on PATH"));
    Program = *Found;
  } else if (!sys::fs::exists(Program)) {
    exitWithError(Tool, makeError("cannot run '" + Program + "': no such file"));
  } else if (sys::fs::is_directory(Program) || !sys::fs::can_execute(Program)) {
    exitWithError(Tool, makeError("cannot run '" + Program + "': not an executable file"));
  }
  return Program;
}

/// The program's process while ekka-trace waits for it.
volatile sig_atomic_t ProgramPid = 0;

/// A signal that ekka-trace gets while the program runs goes to the
/// program, which ends or not as it would (a SIGTERM writes its trace out
/// first: the runtime's handler); ekka-trace reports when it has ended and
/// returns its status. Not a SIGINT or SIGQUIT that the terminal sent (not
/// a process's kill): the program, in the same process group, has it
/// already.
void forwardSignal(int Signal, siginfo_t *Info, void *) {
  bool FromTerminal = (Signal == SIGINT || Signal == SIGQUIT) && Info && Info->si_code > 0;
  if (ProgramPid > 0 && !FromTerminal)
    ::kill(ProgramPid, Signal);
}

constexpr int ForwardedSignals[] = {SIGTERM, SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2};

/// Runs Command with Env added; returns its exit code, 128+N for signal N.
int runProgram(const std::vector<std::string> &Command,
               const std::map<std::string, std::string> &Env) {
  std::vector<std::string> EnvStrings;
  for (char **E = environ; *E; ++E) {
    StringRef Entry(*E);
    if (!Env.count(Entry.split('=').first.str()))
      EnvStrings.push_back(Entry.str());
  }
  for (const auto &[K, V] : Env)
    EnvStrings.push_back(K + "=" + V);
  std::vector<char *> Argv, Envp;
  for (const std::string &A : Command)
    Argv.push_back(const_cast<char *>(A.c_str()));
  Argv.push_back(nullptr);
  for (const std::string &E : EnvStrings)
    Envp.push_back(const_cast<char *>(E.c_str()));
  Envp.push_back(nullptr);
  std::string Program = findProgram(Command);
  // A SIGCHLD that ekka-trace's parent left ignored would have the kernel
  // reap the program, and waitpid() could not tell its status: default
  // here, and the program gets the disposition it would have had.
  struct sigaction ChildSignal = {}, InheritedChildSignal;
  ChildSignal.sa_handler = SIG_DFL;
  sigemptyset(&ChildSignal.sa_mask);
  sigaction(SIGCHLD, &ChildSignal, &InheritedChildSignal);
  // Made before the fork: the child only write()s it (escaped, as every
  // error line: the name is the user's).
  std::string CannotRun =
      std::string(Tool) + ": error: cannot run '" + printable(Command[0]) + "'\n";
  pid_t Pid = fork();
  if (Pid < 0)
    exitWithError(Tool, makeError("cannot start '" + Command[0] + "'"));
  if (Pid == 0) {
    sigaction(SIGCHLD, &InheritedChildSignal, nullptr);
    execve(Program.c_str(), Argv.data(), Envp.data());
    (void)!write(STDERR_FILENO, CannotRun.data(), CannotRun.size());
    _exit(127);
  }
  // Set after the fork: the program starts with ekka-trace's own
  // dispositions (a background job's ignored SIGINT stays ignored). One
  // that ekka-trace ignores stays ignored.
  ProgramPid = Pid;
  struct sigaction Forward = {}, Before[std::size(ForwardedSignals)];
  Forward.sa_sigaction = forwardSignal;
  Forward.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&Forward.sa_mask);
  for (size_t I = 0; I < std::size(ForwardedSignals); ++I) {
    if (sigaction(ForwardedSignals[I], nullptr, &Before[I]) != 0)
      continue;
    bool Ignored = !(Before[I].sa_flags & SA_SIGINFO) && Before[I].sa_handler == SIG_IGN;
    if (!Ignored)
      sigaction(ForwardedSignals[I], &Forward, nullptr);
  }
  int Status = 0;
  bool Reaped = true;
  while (waitpid(Pid, &Status, 0) < 0)
    if (errno != EINTR) { // ECHILD: reaped already, SIGCHLD ignored after all
      Reaped = false;
      break;
    }
  ProgramPid = 0;
  for (size_t I = 0; I < std::size(ForwardedSignals); ++I)
    sigaction(ForwardedSignals[I], &Before[I], nullptr);
  if (!Reaped) {
    errs() << Tool << ": warning: the program's exit status is unknown (it was reaped "
                      "without ekka-trace)\n";
    return 1;
  }
  if (WIFEXITED(Status))
    return WEXITSTATUS(Status);
  if (WIFSIGNALED(Status))
    return 128 + WTERMSIG(Status);
  return 1;
}

std::string humanBytes(uint64_t B) {
  std::string S;
  raw_string_ostream OS(S);
  if (B >= (1ull << 30))
    OS << format("%.1f GiB", double(B) / (1ull << 30));
  else if (B >= (1ull << 20))
    OS << format("%.1f MiB", double(B) / (1ull << 20));
  else if (B >= 1024)
    OS << format("%.1f KiB", double(B) / 1024);
  else
    OS << B << " B";
  return S;
}

/// The one-line summary, read back from the trace the program left.
/// What a set of traces holds, for the closing summary.
struct Totals {
  uint64_t Calls = 0, Ops = 0, Kernels = 0, Tensors = 0, Captured = 0;
  unsigned Traces = 0, Unclosed = 0, OverBudget = 0;
  /// Each closed trace that lacks records ("DIR: " and its meta
  /// lost_records), for the summary to name (under ekka-trace the
  /// processes do not say theirs: EKKA_TRACE_SUMMARIZES).
  std::vector<std::string> Losses;

  void add(TraceReader &R) {
    ++Traces;
    // Written when tracing stops (or before an exec, "pending" again if the
    // exec failed): without it, the process ended first.
    auto Lost = R.meta().find("lost_records");
    if (Lost == R.meta().end() || StringRef(Lost->second).starts_with("pending"))
      ++Unclosed;
    else if (Lost->second != "0")
      Losses.push_back(R.directory().str() + ": " + printable(Lost->second));
    if (auto Budget = R.meta().find("capture_budget");
        Budget != R.meta().end() && Budget->second.find(": reached") != std::string::npos)
      ++OverBudget;
    auto N = R.counts();
    if (!N) {
      errs() << Tool << ": warning: could not read back '" << R.directory()
             << "': " << toString(N.takeError()) << "\n";
      return;
    }
    Calls += N->ModuleCalls;
    Ops += N->Ops;
    Kernels += N->Kernels;
    Tensors += N->Tensors;
    Captured += N->CapturedBytes;
  }

  std::string counts() const {
    return countOf(Calls, "module call") + ", " + countOf(Ops, "op") + ", " +
           countOf(Kernels, "kernel") + ", " + countOf(Tensors, "tensor") + ", " +
           humanBytes(Captured) + " captured";
  }
};

/// The traces of processes forked or exec'd from a traced one, which found
/// the directory taken: DIR/process-PID/, in the order of their names.
std::vector<std::string> processTraces(StringRef Dir) {
  std::vector<std::string> Found;
  std::error_code EC;
  for (sys::fs::directory_iterator It(Dir, EC), End; It != End && !EC; It.increment(EC))
    if (sys::path::filename(It->path()).starts_with("process-") &&
        sys::fs::exists(It->path() + "/" + TraceDatabaseName.str()))
      Found.push_back(It->path());
  llvm::sort(Found);
  return Found;
}

/// Why a Python that \p Command runs directly cannot load the shim, which
/// comes in through PYTHONPATH and site's import of sitecustomize: the
/// options that keep it out (-I, -E, -S, alone or among others, before the
/// script, -c or -m), said as a sentence; empty where there are none.
std::string shimKeptOutBy(const std::vector<std::string> &Command) {
  if (!sys::path::filename(Command[0]).starts_with("python"))
    return "";
  std::string Said;
  auto Say = [&](char Flag) {
    std::string Line = std::string("python's -") + Flag;
    if (Said.find(Line + " ") != std::string::npos)
      return;
    Line += Flag == 'S' ? " skips site, which imports it"
                        : " ignores PYTHONPATH, through which ekka-trace gives it";
    Said += (Said.empty() ? "" : "; ") + Line;
  };
  for (size_t I = 1; I < Command.size(); ++I) {
    StringRef A = Command[I];
    if (A == "--check-hash-based-pycs") {
      ++I;
      continue;
    }
    if (A.starts_with("--"))
      continue;
    if (A.size() < 2 || A[0] != '-')
      break; // the script, or - for standard input
    for (size_t J = 1; J < A.size(); ++J) {
      char C = A[J];
      if (C == 'I' || C == 'E' || C == 'S')
        Say(C);
      if (C == 'c' || C == 'm')
        return Said; // what follows is the command or the module's
      if (C == 'W' || C == 'X') {
        I += J + 1 == A.size(); // its argument, where it is the next one
        break;
      }
    }
  }
  return Said;
}

void printSummary(StringRef Dir, double Seconds, const std::vector<std::string> &Command) {
  auto Ranks = TraceReader::openRanks(Dir);
  if (!Ranks && !processTraces(Dir).empty()) {
    // The program's own process ran no module; others it started did.
    consumeError(Ranks.takeError());
    Ranks = std::vector<std::unique_ptr<TraceReader>>();
  }
  if (!Ranks) {
    consumeError(Ranks.takeError());
    errs() << Tool << ": the program ran no torch.nn.Module: nothing was traced\n";
    if (std::string Why = shimKeptOutBy(Command); !Why.empty())
      errs() << Tool << ": note: the program's Python could not load ekka-trace's shim: " << Why
             << "\n";
    return;
  }
  Totals Main, Others;
  for (auto &R : *Ranks)
    Main.add(*R);
  for (const std::string &Path : processTraces(Dir)) {
    auto R = TraceReader::open(Path);
    if (!R) {
      errs() << Tool << ": warning: could not read back '" << Path
             << "': " << toString(R.takeError()) << "\n";
      continue;
    }
    Others.add(**R);
  }
  if (Ranks->empty())
    errs() << Tool << ": the program's own process ran no torch.nn.Module"
           << format(" (%.1f s)", Seconds) << "\n";
  else
    errs() << Tool << ": " << Main.counts()
           << (Ranks->size() > 1 ? ", " + std::to_string(Ranks->size()) + " ranks" : "")
           << format(", %.1f s", Seconds) << "; trace in " << Dir << "\n";
  if (std::vector<unsigned> Idle = TraceReader::startedRanks(Dir); !Idle.empty()) {
    std::string List;
    for (unsigned Rank : Idle)
      List += (List.empty() ? "" : ", ") + std::to_string(Rank);
    errs() << Tool << ": note: rank" << (Idle.size() > 1 ? "s " : " ") << List
           << " ran no torch.nn.Module (rank-N/ holds only its start marker)\n";
  }
  if (Others.Traces)
    errs() << Tool << ": " << Others.Traces << " more process"
           << (Others.Traces > 1 ? "es" : "") << " traced: " << Others.counts() << "; in "
           << Dir << "/process-*\n";
  if (unsigned N = Main.OverBudget + Others.OverBudget)
    errs() << Tool << ": note: --budget was reached"
           << (Main.Traces + Others.Traces > 1 ? " in " + std::to_string(N) + " of the traces"
                                               : std::string())
           << ": the tensors after it have statistics and metadata only (meta capture_budget)\n";
  // Each trace's losses, named (the processes do not say theirs under
  // ekka-trace, EKKA_TRACE_SUMMARIZES). At most a few, each a line, then a
  // count.
  std::vector<std::string> Losses = std::move(Main.Losses);
  Losses.insert(Losses.end(), Others.Losses.begin(), Others.Losses.end());
  constexpr size_t MostLosses = 4;
  for (size_t I = 0; I < Losses.size() && I < MostLosses; ++I)
    errs() << Tool << ": warning: " << Losses[I] << "\n";
  if (Losses.size() > MostLosses)
    errs() << Tool << ": warning: " << Losses.size() - MostLosses
           << " more traces lack records (their meta lost_records says what)\n";
  if (unsigned Unclosed = Main.Unclosed + Others.Unclosed)
    errs() << Tool << ": warning: "
           << (Main.Traces + Others.Traces > 1 ? std::to_string(Unclosed) + " of the traces were"
                                               : std::string("the trace was"))
           << " not closed: the program ended without stopping tracing (killed, crashed, or "
              "_exit) or its trace could not be written, and what it recorded after its last "
              "written batch is lost\n";
}

int runTrace(const std::vector<std::string> &Command, const char *Argv0) {
  if (!MisplacedCommand.empty())
    exitWithError(Tool, makeError("unexpected argument '" + MisplacedCommand[0] +
                                  "': the program to trace goes after --: ekka-trace -o DIR -- "
                                  "CMD ARGS..."));
  if (OutputDir.empty())
    exitWithError(Tool, makeError("missing -o DIR, the trace directory (see ekka-trace --help)"));
  if (Command.empty())
    exitWithError(Tool, makeError("missing the program to trace: ekka-trace -o DIR -- CMD ARGS..."));
  if (Capture != "modules" && Capture != "none")
    exitWithError(Tool, makeError("--capture: expected modules or none, got '" + Capture + "'"));
  if (Capture == "none" && !CaptureModules.empty())
    exitWithError(Tool, makeError("--capture-modules selects module calls to capture, which "
                                  "--capture=none turns off: give one of them"));
  if (CaptureOpInputs && CaptureOps.empty())
    exitWithError(Tool, makeError("--capture-op-inputs needs --capture-ops REGEX (whose ops' "
                                  "inputs to capture)"));
  for (const std::string *Re : {&CaptureModules.getValue(), &CaptureOps.getValue()})
    if (!Re->empty()) {
      // The runtime matches with std::regex (ECMAScript); check the same way.
      try {
        std::regex Check(*Re);
      } catch (const std::regex_error &E) {
        exitWithError(Tool, makeError("bad regular expression '" + *Re + "': " + E.what()));
      }
    }
  if (Steps < -1)
    exitWithError(Tool, makeError("--steps: expected a number of forward passes, 0 or more, got " +
                                  Twine(Steps.getValue())));
  for (const std::string *Value : {&CaptureModules.getValue(), &CaptureOps.getValue(),
                                   &Framework.getValue()})
    if (Value->find(';') != std::string::npos) // the runtime's options are split at ';'
      exitWithError(Tool, makeError("'" + *Value + "': an option's value cannot hold ';' (in a "
                                    "regular expression, [;] or \\x3b matches one)"));
  SmallString<256> Dir(OutputDir.getValue());
  sys::fs::make_absolute(Dir);
  if (sys::fs::exists(Dir) && !sys::fs::is_directory(Dir))
    exitWithError(Tool, makeError("'" + OutputDir + "' is not a directory"));
  auto RefuseToReplace = [&] {
    exitWithError(Tool, makeError("'" + OutputDir + "' already holds a trace (use --force to "
                                  "replace it)"));
  };
  // Held first: a trace being written is told from one written.
  bool Held = sys::fs::is_directory(Dir);
  if (Held)
    holdDirectory(Dir, OutputDir);
  bool Replace = holdsTrace(Dir);
  if (Replace && !Force)
    RefuseToReplace();
  // Everything that can refuse the run first: a trace that --force would
  // replace is removed only for a program that will run.
  Resources R = findResources(Argv0);
  if (!sys::fs::exists(R.RuntimeLibrary))
    exitWithError(Tool, makeError("the runtime library is missing: " + R.RuntimeLibrary));
  std::string Program = findProgram(Command), Theirs;
  // A C++ program: the runtime is preloaded and traces its main. Recognised,
  // it alone gets the runtime; under --native, every process does.
  // Recognised by its own dynamic section, or, linking LibTorch through
  // libraries of its own (an engine's), by its loader's listing.
  bool Recognised = false;
  if (!Native) {
    std::string Loader = programInterpreter(Program);
    if (!Loader.empty())
      Theirs = libTorchOf(Loader, Program);
    Recognised = linksLibTorch(Program) || !Theirs.empty();
  }
  if (Recognised) {
    // The runtime links the LibTorch it was built against: loaded into a
    // program that links another, the program would not start.
    SmallString<256> TheirsReal, OursReal;
    std::string Ours = std::string(EKKA_TORCH_LIB_DIR) + "/libtorch_cpu.so";
    if (Theirs.empty() || sys::fs::real_path(Theirs, TheirsReal) ||
        sys::fs::real_path(Ours, OursReal) || TheirsReal != OursReal)
      exitWithError(Tool, makeError(
          "'" + Command[0] + "' links LibTorch from " +
          (Theirs.empty() || Theirs == "not found" ? std::string("a libtorch_cpu.so the loader "
                                                                 "does not find")
                                                   : "'" + Theirs + "'") +
          ", but this runtime was built against '" + Ours +
          "': it cannot be loaded into the program (build Ekka with EKKA_PYTHON set to the "
          "Python whose torch the program links)"));
  }
  if (std::error_code EC = sys::fs::create_directories(Dir))
    exitWithError(Tool, makeError("cannot create '" + OutputDir + "': " + EC.message()));
  if (::access(Dir.c_str(), W_OK | X_OK) != 0)
    exitWithError(Tool, makeError("cannot write into '" + OutputDir + "': " +
                                  std::strerror(errno)));
  if (!Held) {
    holdDirectory(Dir, OutputDir);
    // Asked again, held: a run that ended meanwhile left its trace.
    Replace = holdsTrace(Dir);
    if (Replace && !Force)
      RefuseToReplace();
  }
  if (Replace)
    removeTrace(Dir);

  std::string CommandLine;
  for (const std::string &A : Command)
    CommandLine += (CommandLine.empty() ? "" : " ") + A;
  std::string PythonPath = R.BootstrapDir + ":" + R.PythonDir;
  if (const char *Old = std::getenv("PYTHONPATH"); Old && *Old)
    PythonPath += std::string(":") + Old;
  std::map<std::string, std::string> Env = {
      {"EKKA_TRACE_DIR", std::string(Dir)},
      {"EKKA_TRACE_OPTIONS", captureOptions()},
      {"EKKA_RUNTIME_LIB", R.RuntimeLibrary},
      {"EKKA_RUNTIME_TORCH", R.RuntimeTorch},
      {"EKKA_RUNTIMES", R.OtherRuntimes},
      {"EKKA_COMMAND_LINE", CommandLine},
      // Its closing summary names each trace's losses: the processes need
      // not say theirs (without naming their traces).
      {"EKKA_TRACE_SUMMARIZES", "1"},
      {"PYTHONPATH", PythonPath},
  };
  if (Native || Recognised) {
    std::string Preload = R.RuntimeLibrary;
    Env["EKKA_LD_PRELOAD_BEFORE"] = ""; // not an inherited one
    if (const char *Old = std::getenv("LD_PRELOAD"); Old && *Old) {
      Preload += std::string(":") + Old;
      Env["EKKA_LD_PRELOAD_BEFORE"] = Old;
    }
    Env["LD_PRELOAD"] = Preload;
    Env["EKKA_TRACE_NATIVE"] = Native ? "all" : "auto";
  }
  auto Start = std::chrono::steady_clock::now();
  int Code = runProgram(Command, Env);
  double Seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - Start).count();
  printSummary(Dir, Seconds, Command);
  return Code;
}

/// The program's own trace in \p Dir (its ranks), then those of the
/// processes it forked or exec'd that found Dir taken (process-PID/); only
/// those where the program's own process ran no module (DataLoader
/// workers did).
std::vector<std::unique_ptr<TraceReader>> openTraces(StringRef Dir) {
  std::vector<std::unique_ptr<TraceReader>> Ranks;
  std::vector<std::string> Others = processTraces(Dir);
  if (Others.empty() || holdsTrace(Dir, /*Processes=*/false))
    Ranks = unwrapOrExit(Tool, TraceReader::openRanks(Dir));
  for (const std::string &Other : Others)
    Ranks.push_back(unwrapOrExit(Tool, TraceReader::open(Other)));
  return Ranks;
}

int runExport() {
  if (ExportArgs.size() != 1)
    exitWithError(Tool, makeError("export takes one trace DIR"));
  if (ExportPerfetto.empty())
    exitWithError(Tool, makeError("export needs --perfetto OUT.json (the one format it writes)"));
  std::vector<std::unique_ptr<TraceReader>> Traces = openTraces(ExportArgs[0]);
  std::vector<TraceReader *> Ranks;
  for (auto &R : Traces)
    Ranks.push_back(R.get());
  auto Summary = unwrapOrExit(Tool, writeTimelineFile(ExportPerfetto, Ranks));
  errs() << "ekka-trace: wrote "
         << (ExportPerfetto == "-" ? std::string("the timeline") : "'" + ExportPerfetto + "'")
         << ": " << countOf(Summary.ModuleCalls, "module call") << ", "
         << countOf(Summary.Ops, "op") << ", " << countOf(Summary.Kernels, "kernel") << " on "
         << countOf(Summary.Threads, "thread") << "\n";
  if (Summary.KernelsWithoutSpan)
    errs() << "ekka-trace: note: " << countOf(Summary.KernelsWithoutSpan, "kernel")
           << " launched outside any module call and op left out (nothing to place "
           << (Summary.KernelsWithoutSpan == 1 ? "it" : "them") << " in)\n";
  if (!Summary.ModuleCalls && !Summary.Ops)
    errs() << "ekka-trace: warning: the trace records no module call or op with a span: "
              "its timeline is empty\n";
  return ExitSuccess;
}

int runShow() {
  if (ShowArgs.size() != 1)
    exitWithError(Tool, makeError("show takes one trace DIR"));
  std::vector<std::unique_ptr<TraceReader>> Ranks = openTraces(ShowArgs[0]);
  std::string Missing; // the first missing shard, said after the rest
  // What the trace holds is someone's program's: its names and values are
  // escaped (Printable.h), one line each.
  for (auto &R : Ranks) {
    outs() << "trace " << R->directory() << "\n";
    for (const auto &[K, V] : R->meta())
      outs() << "  " << printable(K) << ": " << printable(V) << "\n";
    auto Calls = unwrapOrExit(Tool, R->moduleCalls());
    uint64_t Ops = unwrapOrExit(Tool, R->rowCount("ops"));
    uint64_t Tensors = unwrapOrExit(Tool, R->rowCount("tensors"));
    auto Tally = unwrapOrExit(Tool, R->tallyPerModuleCall());
    std::map<int64_t, unsigned> Depth;
    outs() << "  " << countOf(Calls.size(), "module call") << ", " << countOf(Ops, "op") << ", "
           << countOf(Tensors, "tensor") << "\n";
    unsigned Printed = 0;
    for (const ModuleCallRecord &C : Calls) {
      unsigned D = C.ParentId ? Depth[*C.ParentId] + 1 : 0;
      Depth[C.Id] = D;
      if (Printed++ == ShowLimit) {
        outs() << "  ... (" << Calls.size() - ShowLimit << " more; --limit to see them)\n";
        break;
      }
      const CallTally &Own = Tally[C.Id];
      outs() << format("  %5lld step %lld  ", (long long)C.Seq, (long long)C.Step);
      outs().indent(2 * D) << (C.Path.empty() ? "(root)" : printable(C.Path)) << "  "
                           << printable(C.ClassName)
                           << "  " << countOf(Own.Ops, "op");
      if (uint64_t N = Own.Captured)
        outs() << ", " << N << " captured";
      if (!C.SourceFile.empty())
        outs() << "  " << printable(C.SourceFile) << ":" << C.SourceLine;
      outs() << "\n";
    }
    auto Shards = unwrapOrExit(Tool, R->missingShards());
    if (!Shards.empty() && Missing.empty())
      Missing = "'" + R->directory().str() + "/" + printable(Shards.begin()->first) +
                "' is missing: " +
                countOf(Shards.begin()->second, "captured tensor's", "captured tensors'") +
                " bytes cannot be read" +
                (Shards.size() > 1 ? " (and " + countOf(Shards.size() - 1, "more shard") +
                                         (Shards.size() > 2 ? " are" : " is") + " missing)"
                                   : std::string());
  }
  // Ranks that began under Ekka and traced no module left only their start
  // marker: said, so that they are not taken for lost ones.
  for (unsigned Rank : TraceReader::startedRanks(ShowArgs[0]))
    outs() << "rank " << Rank << ": began, traced no module (" << ShowArgs[0] << "/rank-" << Rank
           << "/ holds only its start marker)\n";
  if (!Missing.empty())
    exitWithError(Tool, makeError(Missing));
  return ExitSuccess;
}

} // namespace

int main(int argc, char **argv) {
  // Everything after `--` is the program to run, untouched by option parsing.
  std::vector<const char *> Ours;
  std::vector<std::string> Command;
  bool AfterDashes = false;
  for (int I = 0; I < argc; ++I) {
    if (AfterDashes)
      Command.push_back(argv[I]);
    else if (I > 0 && StringRef(argv[I]) == "--")
      AfterDashes = true;
    else
      Ours.push_back(argv[I]);
  }
  cl::HideUnrelatedOptions({&TraceCategory});
  cl::HideUnrelatedOptions({&TraceCategory}, ShowCmd);
  cl::HideUnrelatedOptions({&TraceCategory}, ExportCmd);
  cl::SetVersionPrinter([](raw_ostream &OS) { OS << "ekka-trace " EKKA_VERSION "\n"; });
  parseCommandLineOrExit(
      int(Ours.size()), Ours.data(),
      "Ekka's tracer: record what a PyTorch program computed.\n\n"
      "Runs a program with every torch.nn.Module call recorded (path, class, source,\n"
      "outputs), every ATen/custom op beneath it, and captured tensors, without\n"
      "editing the program. The trace is a directory that Python opens with the\n"
      "standard sqlite3 and safetensors modules (docs/TraceFormat.md).\n\n"
      "  ekka-trace -o ref.trace -- python run_reference.py\n"
      "  ekka-trace -o tgt.trace --capture-ops 'zoo::' -- python run_target.py\n"
      "  ekka-trace show ref.trace\n"
      "  ekka-trace export --perfetto ref.json ref.trace   (open in ui.perfetto.dev)\n\n"
      "A C++ program that links LibTorch is traced too, op by op (its C++ modules\n"
      "have no hooks): ekka-trace -o cpp.trace -- ./my_libtorch_program\n\n"
      "The exit code is the program's own (128+N if a signal N ended it).\n");
  if (ShowCmd)
    return runShow();
  if (ExportCmd)
    return runExport();
  return runTrace(Command, argv[0]);
}
