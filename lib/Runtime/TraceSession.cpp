//===- TraceSession.cpp - The recorder inside a traced process ------------===//
#include "SessionState.h"
#include "ekka/Runtime/TraceSession.h"
#include "SessionInternal.h"
#include "StorageWrites.h"
#include "TensorRecording.h"
#include "ekka/Support/Host.h"
#include "ekka/Support/Plural.h"
#include "ekka/Trace/TraceWriter.h"
#include "llvm/ADT/ScopeExit.h"

#include <ATen/SequenceNumber.h>
#include <ATen/Version.h>
#include <ATen/record_function.h>
#include <ATen/core/function_schema.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>
#include <array>
#include <dlfcn.h>
#include <atomic>
#include <limits>
#include <chrono>
#include <cstring>
#include <ctime>
#include <cstdio>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <pthread.h>
#include <unistd.h>

namespace ekka {

using namespace session;

CaptureOptions CaptureOptions::parse(const std::string &Text, std::string &Error) {
  CaptureOptions O;
  std::stringstream In(Text);
  std::string Item;
  while (std::getline(In, Item, ';')) {
    if (Item.empty())
      continue;
    size_t Eq = Item.find('=');
    std::string Key = Item.substr(0, Eq);
    std::string Value = Eq == std::string::npos ? "" : Item.substr(Eq + 1);
    try {
      if (Key == "capture")
        O.CaptureModules = Value != "none";
      else if (Key == "modules")
        O.ModuleFilter.emplace(Value);
      else if (Key == "ops")
        O.OpFilter.emplace(Value);
      else if (Key == "op_stats")
        O.OpStats = Value == "1";
      else if (Key == "op_inputs")
        O.OpInputs = Value == "1";
      else if (Key == "steps")
        O.MaxSteps = std::stoll(Value);
      else if (Key == "budget")
        O.ByteBudget = std::stoull(Value);
      else if (Key == "framework")
        O.Framework = Value;
      else if (Key == "cupti")
        O.CuptiLibrary = Value;
      else if (Key == "gpu")
        O.GpuStatus = Value;
      else if (Key == "timings")
        O.Timings = Value == "1";
      else if (Key == "native")
        O.Native = Value == "1";
      else if (Key == "binding")
        O.Binding = Value;
      else if (Key == "gpu_kernels" && Value == "off") {
        O.CuptiLibrary.clear(); // the shim's libcupti, which comes first
        O.GpuStatus = "disabled by --no-gpu-kernels";
      }
      else
        Error = "unknown trace option '" + Key + "'";
    } catch (const std::exception &E) {
      Error = "bad value for trace option '" + Key + "': " + E.what();
    }
  }
  return O;
}

static thread_local ThreadFlags ThisThread;
[[gnu::noinline]] ThreadFlags &threadFlags() { return ThisThread; }

namespace session {

/// The statistics kernel's launcher, on whichever thread launches (the
/// writer's too): inside Ekka, so that CUPTI's launch callback neither
/// records the launch as the program's nor launches again.
DeviceStatsBatcher::LaunchFn launchDeviceStatsInside(DeviceStatsCounts &Counts) {
  return [&Counts](const std::vector<at::Tensor> &Values, const c10::Stream &Stream) {
    InsideEkkaScope Inside;
    return launchDeviceStats(Values, Stream, Counts);
  };
}

/// How long the trace writer's thread waits for the program to launch the
/// GPU statistics it needs before launching them itself:
/// EKKA_GPU_STATS_WAIT_MS, 20 by default. Longer batches more where a
/// forward takes longer than that; gpu-check sets it long to see that the
/// program's own triggers launch them.
std::chrono::milliseconds deviceStatsPatience() {
  const char *Text = std::getenv("EKKA_GPU_STATS_WAIT_MS");
  char *End = nullptr;
  long long Ms = Text ? std::strtoll(Text, &End, 10) : 20;
  if (Text && (End == Text || *End || Ms < 0)) {
    std::fprintf(stderr,
                 "ekka-trace: warning: EKKA_GPU_STATS_WAIT_MS=%s is not a number of "
                 "milliseconds; 20 used\n",
                 Text);
    Ms = 20;
  }
  return std::chrono::milliseconds(Ms);
}

std::mutex SessionMutex;
Session *Current = nullptr;
/// The stopped sessions, the last first (through StoppedBefore), under
/// SessionMutex. Never deleted (see stopTrace), but kept where they can be
/// found: LeakSanitizer, like a reader, sees them held rather than lost.
Session *StoppedSessions = nullptr;

/// Made as the runtime is loaded; replaced in a forked child, which has one
/// thread (the parent's lock may be held by threads the child does not have).
OpenCallTable *OpenCalls = new OpenCallTable;

/// Builds this thread's state, at its first use.
[[gnu::noinline]] ThreadState &buildThreadState() {
  thread_local ThreadState State;
  return State;
}

void *OpContext::operator new(size_t Size, ThreadState &TS) {
  if (Size == sizeof(OpContext) && !TS.Spare.empty()) {
    void *Memory = TS.Spare.back();
    TS.Spare.pop_back();
    return Memory;
  }
  return ::operator new(Size);
}

void OpContext::operator delete(void *Memory, ThreadState &) { ::operator delete(Memory); }

void OpContext::operator delete(void *Memory, size_t Size) {
  // Not on a thread whose state was never built (end callbacks that run
  // elsewhere) or is gone.
  void *State = threadFlags().State;
  if (Size == sizeof(OpContext) && State) {
    std::vector<void *> &Spare = static_cast<ThreadState *>(State)->Spare;
    if (Spare.size() < ThreadState::SpareKept) {
      Spare.push_back(Memory);
      return;
    }
  }
  ::operator delete(Memory);
}

bool withinCaptureBudget(Session &S, uint64_t Bytes) {
  if (S.Options.ByteBudget && S.CapturedBytes + Bytes > S.Options.ByteBudget) {
    ++S.OverBudget;
    return false;
  }
  S.CapturedBytes += Bytes;
  return true;
}

/// The statistics of \p T, on a GPU, in its stream's order as it is now:
/// by this library's kernel, launched with others (DeviceStatsBatcher), or
/// by ATen's reductions. Launched with those waiting at once unless CUPTI
/// sees the launches, copies, sets and synchronisations outside ops (the
/// batcher's soundness needs them).
std::shared_ptr<DeferredStats> deviceStatsLater(Session &S, const at::Tensor &T) {
  if (valueCount(T) == 0)
    return std::make_shared<DeferredStats>(TensorStats());
  bool OutOfMemory = false;
  c10::Stream Stream(c10::Stream::DEFAULT, T.device());
  if (at::Tensor Values = kernelStatsValues(T, Stream, OutOfMemory); Values.defined())
    return S.DeviceDeferred.defer(std::move(Values), Stream, /*Now=*/!deviceWritesSeen(S));
  if (OutOfMemory)
    return std::make_shared<DeferredStats>(std::nullopt);
  return std::make_shared<DeferredStats>(deviceStats(T, S.GpuStats));
}

/// Records \p T; returns its tensor id, or 0 if it cannot be recorded.
/// \p Known: statistics already computed or deferred for the same tensor,
/// unchanged since; \p Computed receives those computed or deferred here.
int64_t recordTensor(Session &S, const at::Tensor &Given, TensorOwner Owner, int64_t OwnerId,
                     const char *Role, int64_t Index, bool Stats, bool Capture,
                     std::optional<int64_t> SourceId, std::shared_ptr<DeferredStats> Known,
                     std::shared_ptr<DeferredStats> *Computed) {
  if (!Given.defined())
    return 0;
  // A module call's jagged nested tensor is recorded as its packed values,
  // a strided tensor: statistics, strides and, if captured, bytes. An op's
  // has no row: asking for its values would run Python inside the op.
  at::Tensor Packed;
  if (isJagged(Given)) {
    if (Owner != TensorOwner::ModuleCall)
      return 0;
    Packed = jaggedValues(Given);
    if (!Packed.defined())
      return 0;
  }
  const at::Tensor &T = Packed.defined() ? Packed : Given;
  // A tensor of symbolic sizes (torch.compile's, torch.export's) has no
  // row: asking a fake one for its sizes would make them constants. (A
  // jagged tensor's ragged size is symbolic too: it is recorded by its
  // packed values, above.)
  if (T.unsafeGetTensorImpl()->has_symbolic_sizes_strides())
    return 0;
  // The common record, an op's output: a strided tensor's metadata alone,
  // packed from the tensor's own arrays.
  if (!Stats && !Capture && !Packed.defined() && T.layout() == at::kStrided &&
      !T.is_quantized() && !T.is_nested()) {
    std::optional<DType> Type = traceDType(T);
    if (Type && *Type != DType::F4) { // F4's shape is counted in halves of a byte
      c10::IntArrayRef Sizes = T.sizes(), Strides = T.strides(); // may throw (symbolic)
      int64_t Id = S.Writer->nextTensorId();
      S.Writer->addTensorMetadata({Id, Owner, OwnerId, Role, Index, *Type,
                                   llvm::ArrayRef<int64_t>(Sizes.data(), Sizes.size()),
                                   llvm::ArrayRef<int64_t>(Strides.data(), Strides.size()),
                                   deviceName(T.device()), SourceId});
      return Id;
    }
  }
  TensorRecord R;
  // A sparse, nested or quantized tensor: described as the dense tensor it
  // stands for, with statistics of its values (and a sparse one's zeros);
  // not captured (safetensors holds strided tensors only).
  at::Tensor Values;
  int64_t Zeros = 0;
  if (!describeTensor(T, R)) {
    if (!describeValues(T, R, Stats ? &Values : nullptr, Zeros))
      return 0;
    Capture = false;
  } else if (Packed.defined()) {
    R.Layout = "jagged";
  }
  const at::Tensor &Stored = Values.defined() ? Values : T; // what has the bytes
  R.SourceId = SourceId;
  if (!storableDType(R.Type))
    Capture = false; // no safetensors type for it: statistics only
  // No data to read, or none of ours to read: a meta tensor; a tensor
  // subclass that Python dispatches (DTensor, FakeTensor: a read would run
  // its Python, may issue collectives, or find a null data pointer, which
  // crashed the program before); a functional wrapper; a CPU or GPU tensor
  // without storage (torch.func's wrappers; XLA's and lazy tensors, which
  // have none either, take ATen's reductions) or whose storage has no
  // memory. Metadata only.
  if (T.is_meta() ||
      T.key_set().has_any(c10::DispatchKeySet(
          {c10::DispatchKey::Python, c10::DispatchKey::Functionalize})) ||
      (!Stored.has_storage() && (Stored.is_cpu() || Stored.is_cuda())) ||
      (Stored.numel() > 0 && Stored.has_storage() &&
       !Stored.unsafeGetTensorImpl()->unsafe_storage().data())) {
    Stats = Capture = false;
  }
  R.Id = S.Writer->nextTensorId();
  R.Owner = Owner;
  R.OwnerId = OwnerId;
  R.Role = Role;
  R.Index = Index;
  if (Values.defined()) {
    int64_t NewId = R.Id;
    if (!Stats) {
      S.Writer->addTensor(std::move(R), std::nullopt, TraceWriter::BytesUse::StatsOnly);
    } else if (!Values.is_cuda()) {
      TracerTimer Timer(TracerPart::Statistics);
      R.Stats = withZeros(tensorStats(Values), Zeros);
      S.Writer->addTensor(std::move(R), std::nullopt, TraceWriter::BytesUse::StatsOnly);
    } else {
      TracerTimer Timer(TracerPart::Statistics);
      std::function<std::optional<TensorStats>()> Later;
      if (!capturingGraph(Values))
        Later = deviceStats(Values, S.GpuStats);
      S.Writer->addTensor(
          std::move(R),
          [Later, Zeros, &Lost = S.LostReadbacks](TensorRecord &Out,
                                                  std::optional<std::string> &) mutable {
            std::function<std::optional<TensorStats>()> Now = std::move(Later);
            if (std::optional<TensorStats> St = Now ? Now() : std::nullopt)
              Out.Stats = withZeros(*St, Zeros);
            else
              ++Lost;
          },
          0, TraceWriter::BytesUse::StatsOnly);
    }
    return NewId;
  }
  uint64_t Size = uint64_t(T.numel()) * T.element_size();
  // Under a CUDA graph capture nothing is read back (a read-back would
  // become part of the graph): the record stays, without statistics or
  // bytes, counted as lost, and its bytes do not use up the capture budget.
  // Asked once per tensor.
  bool Capturing = T.is_cuda() && (Capture || Stats) && capturingGraph(T);
  if (Capturing)
    Capture = false;
  bool Captured = Capture && withinCaptureBudget(S, Size);
  std::optional<std::string> Data;
  auto Use = TraceWriter::BytesUse::Capture;
  int64_t Id = R.Id;
  if (T.is_cuda() && (Captured || Stats)) {
    // Read back without waiting: the writer's thread waits for the copy.
    // Captured bytes give the statistics too, computed there.
    TraceWriter::Completion Done;
    if (!Captured)
      Use = TraceWriter::BytesUse::StatsOnly;
    if (Captured || Capturing) {
      TracerTimer Timer(TracerPart::Statistics);
      Done = Capturing ? TraceWriter::Completion([&Lost = S.LostReadbacks](
                             TensorRecord &, std::optional<std::string> &) { ++Lost; })
                       : deviceBytes(T, S.LostReadbacks);
    } else {
      // Statistics only: shared with a later record of the same tensor,
      // unchanged (a module returning its last submodule's output).
      std::shared_ptr<DeferredStats> Later = std::move(Known);
      if (!Later) {
        TracerTimer Timer(TracerPart::Statistics);
        Later = deviceStatsLater(S, T);
      }
      if (Computed)
        *Computed = Later;
      // Each record that goes without them counts (they may be shared).
      Done = [Later, &Lost = S.LostReadbacks](TensorRecord &Out, std::optional<std::string> &) {
        Out.Stats = Later->resolve();
        if (!Out.Stats)
          ++Lost;
      };
    }
    S.Writer->addTensor(std::move(R), std::move(Done), Captured ? Size : 0, Use);
    return Id;
  }
  if (Captured) {
    // The statistics are computed from the bytes, on the writer's thread.
    Data = S.Writer->takeBuffer(Size);
    tensorBytes(T, *Data);
  } else if (Stats) {
    TracerTimer Timer(TracerPart::Statistics);
    // A large host tensor's are computed on the writer's thread, from the
    // tensor (DeferredStatsQueue); others here. Outputs only, which ops
    // just wrote: an input may be a buffer the program fills outside the
    // ops between steps (through NumPy, as serving engines fill their
    // persistent input buffers), which the write guard would not see.
    std::shared_ptr<DeferredStats> Later =
        Known ? std::move(Known)
              : std::strcmp(Role, "output") == 0 ? S.Deferred.defer(T) : nullptr;
    if (!Later && !Computed) {
      R.Stats = tensorStats(T);
    } else {
      if (!Later)
        Later = std::make_shared<DeferredStats>(tensorStats(T));
      if (Computed)
        *Computed = Later;
      if (const std::optional<TensorStats> *Ready = Later->settled()) {
        R.Stats = *Ready;
      } else {
        S.Writer->addTensor(std::move(R),
                            [Later](TensorRecord &Out, std::optional<std::string> &) {
                              Out.Stats = Later->resolve();
                            },
                            0, TraceWriter::BytesUse::StatsOnly);
        return Id;
      }
    }
  }
  S.Writer->addTensor(std::move(R), std::move(Data), Use);
  return Id;
}

} // namespace session

bool lostRecord(const char *Where, const std::exception &E) {
  Session *S = Current;
  if (!S)
    return false;
  std::lock_guard<std::mutex> Lock(S->SnapshotErrorMutex);
  if (S->LostRecords++ == 0) {
    const auto *TorchError = dynamic_cast<const c10::Error *>(&E);
    S->FirstLoss = std::string(Where) + ": " +
                   (TorchError ? TorchError->what_without_backtrace() : E.what());
  }
  return true;
}

namespace session {

/// A forked child has the parent's session but not its writer thread: it
/// must not touch either (the parent still owns the files). It forgets the
/// session; if it runs modules, the shim starts a trace of its own.
/// Before fork(): the writer thread must hold no SQLite or allocator lock
/// the child could need. SessionMutex is held across the fork too, so that
/// the session cannot start or stop meanwhile.
Session *ForkingSession = nullptr;
void pauseWriterForFork() {
  SessionMutex.lock();
  ForkingSession = Current;
  if (ForkingSession)
    ForkingSession->Writer->pauseForFork();
}
void resumeWriterInParent() {
  if (ForkingSession)
    ForkingSession->Writer->resumeAfterFork();
  ForkingSession = nullptr;
  SessionMutex.unlock();
}

/// The op observer of the session a forked child forgot: still registered
/// there (the callbacks are the process's). Removed at the child's first op
/// (where it would otherwise take every op's inputs and outputs for
/// nothing, in a DataLoader worker say), or when the child starts a trace
/// of its own (which would see every op twice). Not in the fork handler:
/// removing takes a lock of PyTorch's that another thread of the parent may
/// have held at the fork.
std::optional<at::CallbackHandle> StaleObserver;
std::atomic<bool> StaleObserverPending{false};

/// Under SessionMutex.
void removeStaleObserverLocked() {
  if (StaleObserver)
    at::removeCallback(*StaleObserver);
  StaleObserver.reset();
  StaleObserverPending = false;
}

void removeStaleObserver() {
  std::lock_guard<std::mutex> Lock(SessionMutex);
  if (!Current)
    removeStaleObserverLocked();
}

void forgetSessionInChild() {
  if (ForkingSession) {
    ForkingSession->Writer->resumeAfterFork(); // unlocked: the child never writes with it
    if (ForkingSession->Observer) {
      StaleObserver = ForkingSession->Observer;
      StaleObserverPending = true;
    }
  }
  ForkingSession = nullptr;
  Current = nullptr; // deliberately leaked: its thread exists only in the parent
  // The parent's other threads are gone, and their calls with them. A new
  // table first: this thread's state, if it has none yet, registers in it
  // as it is made (the parent's lock may be held: the parent's table is
  // leaked).
  if (auto *Fresh = new (std::nothrow) OpenCallTable)
    OpenCalls = Fresh;
  ThreadState &TS = thisThread();
  TS.CallStack.clear();
  TS.OsThread = int64_t(::gettid());
  try {
    OpenCalls->ByThread[TS.RecordThreadId] = TS.OpenNow;
  } catch (...) { // out of memory: other threads' passes find no call here
  }
  publishOpenCall(TS);
  TS.BackwardOwners = {};
  TS.LookedUpThread = 0;
  TS.LookedUpCell.reset();
  TS.LookedUpMissing = false;
  StorageWriteCounts::forgetInChild();
  forgetProducers(TS, /*Unwatch=*/false);
  TS.PendingSnapshots.clear();
  TS.LastLaunch = {};
  new (&SessionMutex) std::mutex();
  forgetTerminationFlushInChild();
  CompilingThread = nullptr; // the parent's compile, if one was under way
  threadFlags().Aside = 0;   // likewise (a compile's, or an autotuner's)
}

/// What meta `tracer_time` says: milliseconds and calls of each part.
std::string tracerTime(Session &S) {
  static const char *Names[TracerParts] = {"ops", "modules", "statistics", "kernel_callbacks",
                                          "device_submit"};
  std::string Out = "{";
  for (int P = 0; P < TracerParts; ++P) {
    char Item[128];
    std::snprintf(Item, sizeof(Item), "%s\"%s_ms\": %.3f, \"%s\": %llu", P ? ", " : "",
                  Names[P], double(S.PartNanos[P].load()) / 1e6, Names[P],
                  (unsigned long long)S.PartCalls[P].load());
    Out += Item;
  }
  // Not the tracer's work, but time it cost the program: its threads
  // waited for room in the writer's queue.
  TraceCounts C = S.Writer->counts();
  char Item[128];
  std::snprintf(Item, sizeof(Item), ", \"writer_waits_ms\": %.3f, \"writer_waits\": %llu",
                double(C.RoomWaitNanos) / 1e6, (unsigned long long)C.RoomWaits);
  return Out + Item + "}";
}

} // namespace session

TracerTimer::TracerTimer(TracerPart Part, bool NewCall) : Part(Part), NewCall(NewCall) {
  Session *S = Current;
  if (S && S->Options.Timings)
    Start = nowNanos();
}

TracerTimer::~TracerTimer() {
  Session *S = Current;
  if (!Start || !S)
    return;
  S->PartNanos[int(Part)].fetch_add(nowNanos() - Start, std::memory_order_relaxed);
  if (NewCall)
    S->PartCalls[int(Part)].fetch_add(1, std::memory_order_relaxed);
}

/// The fork handlers are registered when the library is loaded, before any
/// thread of the program can be inside the runtime. Not at the first start:
/// glibc runs the prepare handlers holding the lock that pthread_atfork
/// takes, so a fork on one thread (its prepare handler waiting for
/// SessionMutex) and the first start on another (registering the writer's
/// handler under SessionMutex) waited for each other; and a child forked
/// while a thread was inside the registration found it forever under way.
[[gnu::constructor]] static void installForkHandlers() {
  TraceWriter::installForkHandler();
  pthread_atfork(pauseWriterForFork, resumeWriterInParent, forgetSessionInChild);
}

std::string startTrace(const std::string &Dir, const std::string &OptionsText,
                       const std::string &CommandLine) {
  std::lock_guard<std::mutex> Lock(SessionMutex);
  if (Current) {
    // A LibTorch program that embeds Python: the shim's module calls go
    // into the program's trace.
    if (Current->Options.Native && OptionsText.find("native=1") == std::string::npos)
      Current->Writer->setMeta("module_calls",
                               "traced in the Python that the native LibTorch program runs "
                               "(its C++ modules have no hooks)");
    return "";
  }
  std::string Error;
  CaptureOptions Options = CaptureOptions::parse(OptionsText, Error);
  if (!Error.empty())
    return Error;
  auto Writer = TraceWriter::create(Dir);
  if (!Writer)
    return llvm::toString(Writer.takeError());
  auto *S = new Session();
  static uint64_t Sessions = 0;
  S->Serial = ++Sessions;
  S->Writer = std::move(*Writer);
  S->Options = std::move(Options);
  S->OptionsText = OptionsText;
  TraceWriter &W = *S->Writer;
  W.setMeta("tool_version", "0.1.0");
  W.setMeta("command_line", CommandLine);
  W.setMeta("framework", S->Options.Framework);
  W.setMeta("capture", OptionsText.empty() ? "default" : OptionsText);
  W.setMeta("pid", std::to_string(::getpid()));
  // The CPU and its vector extensions, and the kernels torch picks by
  // them: the same program on another machine computes with others.
  W.setMeta("host", describeHostCpu() + "; torch CPU capability " + at::get_cpu_capability());
  const char *Rank = std::getenv("RANK");
  const char *World = std::getenv("WORLD_SIZE");
  W.setMeta("rank", Rank ? Rank : "0");
  W.setMeta("world_size", World ? World : "1");
  if (!S->Options.Binding.empty())
    W.setMeta("shim_binding", S->Options.Binding);
  if (S->Options.Native)
    W.setMeta("module_calls", "not traced: a native LibTorch program, whose C++ modules have no "
                              "hooks; its ops and record_function scopes are traced");
  Current = S;
  // GPU kernels: CUPTI's launch callbacks, when the shim found a GPU and
  // the libcupti that torch ships with.
  std::string Kernels = S->Options.CuptiLibrary.empty()
                            ? "not traced: " + (S->Options.GpuStatus.empty()
                                                    ? std::string("no CUDA device")
                                                    : S->Options.GpuStatus)
                            : startKernelTracing(S->Options.CuptiLibrary);
  S->TracingKernels = Kernels == "traced";
  W.setMeta("gpu_kernels", Kernels);
  if (Kernels.find("another CUPTI subscriber") != std::string::npos)
    std::fprintf(stderr, "ekka-trace: warning: GPU kernels %s\n", Kernels.c_str());
  removeStaleObserverLocked();
  S->Observer = at::addGlobalCallback(
      at::RecordFunctionCallback(onOpStart, onOpEnd)
          .needsInputs(true)
          .needsOutputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
  installTerminationFlush();
  return "";
}

/// What the writer's thread could not complete, as the trace's meta and
/// stderr report it (after \p Before, the losses known before): device
/// read-backs lost, statistics whose tensor's memory moved before the
/// writer's thread read it.
static std::string lostLater(Session &S, std::string Before) {
  auto Add = [&](int64_t N, const char *What) {
    if (N)
      Before += (Before.empty() ? "" : "; ") + countOf(N, "tensor's", "tensors'") + What;
  };
  Add(S.LostReadbacks.load(), " statistics or bytes never came back from the device "
                              "(recorded without; a stream capturing a CUDA graph, a device "
                              "error, or a storage freed before its statistics were launched)");
  Add(S.Deferred.unavailable(),
      " statistics could not be computed (recorded without): their storage was "
      "resized or moved outside PyTorch's ops before the trace's writer read it");
  if (S.UnsettledAtTermination.load())
    Before += std::string(Before.empty() ? "" : "; ") +
              "unknown: SIGTERM ended the process while its threads still recorded; what they "
              "recorded after the trace was written out is missing";
  return Before;
}

bool nativeTraceRunning() {
  std::lock_guard<std::mutex> Lock(SessionMutex);
  return Current && Current->Options.Native;
}

namespace {

/// What a trace says of itself once it is closed (or flushed for an exec):
/// its kernel snapshots (\p Missed: what kernel tracing missed), the
/// tracer's time, the GPU read-backs, and, written after every queued
/// record, its lost records. Returns what was lost to errors so far.
std::string writeClosingMeta(Session &S, const std::string &Missed) {
  if (S.TracingKernels) {
    std::string Taken = std::to_string(S.KernelSnapshots.load()) + " buffers snapshotted from " +
                        std::to_string(S.CapturedOpLaunches.load()) + " launches in captured ops (" +
                        std::to_string(S.UnmatchedLaunches.load()) +
                        " pointing into no argument of the op, " +
                        std::to_string(S.FailedCopies.load()) + " copies failed, " +
                        std::to_string(S.RecordedSnapshots.load()) + " recorded";
    {
      std::lock_guard<std::mutex> Lock(S.SnapshotErrorMutex);
      if (!S.SnapshotError.empty())
        Taken += ": " + S.SnapshotError.substr(0, 300);
    }
    Taken += ")";
    S.Writer->setMeta("kernel_snapshots", Missed.empty() ? Taken : Taken + "; " + Missed);
  }
  std::string Lost;
  {
    std::lock_guard<std::mutex> Lock(S.SnapshotErrorMutex);
    if (S.LostRecords)
      Lost = countOf(S.LostRecords, "record") + " lost to errors (first: " +
             S.FirstLoss.substr(0, 300) + ")";
  }
  if (S.Options.ByteBudget)
    S.Writer->setMeta("capture_budget",
                      std::to_string(S.Options.ByteBudget) + " bytes: " +
                          (S.OverBudget ? "reached, " + std::to_string(S.OverBudget.load()) +
                                              " tensors not captured (statistics and metadata "
                                              "only)"
                                        : std::string("not reached")));
  if (S.Options.Timings)
    S.Writer->setMeta("tracer_time", tracerTime(S));
  if (std::string GpuStats = S.GpuStats.describe(); !GpuStats.empty())
    S.Writer->setMeta("gpu_statistics", GpuStats);
  // Written after every queued record: the device read-backs the writer's
  // thread waited for are all counted by then.
  Session *P = &S;
  S.Writer->setMeta("lost_records", [P, Lost]() -> std::string {
    std::string Out = lostLater(*P, Lost);
    return Out.empty() ? "0" : Out;
  });
  return Lost;
}

} // namespace

std::string stopTrace() {
  standStillIfTerminating(threadFlags()); // a program that would have ended meanwhile
  setStoppingThread(true);
  auto Stopped = llvm::make_scope_exit([] { setStoppingThread(false); });
  std::unique_lock<std::mutex> Lock(SessionMutex);
  Session *S = Current;
  if (!S)
    return "";
  // Once the observer is gone, writes go unseen: no more tensors are
  // handed over, and the statistics still to compute are computed now.
  S->Deferred.stop();
  S->Deferred.settleAll();
  S->DeviceDeferred.stop();
  S->DeviceDeferred.settleAll();
  if (S->Observer)
    at::removeCallback(*S->Observer);
  std::string Missed = S->TracingKernels ? stopKernelTracing() : std::string();
  std::string Lost = writeClosingMeta(*S, Missed);
  Current = nullptr;
  S->StoppedBefore = StoppedSessions;
  StoppedSessions = S;
  llvm::Error E = S->Writer->close();
  TraceCounts C = S->Writer->counts();
  std::string Result;
  if (E)
    Result = "error: " + llvm::toString(std::move(E));
  else
    Result = countOf(C.ModuleCalls, "module call") + ", " + countOf(C.Ops, "op") + ", " +
             countOf(C.Kernels, "kernel") + ", " + countOf(C.Tensors, "tensor") + ", " +
             countOf(C.CapturedBytes, "byte") + " captured";
  // Known only now: the writer's thread waited for the device's copies.
  Lost = lostLater(*S, Lost);
  if (!Result.empty() && !Lost.empty() && Result.rfind("error: ", 0) != 0)
    Result += "; warning: " + Lost;
  // Not deleted: an observer or CUPTI callback on another thread may still
  // hold it; the writer is closed and drops what they enqueue now. The last
  // tensors held (all settled: none were taken since stop()) are released
  // without the lock: a release may wait for the GIL, whose holder may wait
  // for the lock (a fork). A SIGTERM during the close waited for it (its
  // flush takes the lock): only now is SIGTERM the program's again.
  uninstallTerminationFlush();
  Lock.unlock();
  S->Deferred.releaseSettled();
  S->DeviceDeferred.releaseSettled();
  return Result;
}

std::string flushTrace() {
  std::unique_lock<std::mutex> Lock(SessionMutex);
  Session *S = Current;
  if (!S)
    return "";
  S->DeviceDeferred.launchAll(); // the writer's thread waits for them
  writeClosingMeta(*S, S->TracingKernels ? kernelTracingMisses() : std::string());
  // The writer is waited for without the lock: other threads' records go
  // on meanwhile (the session is never deleted).
  Lock.unlock();
  if (llvm::Error E = S->Writer->flush())
    return "error: " + llvm::toString(std::move(E));
  return "";
}

std::string settleTraceAfterTermination(std::chrono::steady_clock::time_point Deadline) {
  using Clock = std::chrono::steady_clock;
  auto Written = [] {
    std::lock_guard<std::mutex> Lock(SessionMutex);
    if (!Current)
      return std::optional<uint64_t>();
    TraceCounts C = Current->Writer->counts();
    return std::optional<uint64_t>(C.ModuleCalls + C.Ops + C.Kernels + C.Tensors);
  };
  auto Unsettled = [](bool Is) {
    std::lock_guard<std::mutex> Lock(SessionMutex);
    if (Current)
      Current->UnsettledAtTermination = Is;
  };
  // Each flush meanwhile says the trace may lack what came later, until
  // one writes nothing new: a flush the process's end cuts short leaves
  // that said, not "0".
  constexpr std::chrono::milliseconds Pause(50);
  std::optional<uint64_t> Before = Written();
  if (!Before)
    return "";
  Unsettled(true);
  Clock::duration Longest{};
  for (;;) {
    if (Clock::now() + Pause + Longest >= Deadline)
      return flushTrace(); // still growing: said in meta lost_records
    std::this_thread::sleep_for(Pause);
    Clock::time_point Start = Clock::now();
    std::string Error = flushTrace();
    Longest = std::max(Longest, Clock::now() - Start);
    std::optional<uint64_t> After = Written();
    if (!Error.empty() || !After)
      return Error;
    if (After == Before)
      break;
    Before = After;
  }
  Unsettled(false);
  return flushTrace(); // nothing new: only the meta written again
}

std::atomic<const ThreadFlags *> CompilingThread{nullptr};

void setCompiling(bool Compiling) { CompilingThread = Compiling ? &threadFlags() : nullptr; }

void setAside(bool Begin) {
  ThreadFlags &Flags = threadFlags();
  if (Begin)
    ++Flags.Aside;
  else if (Flags.Aside)
    --Flags.Aside;
}

void reopenAfterFailedExec() {
  std::unique_lock<std::mutex> Lock(SessionMutex);
  Session *S = Current;
  if (!S)
    return;
  S->Writer->setMeta("lost_records", "pending: tracing went on after a failed exec");
  // Written now: the program may yet end without stopping.
  Lock.unlock();
  consumeError(S->Writer->flush());
}

} // namespace ekka
