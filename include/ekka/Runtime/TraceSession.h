//===- TraceSession.h - The recorder inside a traced process ---*- C++ -*-===//
//
// One per traced process: the open module calls (fed by the Python shim's
// global hooks), a RecordFunction observer that records every ATen/custom op
// under the module call that is open when it runs, and the capture policy.
// Everything is handed to a TraceWriter, whose thread does the I/O. Nothing
// here throws into PyTorch: errors end tracing and are reported at stop().
// It decides what is recorded, not how it is stored (TraceWriter) nor what
// it means (the Analysis library). lib/Runtime/SessionState.h lists its
// parts: the session's life (TraceSession.cpp), the op observer
// (OpObserver.cpp), module calls (ModuleCalls.cpp) and GPU launches
// (LaunchRecording.cpp).
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_RUNTIME_TRACESESSION_H
#define EKKA_RUNTIME_TRACESESSION_H

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

namespace ekka {

/// What to record and capture. Parsed from EKKA_TRACE_OPTIONS (key=value
/// pairs separated by ';'), which ekka-trace sets from its flags.
struct CaptureOptions {
  bool CaptureModules = true;       ///< Module outputs (and the root's inputs).
  std::optional<std::regex> ModuleFilter; ///< Only module paths matching.
  std::optional<std::regex> OpFilter;     ///< Capture outputs of ops matching.
  bool OpStats = false;              ///< Statistics of every op's tensors.
  bool OpInputs = false;             ///< Capture the inputs of captured ops too.
  int64_t MaxSteps = -1;             ///< Capture only the first N steps.
  uint64_t ByteBudget = 0;           ///< Stop capturing past this many bytes (0: none).
  std::string Framework;             ///< A label: "hf", "vllm", "zoo" ...
  std::string CuptiLibrary;          ///< libcupti to load; empty: no GPU kernels.
  std::string GpuStatus;             ///< Why not, when the shim found no GPU.
  bool Timings = false;              ///< Record the tracer's own time (meta tracer_time).
  bool Native = false;               ///< A LibTorch program, preloaded: no module hooks.
  std::string Binding;               ///< How the shim calls the runtime: python, torch.ops.

  static CaptureOptions parse(const std::string &Text, std::string &Error);
};

/// Starts tracing into \p Dir. Returns an error message, or empty.
std::string startTrace(const std::string &Dir, const std::string &Options,
                       const std::string &CommandLine);
/// Opens a module call; returns its id (0 when not tracing).
int64_t enterModule(std::string_view Path, std::string_view ClassName,
                    std::string_view ClassQualname, std::string_view SourceFile,
                    int64_t SourceLine, bool IsRoot, const std::vector<at::Tensor> &Inputs);
/// Closes module call \p Id with its outputs. \p KeywordInputs are the
/// inputs it was given by keyword (global pre-hooks do not see them), the
/// first numbered \p FirstKeywordIndex.
void exitModule(int64_t Id, const std::vector<at::Tensor> &Outputs,
                const std::vector<at::Tensor> &KeywordInputs = {},
                int64_t FirstKeywordIndex = 0);
/// enterModule and exitModule for callers that must not see an exception
/// (the shim's hooks, through either binding): an error costs that record,
/// which meta `lost_records` counts.
int64_t enterModuleNoThrow(std::string_view Path, std::string_view ClassName,
                           std::string_view ClassQualname, std::string_view SourceFile,
                           int64_t SourceLine, bool IsRoot,
                           const std::vector<at::Tensor> &Inputs) noexcept;
void exitModuleNoThrow(int64_t Id, const std::vector<at::Tensor> &Outputs,
                       const std::vector<at::Tensor> &KeywordInputs,
                       int64_t FirstKeywordIndex) noexcept;
/// Whether the trace running is a native program's (NativeStart.cpp): the
/// Python such a program embeds does not stop it.
bool nativeTraceRunning();
/// Flushes and closes the trace; returns a one-line summary or an error
/// message starting with "error: ".
std::string stopTrace();
/// Writes everything recorded so far, with what stopTrace() writes of the
/// trace (meta lost_records ...), and goes on tracing: for a process about
/// to replace itself (exec), which then leaves a trace as whole as a stop
/// would, and, if the exec fails, goes on in the same trace. Returns an
/// error message starting with "error: ", or empty.
std::string flushTrace();
/// After flushTrace() for an exec that failed: the program goes on in the
/// trace, open again, which meta lost_records says ("pending: ...") until
/// tracing stops, so that a program that then ends without stopping leaves
/// a trace that reads as not closed.
void reopenAfterFailedExec();
/// That torch.compile starts compiling on this thread, or that compiling
/// has ended (on whichever thread): Dynamo's compile start and end
/// callbacks, which it calls when the first of its compiles starts and the
/// last ends, on any thread. The ops the compiling thread runs on real
/// tensors meanwhile (making fakes of the inputs, checking guards) and the
/// kernels it launches (autotuning) are Dynamo's, not the program's, and
/// are not recorded. One thread at most: a compile that overlaps (a lazy
/// backward compile on another thread) records its ops, and the first
/// thread's ops after its own compile are not recorded until the last
/// ends. The shim uses it only with a torch whose Dynamo cannot say each
/// compile on its own thread (install_callbacks); else setAside, per thread.
void setCompiling(bool Compiling);
/// That work a library does for itself on this thread begins or ends (they
/// nest): an autotuner's benchmark runs, which launch each configuration
/// of a kernel, cloning and restoring its arguments around each launch, or
/// a torch.compile compile on this thread. Their ops and launches are not
/// the program's and are not recorded; the configuration the autotuner
/// then launches for the program is. A forked child's thread starts with
/// none open.
void setAside(bool Begin);

} // namespace ekka

#endif
