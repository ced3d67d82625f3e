//===- TorchOps.cpp - The runtime as PyTorch custom ops -------------------===//
//
// The Python shim reaches the runtime through torch.ops.ekka.*: tensors pass
// to C++ through the dispatcher PyTorch already has, in any build. The
// observer ignores these ops (their names start with "ekka::"); enter and
// exit are not even observed. Where Python's headers were found, the module
// calls take a shorter way (PythonBinding.cpp), to the same functions.
//
//===----------------------------------------------------------------------===//
#include "SessionInternal.h"
#include "ekka/Runtime/TraceSession.h"

#include <ATen/core/dispatch/ObservedOperators.h>
#include <torch/library.h>

#include <atomic>
#include <cstdio>
#include <stdexcept>

namespace {

// Nothing may throw into the traced program: an error in recording costs
// that record (\p Record), which the trace's meta `lost_records` counts (and
// the summary at the end says). Starting and stopping are no records: their
// errors, and those outside a trace, stderr says, once.
template <typename Fn, typename R> R guarded(const char *Where, bool Record, Fn F, R Fallback) {
  auto Failed = [&](const std::exception &E) {
    static std::atomic<bool> Said{false};
    if (!(Record && ekka::lostRecord(Where, E)) && !Said.exchange(true)) {
      const auto *TorchError = dynamic_cast<const c10::Error *>(&E);
      std::fprintf(stderr, "ekka-trace: warning: %s: %s\n", Where,
                   TorchError ? TorchError->what_without_backtrace() : E.what());
    }
    return Fallback;
  };
  try {
    return F();
  } catch (const std::exception &E) {
    return Failed(E);
  } catch (...) {
    return Failed(std::runtime_error("an exception of unknown type"));
  }
}

std::string startOp(std::string Dir, std::string Options, std::string CommandLine) {
  return guarded(
      "start", /*Record=*/false, [&] { return ekka::startTrace(Dir, Options, CommandLine); },
      std::string("the runtime failed to start"));
}

int64_t enterOp(std::string Path, std::string ClassName, std::string ClassQualname,
              std::string SourceFile, int64_t SourceLine, bool IsRoot,
              std::vector<at::Tensor> Inputs) {
  return ekka::enterModuleNoThrow(Path, ClassName, ClassQualname, SourceFile, SourceLine, IsRoot,
                                  Inputs);
}

void exitOp(int64_t Id, std::vector<at::Tensor> Outputs, std::vector<at::Tensor> KeywordInputs,
            int64_t FirstKeywordIndex) {
  ekka::exitModuleNoThrow(Id, Outputs, KeywordInputs, FirstKeywordIndex);
}

std::string flushOp() {
  return guarded("flush", /*Record=*/false, [&] { return ekka::flushTrace(); },
                 std::string("error: flushing failed"));
}

void execFailedOp() {
  guarded("exec_failed", /*Record=*/false, [&] {
    ekka::reopenAfterFailedExec();
    return true;
  }, false);
}

std::string stopOp() {
  return guarded("stop", /*Record=*/false, [&] {
    // The Python a LibTorch program embeds ends before the program does:
    // its trace goes on until the program's main returns.
    return ekka::nativeTraceRunning() ? std::string() : ekka::stopTrace();
  }, std::string("error: stopping failed"));
}

void compilingOp(bool Compiling) { ekka::setCompiling(Compiling); }

void asideOp(bool Begin) { ekka::setAside(Begin); }

/// A kernel launch as CUPTI would report it, made from inside a program:
/// for tests on machines without a GPU. The kernel gets one pointer
/// parameter per buffer, pointing at its data, and is recorded under the op
/// and module call open around this call; its buffers are snapshotted as
/// after a real launch.
void simulatedLaunchOp(std::string Name, std::vector<at::Tensor> Buffers) {
  guarded("simulated launch", /*Record=*/true, [&] {
    ekka::KernelLaunch L;
    L.Name = Name.c_str();
    L.Grid[0] = L.Block[0] = 1;
    std::vector<ekka::PointerArgument> Pointers;
    for (size_t I = 0; I < Buffers.size(); ++I)
      Pointers.push_back({uint32_t(I), reinterpret_cast<uint64_t>(Buffers[I].data_ptr())});
    ekka::recordKernelLaunch(L, Pointers);
    ekka::snapshotKernelBuffers();
    return 0;
  }, 0);
}

/// The shim's module calls are no ops of the program: the dispatcher makes
/// no RecordFunction for them (it would box their arguments for every
/// observer, ours included, at every module entry and exit). An operator
/// is marked so when it is registered, below, in this file's order.
const bool ModuleCallsUnobserved = [] {
  auto &Unobserved = c10::ObservedOperators::getUnobservedOperatorList();
  Unobserved.insert("ekka::enter");
  Unobserved.insert("ekka::exit");
  return true;
}();

} // namespace

int64_t ekka::enterModuleNoThrow(std::string_view Path, std::string_view ClassName,
                                 std::string_view ClassQualname, std::string_view SourceFile,
                                 int64_t SourceLine, bool IsRoot,
                                 const std::vector<at::Tensor> &Inputs) noexcept {
  return guarded("module entry", /*Record=*/true, [&] {
    return enterModule(Path, ClassName, ClassQualname, SourceFile, SourceLine, IsRoot, Inputs);
  }, int64_t(0));
}

void ekka::exitModuleNoThrow(int64_t Id, const std::vector<at::Tensor> &Outputs,
                             const std::vector<at::Tensor> &KeywordInputs,
                             int64_t FirstKeywordIndex) noexcept {
  guarded("module exit", /*Record=*/true, [&] {
    exitModule(Id, Outputs, KeywordInputs, FirstKeywordIndex);
    return 0;
  }, 0);
}

TORCH_LIBRARY(ekka, m) {
  m.def("simulated_launch(str name, Tensor[] buffers) -> ()", simulatedLaunchOp);
  m.def("start(str dir, str options, str command_line) -> str", startOp);
  m.def("enter(str path, str class_name, str class_qualname, str source_file, "
        "int source_line, bool is_root, Tensor[] inputs) -> int",
        enterOp);
  m.def("exit(int id, Tensor[] outputs, Tensor[] keyword_inputs, int first_keyword_index) -> ()",
        exitOp);
  m.def("stop() -> str", stopOp);
  m.def("flush() -> str", flushOp);
  m.def("exec_failed() -> ()", execFailedOp);
  m.def("compiling(bool compiling) -> ()", compilingOp);
  m.def("aside(bool begin) -> ()", asideOp);
}
