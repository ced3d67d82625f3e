//===- NativeStart.cpp - Tracing a LibTorch program around its main -------===//
//
// A C++ program that links LibTorch has no Python shim: ekka-trace preloads
// this library into it (LD_PRELOAD, with EKKA_TRACE_NATIVE set), and the
// trace runs around the program's main. C's start-up (__libc_start_main) is
// interposed here: by the time it calls main, every library's static
// initialisers have run (this one's own, CUDA's and LibTorch's included);
// when main returns, tracing stops before exit() runs anything, so no
// static destructor or thread-local teardown comes first. exit() is
// interposed too, for a program that calls it itself: tracing stops before
// exit() destroys the calling thread's thread-locals and runs its handlers
// (CUDA's teardown among them). An atexit handler remains for an exit that
// bypasses the interposed one. The exec family is interposed as well: a
// process that replaces itself writes its trace out first. One that ends
// with _exit or a signal leaves its trace unclosed.
// LibTorch's C++ modules have no hooks: such a trace holds the program's
// ops (and its record_function scopes), their tensors and GPU kernels, but
// no module calls.
//
// Only a process whose executable links LibTorch, itself or through the
// libraries it needs, is traced so.
// EKKA_TRACE_NATIVE=auto (the program was recognised by ekka-trace) takes
// the runtime back out of LD_PRELOAD for the processes the program starts;
// EKKA_TRACE_NATIVE=all (--native) leaves it, for a program that is started
// through a wrapper.
//
//===----------------------------------------------------------------------===//
#include "ekka/Runtime/TraceSession.h"
#include "ekka/Support/Executables.h"

#include <ATen/Context.h>

#include <alloca.h>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <link.h>
#include <glob.h>
#include <string>
#include <unistd.h>

namespace {

std::string environment(const char *Name) {
  const char *V = std::getenv(Name);
  return V ? V : "";
}

/// Where this process writes: rank-N/ for a rank of a distributed run, as
/// the shim does.
std::string traceDirectory(const std::string &Base) {
  std::string World = environment("WORLD_SIZE");
  if (!World.empty() && std::atoi(World.c_str()) > 1) {
    std::string Rank = environment("RANK");
    return Base + "/rank-" + (Rank.empty() ? "0" : Rank);
  }
  return Base;
}

/// The libcupti that the torch wheel LibTorch comes from depends on (in
/// site-packages/nvidia/), as the shim finds it for Python; empty if none.
std::string cuptiBesideTorch() {
  Dl_info Info;
  if (!dladdr(reinterpret_cast<void *>(&at::globalContext), &Info) || !Info.dli_fname)
    return "";
  std::string Path = Info.dli_fname; // .../site-packages/torch/lib/libtorch_cpu.so
  for (int Up = 0; Up < 3; ++Up) {
    size_t Slash = Path.rfind('/');
    if (Slash == std::string::npos)
      return "";
    Path.resize(Slash);
  }
  std::string Found;
  for (const char *Pattern : {"/nvidia/*/lib/libcupti.so*", "/nvidia/cuda_cupti/lib/libcupti.so*"}) {
    glob_t Matches;
    if (glob((Path + Pattern).c_str(), 0, nullptr, &Matches) == 0 && Matches.gl_pathc > 0 &&
        (Found.empty() || Found > Matches.gl_pathv[0]))
      Found = Matches.gl_pathv[0];
    globfree(&Matches);
  }
  return Found;
}

/// What the runtime is told of GPU kernels: libcupti from EKKA_CUPTI_LIB or
/// beside torch, where the machine has an NVIDIA GPU. Whether it has one is
/// asked of the device files, not of CUDA: initialising CUDA before the
/// program does would change it (a child it forks could use no GPU then).
std::string gpuOptions() {
  std::string Cupti = environment("EKKA_CUPTI_LIB");
  if (!Cupti.empty())
    return "cupti=" + Cupti + ";";
  if (access("/dev/nvidiactl", F_OK) != 0)
    return "gpu=no CUDA device;";
  Cupti = cuptiBesideTorch();
  if (Cupti.empty())
    return "gpu=no libcupti found beside torch (set EKKA_CUPTI_LIB);";
  return "cupti=" + Cupti + ";";
}

std::atomic<bool> Stopped{false};

void stopNativeTrace() {
  if (Stopped.exchange(true))
    return;
  std::string Summary;
  try {
    Summary = ekka::stopTrace();
  } catch (const std::exception &E) {
    Summary = std::string("error: stopping failed: ") + E.what();
  }
  if (Summary.rfind("error: ", 0) == 0)
    std::fprintf(stderr, "ekka-trace: %s\n", Summary.c_str());
  else if (auto At = Summary.find("; warning: ");
           At != std::string::npos && !std::getenv("EKKA_TRACE_SUMMARIZES"))
    std::fprintf(stderr, "ekka-trace: warning: %s\n", Summary.c_str() + At + 11);
}

/// The processes the program starts do not get the runtime (ekka-trace
/// recognised this one; it names the preload it added).
void stopPreloading() {
  unsetenv("EKKA_TRACE_NATIVE");
  std::string Before = environment("EKKA_LD_PRELOAD_BEFORE");
  if (Before.empty())
    unsetenv("LD_PRELOAD");
  else
    setenv("LD_PRELOAD", Before.c_str(), 1);
  unsetenv("EKKA_LD_PRELOAD_BEFORE");
}

void startNativeTrace() {
  std::string Base = environment("EKKA_TRACE_DIR");
  std::string Options =
      std::string("native=1;") + gpuOptions() + environment("EKKA_TRACE_OPTIONS");
  std::string CommandLine = environment("EKKA_COMMAND_LINE");
  std::string Error;
  try {
    Error = ekka::startTrace(traceDirectory(Base), Options, CommandLine);
    if (Error.find("already holds a trace") != std::string::npos) {
      // Another process of the program writes there already: a directory
      // of this one's own.
      Error = ekka::startTrace(Base + "/process-" + std::to_string(::getpid()), Options,
                               CommandLine);
    }
  } catch (const std::exception &E) { // nothing may escape into the program
    Error = E.what();
  }
  if (!Error.empty()) {
    std::fprintf(stderr, "ekka-trace: error: %s\n", Error.c_str());
    return;
  }
  std::atexit(stopNativeTrace);
}

using MainFn = int (*)(int, char **, char **);
MainFn ProgramMain = nullptr;
std::atomic<bool> InMain{false}; ///< tracedMain is running: exit() stops first.
/// The process whose main is traced: not a child it forks (which has
/// InMain too, and no trace) nor one it vforks (which shares its memory).
std::atomic<pid_t> TracedProcess{0};

int tracedMain(int Argc, char **Argv, char **Envp) {
  TracedProcess = ::getpid();
  startNativeTrace();
  InMain = true;
  int Code = ProgramMain(Argc, Argv, Envp);
  InMain = false;
  stopNativeTrace();
  return Code;
}

/// The file that the library a program needs as \p Needed was loaded from,
/// by its name (every library the program needs is loaded before its
/// start-up runs); empty if none of that name is.
std::string loadedFile(llvm::StringRef Needed) {
  struct Search {
    llvm::StringRef Name;
    std::string Found;
  } S{Needed, ""};
  dl_iterate_phdr(
      [](struct dl_phdr_info *Info, size_t, void *Data) {
        auto *S = static_cast<Search *>(Data);
        llvm::StringRef Path = Info->dlpi_name ? Info->dlpi_name : "";
        if (Path.rsplit('/').second == S->Name || Path == S->Name) {
          S->Found = Path.str();
          return 1;
        }
        return 0;
      },
      &S);
  return S.Found;
}

/// Whether this process is to be traced around its main: its executable
/// links LibTorch, itself or through its libraries.
bool tracesThisProcess() {
  std::string Mode = environment("EKKA_TRACE_NATIVE");
  if ((Mode != "auto" && Mode != "all") || environment("EKKA_TRACE_DIR").empty())
    return false;
  if (Mode == "auto")
    stopPreloading();
  return ekka::reachesLibTorch("/proc/self/exe", loadedFile);
}

/// Whether this process is the one whose main is traced, inside it.
bool mainTracedHere() { return ::getpid() == TracedProcess.load() && InMain.load(); }

/// Before an exec of the traced process: everything recorded is written
/// (flushTrace), with what a stop writes of the trace, so that the trace is
/// as whole as a stop leaves it; if the exec fails, the program goes on in
/// the same trace. Nothing in any other process: a forked child (which has
/// InMain too, and no trace), or a vforked one, whose memory is the
/// parent's. Not for an exec from a signal handler (it writes files).
void beforeExec() {
  if (!mainTracedHere())
    return;
  std::string Error;
  try {
    Error = ekka::flushTrace();
  } catch (const std::exception &E) { // nothing may escape into the program
    Error = std::string("error: writing the trace out failed: ") + E.what();
  } catch (...) {
    Error = "error: writing the trace out failed";
  }
  if (!Error.empty())
    std::fprintf(stderr, "ekka-trace: %s\n", Error.c_str());
}

/// After an exec of the traced process that returned (failed): the trace
/// is open again (beforeExec wrote it out as if closed).
void afterFailedExec() {
  if (!mainTracedHere())
    return;
  int Errno = errno;
  try {
    ekka::reopenAfterFailedExec();
  } catch (...) { // nothing may escape into the program
  }
  errno = Errno;
}

using ExecveFn = int (*)(const char *, char *const[], char *const[]);
using ExecvFn = int (*)(const char *, char *const[]);
using FexecveFn = int (*)(int, char *const[], char *const[]);

/// The C library's exec calls, looked up when this library is loaded: not
/// in an exec call, which a vforked child makes in its parent's memory
/// (where the loader's lock must not be taken).
struct {
  ExecveFn Execve, Execvpe;
  ExecvFn Execv, Execvp;
  FexecveFn Fexecve;
} Libc;

template <typename Fn> void findNext(Fn &Slot, const char *Name) {
  if (!Slot)
    Slot = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, Name));
}

__attribute__((constructor)) void findExecCalls() {
  findNext(Libc.Execve, "execve");
  findNext(Libc.Execvpe, "execvpe");
  findNext(Libc.Execv, "execv");
  findNext(Libc.Execvp, "execvp");
  findNext(Libc.Fexecve, "fexecve");
}

/// The C library's exec call in \p Slot (named \p Name) on \p A, the
/// trace written out before it and open again if it returns (failed).
template <typename Fn, typename... Args> int execAround(Fn &Slot, const char *Name, Args... A) {
  beforeExec();
  findNext(Slot, Name);
  int Result = Slot(A...);
  afterFailedExec();
  return Result;
}

/// How many arguments a list form of exec has: \p First, those after it,
/// and the null that ends them.
size_t countListArguments(const char *First, va_list Args) {
  size_t N = 1;
  for (const char *A = First; A; A = va_arg(Args, const char *))
    ++N;
  return N;
}

} // namespace

// The exec family, interposed where this library is preloaded: each writes
// a traced process's trace out first (beforeExec), then is the C library's
// own. The list forms go through the vector ones, their arguments on the
// stack, as the C library's do.
extern "C" int execve(const char *Path, char *const Argv[], char *const Envp[]) {
  return execAround(Libc.Execve, "execve", Path, Argv, Envp);
}

extern "C" int execv(const char *Path, char *const Argv[]) {
  return execAround(Libc.Execv, "execv", Path, Argv);
}

extern "C" int execvp(const char *File, char *const Argv[]) {
  return execAround(Libc.Execvp, "execvp", File, Argv);
}

extern "C" int execvpe(const char *File, char *const Argv[], char *const Envp[]) {
  return execAround(Libc.Execvpe, "execvpe", File, Argv, Envp);
}

extern "C" int fexecve(int Fd, char *const Argv[], char *const Envp[]) {
  return execAround(Libc.Fexecve, "fexecve", Fd, Argv, Envp);
}

/// The arguments of a list form of exec, \p First and those after it up to
/// the null, into \p Argv (countListArguments of them).
#define EKKA_LIST_ARGUMENTS(First, Argv)                                                    \
  va_list Args, Counting;                                                                    \
  va_start(Args, First);                                                                     \
  va_copy(Counting, Args);                                                                   \
  size_t Count = countListArguments(First, Counting);                                        \
  va_end(Counting);                                                                          \
  char **Argv = static_cast<char **>(alloca(Count * sizeof(char *)));                        \
  Argv[0] = const_cast<char *>(First);                                                       \
  for (size_t I = 1; I < Count; ++I)                                                         \
    Argv[I] = va_arg(Args, char *);

extern "C" int execl(const char *Path, const char *Arg, ...) {
  EKKA_LIST_ARGUMENTS(Arg, Argv)
  va_end(Args);
  return execv(Path, Argv);
}

extern "C" int execlp(const char *File, const char *Arg, ...) {
  EKKA_LIST_ARGUMENTS(Arg, Argv)
  va_end(Args);
  return execvp(File, Argv);
}

extern "C" int execle(const char *Path, const char *Arg, ...) {
  EKKA_LIST_ARGUMENTS(Arg, Argv)
  char *const *Envp = va_arg(Args, char *const *);
  va_end(Args);
  return execve(Path, Argv, Envp);
}

#undef EKKA_LIST_ARGUMENTS

/// exit(), interposed where this library is preloaded: in a traced program,
/// tracing stops first. Elsewhere glibc's own, unchanged.
extern "C" void exit(int Status) noexcept {
  using ExitFn = void (*)(int);
  static auto Real = reinterpret_cast<ExitFn>(dlsym(RTLD_NEXT, "exit"));
  if (::getpid() == TracedProcess.load() && InMain.exchange(false))
    stopNativeTrace();
  if (Real)
    Real(Status);
  _exit(Status); // no C library exit found: cannot happen where the runtime loaded
}

/// C's start-up, interposed where this library is preloaded: the program's
/// main, traced. Everywhere else (the runtime loaded by the Python shim, a
/// process not to be traced) it is glibc's own, unchanged.
extern "C" int __libc_start_main(MainFn Main, int Argc, char **Argv, void (*Init)(),
                                 void (*Fini)(), void (*RtldFini)(), void *StackEnd) {
  using StartFn = int (*)(MainFn, int, char **, void (*)(), void (*)(), void (*)(), void *);
  static auto Real = reinterpret_cast<StartFn>(dlsym(RTLD_NEXT, "__libc_start_main"));
  if (!Real) {
    std::fprintf(stderr, "ekka-trace: error: the C library's __libc_start_main is missing\n");
    std::abort();
  }
  if (!tracesThisProcess())
    return Real(Main, Argc, Argv, Init, Fini, RtldFini, StackEnd);
  ProgramMain = Main;
  return Real(tracedMain, Argc, Argv, Init, Fini, RtldFini, StackEnd);
}
