//===- NativeStart.cpp - Tracing a LibTorch program from its start --------===//
//
// A C++ program that links LibTorch has no Python shim: ekka-trace preloads
// this library into it (LD_PRELOAD, with EKKA_TRACE_NATIVE=1), and the
// trace starts when the library is loaded, before the program's main, and
// stops when the program exits. LibTorch's C++ modules have no hooks: such
// a trace holds the program's ops (and its record_function scopes), their
// tensors and GPU kernels, but no module calls.
//
// Only a process whose executable links LibTorch itself is traced so: the
// preload reaches every process the program starts (under --native, the
// shell that starts it too), and a Python one is left to the shim, which
// starts its trace at its first module call.
//
//===----------------------------------------------------------------------===//
#include "ekka/Runtime/TraceSession.h"
#include "ekka/Support/Executables.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
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

void stopAtExit() {
  std::string Summary;
  try {
    Summary = ekka::stopTrace();
  } catch (const std::exception &E) {
    Summary = std::string("error: stopping failed: ") + E.what();
  }
  if (Summary.rfind("error: ", 0) == 0)
    std::fprintf(stderr, "ekka-trace: %s\n", Summary.c_str());
  else if (auto At = Summary.find("; warning: "); At != std::string::npos)
    std::fprintf(stderr, "ekka-trace: warning: %s\n", Summary.c_str() + At + 11);
}

__attribute__((constructor)) void startNativeTrace() {
  std::string Base = environment("EKKA_TRACE_DIR");
  if (environment("EKKA_TRACE_NATIVE") != "1" || Base.empty() ||
      !ekka::linksLibTorch("/proc/self/exe"))
    return;
  // GPU kernels only with a libcupti named: finding out whether there is a
  // GPU would initialise CUDA here, before the program does (and a child
  // it forks could then use none).
  std::string Cupti = environment("EKKA_CUPTI_LIB");
  std::string Options =
      std::string("native=1;") +
      (Cupti.empty() ? std::string("gpu=a native program (set EKKA_CUPTI_LIB to libcupti's "
                                   "path to trace its GPU kernels);")
                     : "cupti=" + Cupti + ";") +
      environment("EKKA_TRACE_OPTIONS");
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
  } catch (const std::exception &E) { // nothing may escape into the program's start
    Error = E.what();
  }
  if (!Error.empty()) {
    std::fprintf(stderr, "ekka-trace: error: %s\n", Error.c_str());
    return;
  }
  std::atexit(stopAtExit);
}

} // namespace
