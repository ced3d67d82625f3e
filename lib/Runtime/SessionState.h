//===- SessionState.h - The recorder's shared state -------------*- C++ -*-===//
//
// What the recorder inside a traced process keeps: the session (the
// process's, one at a time), each thread's state, and each op's context
// while it runs; and the few functions its parts share. The parts are
// TraceSession.cpp (starting, flushing and stopping a session, forks,
// recording a tensor), OpObserver.cpp (every op, through RecordFunction),
// ModuleCalls.cpp (module calls' entries and exits, and the dataflow
// between them) and LaunchRecording.cpp (GPU kernel launches and the
// snapshots of their buffers). Private to lib/Runtime.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_LIB_RUNTIME_SESSIONSTATE_H
#define EKKA_LIB_RUNTIME_SESSIONSTATE_H

#include "ekka/Runtime/TraceSession.h"
#include "SessionInternal.h"
#include "StorageWrites.h"
#include "TensorRecording.h"
#include "ekka/Trace/TraceWriter.h"

#include <ATen/record_function.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ekka {
namespace session {

struct OpenCall {
  int64_t Id;
  bool Capture;       ///< Whether this call's tensors are captured.
  int64_t FirstTensor; ///< Tensor ids from here on were recorded inside it.
  /// The thread's next autograd sequence number as it began: the nodes its
  /// forward made have this one or a later.
  uint64_t Since;
  uint64_t StartNs; ///< Its span's start: its inputs recorded (nowNanos).
  uint64_t SessionSerial; ///< The session it was entered in (Session::Serial).
};

/// A module output the trace recorded, to recognise it when it comes back as
/// another module's input: that is the dataflow between module calls. Weak,
/// so tracing keeps no activation alive. An output changed in place since
/// (vLLM's fused residual add) is told from the one recorded by the writes
/// the op observer counted to its storage, on any thread (StorageWrites.h):
/// an inference tensor (torch.inference_mode, as vLLM and SGLang run) has no
/// version counter, and a write through `.data` or `detach()` bumps another
/// tensor's. The version counter, where there is one, still tells a write
/// that no op announced to the observer (one under its own op, inside Ekka).
struct ProducedTensor {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> Impl;
  const void *Storage; ///< Watched in StorageWriteCounts::process(); or null.
  int64_t Writes;      ///< The writes to it counted then.
  int64_t Version;     ///< Its version counter then; 0 for an inference tensor.
  bool Inference;
  int64_t TensorId;
  /// Its statistics, where this thread computed or deferred them, and how
  /// many ops this thread had begun then.
  std::shared_ptr<DeferredStats> Stats;
  uint64_t OpsBefore = 0;
};

/// The statistics kernel's launcher, and how long a batch of GPU
/// statistics may wait (TraceSession.cpp).
DeviceStatsBatcher::LaunchFn launchDeviceStatsInside(DeviceStatsCounts &Counts);
std::chrono::milliseconds deviceStatsPatience();

/// The process-wide state. Hot paths take no lock but the writer's queue.
struct Session {
  /// Distinct for every session of the process (a pointer may be reused).
  uint64_t Serial = 0;
  /// The session stopped before this one, once this one is stopped
  /// (StoppedSessions, TraceSession.cpp).
  Session *StoppedBefore = nullptr;
  std::unique_ptr<TraceWriter> Writer;
  CaptureOptions Options;
  std::string OptionsText;
  std::atomic<int64_t> CallSeq{0}, OpSeq{0}, KernelSeq{0}, KernelSnapshots{0};
  /// Device statistics or bytes that never arrived (an error waiting for
  /// the copy): their records are written without them.
  std::atomic<int64_t> LostReadbacks{0};
  /// How GPU tensors' statistics were read back (meta gpu_statistics).
  DeviceStatsCounts GpuStats;
  /// Launches inside captured ops, and those whose pointers matched no
  /// tensor of the op or whose copy failed: the meta's kernel_snapshots.
  std::atomic<int64_t> CapturedOpLaunches{0}, UnmatchedLaunches{0}, FailedCopies{0},
      RecordedSnapshots{0};
  std::string SnapshotError; ///< The first error recording a snapshot.
  /// With timings: nanoseconds spent in each TracerPart, and how often.
  std::atomic<uint64_t> PartNanos[TracerParts] = {}, PartCalls[TracerParts] = {};
  std::mutex SnapshotErrorMutex;
  int64_t LostRecords = 0; ///< Under SnapshotErrorMutex, with the first reason.
  std::string FirstLoss;
  /// Set while a SIGTERM's flush waits for threads that still add records
  /// (settleTraceAfterTermination), and where it ended the process first.
  std::atomic<bool> UnsettledAtTermination{false};
  bool TracingKernels = false;
  std::atomic<int64_t> Step{0};
  std::atomic<uint64_t> CapturedBytes{0};
  /// Tensors that --budget left uncaptured (statistics and metadata only).
  std::atomic<uint64_t> OverBudget{0};
  std::optional<at::CallbackHandle> Observer;
  /// CPU tensors whose statistics the writer's thread computes.
  DeferredStatsQueue Deferred;
  /// GPU tensors whose statistics are launched together.
  DeviceStatsBatcher DeviceDeferred{launchDeviceStatsInside(GpuStats), deviceStatsPatience()};
  std::string Error;
};

/// Held while a session starts, stops or flushes, and across a fork.
extern std::mutex SessionMutex;
/// The running session, or null.
extern Session *Current;

/// What the observer needs to know of an operator (a name and overload),
/// worked out once per thread: its schema as text, which of its arguments
/// it writes (`Tensor(a!)`), and whether the session's op filter takes it.
/// Copying or printing a FunctionSchema, or running the filter, at every
/// call would dominate the observer's cost.
struct OpKind {
  std::string Name, Overload; ///< What the key's pointers pointed to.
  std::string Schema;
  std::vector<bool> Written;  ///< By argument position.
  /// Writes to tensors that its schema does not mark written: c10d's
  /// collectives (`allreduce_` reduces its tensors in place, and
  /// `broadcast_`, `recv_`, `_allgather_base_` write theirs).
  bool WritesUnmarked = false;
  uint64_t FilteredIn = 0;    ///< The session Captured was decided for.
  bool Captured = false;
  uint64_t InternedIn = 0;    ///< The session whose writer holds Text.
  const TraceWriter::OpText *Text = nullptr;
};

/// An operator's name and overload as RecordFunction gives them: pointers
/// into its registered schema, stable while it is registered. A hit is
/// checked against the text, as an operator may be deregistered and its
/// memory reused.
struct OpKey {
  const char *Name, *Overload;
  bool operator==(const OpKey &O) const { return Name == O.Name && Overload == O.Overload; }
};

struct OpKeyHash {
  size_t operator()(const OpKey &K) const {
    return std::hash<const void *>()(K.Name) * 31 + std::hash<const void *>()(K.Overload);
  }
};

/// A copy of a buffer a kernel was given, taken right after the kernel on
/// its stream.
struct KernelSnapshot {
  int64_t KernelId;
  uint32_t Param;    ///< The kernel parameter that points into the tensor.
  bool Mutable;      ///< The op's schema marks the tensor as written.
  at::Tensor Copy;
  uint64_t Stream;
};

/// The texts of a module call a thread entered last under a path, interned
/// by the session whose serial is InternedIn (see enterModule).
struct ModuleTextEntry {
  const TraceWriter::ModuleText *Text = nullptr;
  uint64_t InternedIn = 0;
};

/// Looks a path up by its view, with no string made.
struct TextHash {
  using is_transparent = void;
  size_t operator()(std::string_view Text) const { return std::hash<std::string_view>()(Text); }
};

/// A kernel's name a thread launched last from the same address, interned
/// by the session whose serial is InternedIn.
struct KernelNameEntry {
  const std::string *Name = nullptr;
  uint64_t InternedIn = 0;
};

struct ThreadState;

struct OpContext : at::ObserverContext {
  int64_t OpId = 0;
  uint64_t StartNs = 0; ///< Its span's start (nowNanos), its inputs recorded.
  /// The thread that began it (an op's end may run on another: an async
  /// record_function's), and the session it began in: an op still running
  /// when a session stops writes no span into the next one.
  int64_t Thread = 0;
  uint64_t SessionSerial = 0;
  bool Operator = false; ///< A dispatcher op with a schema, not a named scope.
  bool Capture = false; ///< Whether this op's tensors are captured.
  /// Arguments the schema marks as written (`Tensor(a!)`), taken at the
  /// op's start: RecordFunction's inputs are only valid then.
  std::vector<at::Tensor> Mutated;
  /// For a captured op: its tensor arguments, the buffers its kernels'
  /// pointer parameters are matched against, and whether each is written.
  std::vector<at::Tensor> Arguments;
  std::vector<bool> ArgumentMutable;
  std::vector<KernelSnapshot> Snapshots;
  const OpKind *Kind = nullptr;
  /// For a scope or an op that only echoes the op open around it (see
  /// echoed()): that op, to which what runs inside is attributed. Nothing
  /// of the echo's own is recorded.
  OpContext *Echoes = nullptr;
  /// An echo that is the scope of a TorchDispatchMode's handling of the op.
  bool ModeScope = false;

  // One per op: kept for reuse by the thread (ThreadState::Spare), as a
  // malloc and a free per op are a tenth of the observer's work on a CPU
  // tensor. Made with the state the op's start looked up: `new (TS)`.
  static void *operator new(size_t Size, ThreadState &TS);
  static void operator delete(void *Memory, ThreadState &TS); // the constructor threw
  static void operator delete(void *Memory, size_t Size);
};

/// A snapshot decided at a launch's API entry, taken at its exit, when the
/// kernel is on its stream.
struct PendingSnapshot {
  OpContext *Op;
  int64_t KernelId;
  uint32_t Param;
  size_t Argument;
  uint64_t Stream;
};

/// The launch recorded last on a thread, whose kernel may still get its
/// pointer parameters (from the driver launch underneath a runtime launch).
struct RecentLaunch {
  OpContext *Op = nullptr;
  int64_t KernelId = 0;
  uint64_t Stream = 0;
};

/// A thread's open call, as other threads read it (OpenCallTable).
struct OpenCallCell {
  /// Set by its thread only: the call open on it (0: none) and the call's
  /// OpenCall::Since, read together (a sequence lock: odd while written).
  void set(int64_t Call, uint64_t Since) {
    uint64_t V = Version.load(std::memory_order_relaxed);
    Version.store(V + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    this->Call.store(Call, std::memory_order_relaxed);
    this->Since.store(Since, std::memory_order_relaxed);
    Version.store(V + 2, std::memory_order_release);
  }
  std::pair<int64_t, uint64_t> get() const {
    for (;;) {
      uint64_t V = Version.load(std::memory_order_acquire);
      int64_t C = Call.load(std::memory_order_relaxed);
      uint64_t S = Since.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (!(V & 1) && Version.load(std::memory_order_relaxed) == V)
        return {C, S};
    }
  }

private:
  std::atomic<uint64_t> Version{0};
  std::atomic<int64_t> Call{0};
  std::atomic<uint64_t> Since{0};
};

/// The module call open on each thread now, by RecordFunction's id of the
/// thread (never reused), which autograd's nodes keep as their forward's
/// (Node::thread_id): an op of a backward pass on a thread with no call open
/// belongs to the call open on the thread that ran its node's forward
/// (openCall). Each thread's cell is shared, so that a reader that found it
/// may keep it past the thread's end (it then holds 0).
struct OpenCallTable {
  std::mutex Mutex;
  std::unordered_map<uint64_t, std::shared_ptr<OpenCallCell>> ByThread;
  /// Threads added so far: a thread found missing before may be here now.
  std::atomic<uint64_t> Added{0};
};
/// Made as the runtime is loaded; replaced in a forked child, which has one
/// thread (the parent's lock may be held by threads the child does not have).
extern OpenCallTable *OpenCalls;

/// What the runtime keeps per thread, in one place, built at the thread's
/// first module call or op and reached through ThreadFlags::State. The
/// observer's callbacks look it up once (thisThread) and hand it on.
struct ThreadState {
  /// The step of this thread's last root call: its calls' step (threads
  /// that each run a model take turns in the session's count); 0 before one.
  /// Of the session whose serial is StepIn (not an earlier session's, nor,
  /// in a forked child, the parent's).
  int64_t Step = 0;
  uint64_t StepIn = 0;
  /// The module calls open on this thread.
  std::vector<OpenCall> CallStack;
  /// The module outputs recorded in this root forward (see ProducedTensor),
  /// their storages watched while they are here.
  std::unordered_map<const c10::TensorImpl *, ProducedTensor> Producers;
  /// Producers' size at which those freed meanwhile are let go
  /// (pruneProducers): twice what lived at the last look.
  static constexpr size_t ProducersPrunedFrom = 64;
  size_t PruneProducersAt = ProducersPrunedFrom;
  std::vector<OpContext *> OpStack; ///< Ops running on this thread.
  /// Ops of the program this thread began, and the writes to device memory
  /// it made that no op announced (CUPTI's callbacks count those).
  uint64_t OpsBegun = 0;
  uint64_t OpStarts = 0; ///< The ops alone.
  std::vector<PendingSnapshot> PendingSnapshots;
  RecentLaunch LastLaunch;
  std::unordered_map<OpKey, OpKind, OpKeyHash> Kinds;
  OpKind Unnamed; ///< A named scope's, made anew at each (opKind).
  /// By module path: a module is entered again at every forward.
  std::unordered_map<std::string, ModuleTextEntry, TextHash, std::equal_to<>> ModuleTexts;
  /// By the address of the name CUPTI reports for a kernel (its module's
  /// symbol, the same at every launch of the kernel).
  std::unordered_map<const char *, KernelNameEntry> KernelNames;
  static constexpr size_t MaxKernelNames = 4096;
  /// Freed OpContexts' memory, for the next ops (at most SpareKept).
  std::vector<void *> Spare;
  static constexpr size_t SpareKept = 64;
  /// RecordFunction's id of this thread, and the call open on it now
  /// (CallStack's last, or 0): this thread's cell of OpenCalls.
  uint64_t RecordThreadId;
  std::shared_ptr<OpenCallCell> OpenNow;
  /// The OS's id of this thread (gettid()), as the trace's spans name it;
  /// renewed in a forked child, whose thread has another.
  int64_t OsThread;
  /// The backward passes (graph tasks) whose ops this thread ran last with
  /// no call open, newest first, and the call each belongs to: for its ops
  /// outside any node (its final callbacks).
  struct BackwardOwner {
    int Task = -1;
    int64_t Call = 0;
  };
  std::array<BackwardOwner, 4> BackwardOwners;
  /// The thread whose cell of OpenCalls this thread looked up last, and
  /// OpenCalls->Added then (a thread not found is looked for again only
  /// once another was added).
  uint64_t LookedUpThread = 0;
  std::shared_ptr<const OpenCallCell> LookedUpCell;
  bool LookedUpMissing = false;
  uint64_t LookedUpAdded = 0;

  ThreadState()
      : RecordThreadId(at::RecordFunction::currentThreadId()),
        OpenNow(std::make_shared<OpenCallCell>()), OsThread(int64_t(::gettid())) {
    Spare.reserve(SpareKept); // a push never allocates
    {
      std::lock_guard<std::mutex> Lock(OpenCalls->Mutex);
      OpenCalls->ByThread[RecordThreadId] = OpenNow;
      OpenCalls->Added.fetch_add(1, std::memory_order_release);
    }
    threadFlags().State = this;
  }
  ~ThreadState() {
    for (const auto &[Impl, Produced] : Producers) // a thread ended mid-forward
      if (Produced.Storage)
        StorageWriteCounts::process().unwatch(Produced.Storage);
    OpenNow->set(0, 0);
    {
      std::lock_guard<std::mutex> Lock(OpenCalls->Mutex);
      OpenCalls->ByThread.erase(RecordThreadId);
    }
    threadFlags().State = nullptr; // an op context freed later goes to the heap
    threadFlags().StateGone = true;
    for (void *Memory : Spare)
      ::operator delete(Memory);
  }
};

/// Builds this thread's state, at its first use.
ThreadState &buildThreadState();

/// This thread's state, looked up once by each caller. Once it is gone
/// (Flags.StateGone), the op and launch callbacks ask first and leave the
/// thread alone; a module call's entry and exit, which no thread's last
/// destructors make, do not.
inline ThreadState &thisThread(ThreadFlags &Flags = threadFlags()) {
  if (Flags.State)
    return *static_cast<ThreadState *>(Flags.State);
  return buildThreadState();
}

inline const void *storageOf(const at::Tensor &T) {
  return T.defined() && T.has_storage() ? T.storage().unsafeGetStorageImpl() : nullptr;
}

/// An op is about to write to \p T.
inline void noteWrite(const at::Tensor &T) {
  if (const void *Storage = storageOf(T))
    StorageWriteCounts::process().noteWrite(Storage);
}

/// The op open on this thread, to which a launch or a write belongs (not an
/// echo of it), or null.
inline OpContext *openOp(ThreadState &TS) {
  if (TS.OpStack.empty())
    return nullptr;
  OpContext *Top = TS.OpStack.back();
  return Top->Echoes ? Top->Echoes : Top;
}

inline uint64_t nowNanos() {
  timespec T;
  clock_gettime(CLOCK_MONOTONIC, &T);
  return uint64_t(T.tv_sec) * 1000000000u + uint64_t(T.tv_nsec);
}

/// The step that \p TS's calls and ops belong to: its last root call's, or
/// the session's latest for a thread that made none.
inline int64_t stepOf(Session &S, const ThreadState &TS) {
  return TS.Step && TS.StepIn == S.Serial ? TS.Step : S.Step.load();
}

inline bool stepCaptured(Session &S, const ThreadState &TS) {
  return S.Options.MaxSteps < 0 || stepOf(S, TS) <= S.Options.MaxSteps;
}

/// Whether CUPTI sees, in \p S, the writes to device memory that no op
/// announces (kernels launched outside ops, copies, graph launches) and the
/// calls that order work across streams: what holding GPU statistics back
/// (DeviceStatsBatcher), and reusing them for a later record of the same
/// tensor, rely on.
inline bool deviceWritesSeen(const Session &S) { return S.TracingKernels && kernelTracingSeesWrites(); }

/// The statistics of a GPU tensor, launched now or with others
/// (TraceSession.cpp).
std::shared_ptr<DeferredStats> deviceStatsLater(Session &S, const at::Tensor &T);

/// Records \p T; returns its tensor id, or 0 if it cannot be recorded.
/// \p Known: statistics already computed or deferred for the same tensor,
/// unchanged since; \p Computed receives those computed or deferred here.
int64_t recordTensor(Session &S, const at::Tensor &Given, TensorOwner Owner, int64_t OwnerId,
                     const char *Role, int64_t Index, bool Stats, bool Capture,
                     std::optional<int64_t> SourceId = std::nullopt,
                     std::shared_ptr<DeferredStats> Known = nullptr,
                     std::shared_ptr<DeferredStats> *Computed = nullptr);

/// Whether \p Bytes more fit the capture's --budget; counts them if so
/// (TraceSession.cpp).
bool withinCaptureBudget(Session &S, uint64_t Bytes);

/// The module call an op or a launch on this thread belongs to
/// (OpObserver.cpp).
int64_t openCall(ThreadState &TS);

/// The op observer's callbacks (OpObserver.cpp), which startTrace adds.
std::unique_ptr<at::ObserverContext> onOpStart(const at::RecordFunction &Fn);
void onOpEnd(const at::RecordFunction &Fn, at::ObserverContext *Raw);

/// A forked child has an op observer of its parent's session
/// (TraceSession.cpp): removed at its first op.
extern std::atomic<bool> StaleObserverPending;
void removeStaleObserver();

/// The end of a root's forward: its outputs feed nothing later. \p Unwatch
/// is false in a forked child, whose table of writes is new
/// (ModuleCalls.cpp).
void forgetProducers(ThreadState &TS, bool Unwatch = true);
/// Sets the call open on this thread now, for the backward passes of other
/// threads that look it up (openCall, in OpObserver.cpp).
void publishOpenCall(ThreadState &TS);

/// The buffers the op's kernels were given, as they were after each kernel,
/// recorded as the kernels' tensors (LaunchRecording.cpp).
void recordKernelSnapshots(Session &S, OpContext &Ctx);

} // namespace session
} // namespace ekka

#endif
