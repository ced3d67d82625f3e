//===- TraceSession.cpp - The recorder inside a traced process ------------===//
#include "ekka/Runtime/TraceSession.h"
#include "SessionInternal.h"
#include "StorageWrites.h"
#include "TensorRecording.h"
#include "ekka/Support/Plural.h"
#include "ekka/Trace/TraceWriter.h"
#include "llvm/ADT/ScopeExit.h"

#include <ATen/SequenceNumber.h>
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

namespace {

struct OpenCall {
  int64_t Id;
  bool Capture;       ///< Whether this call's tensors are captured.
  int64_t FirstTensor; ///< Tensor ids from here on were recorded inside it.
  /// The thread's next autograd sequence number as it began: the nodes its
  /// forward made have this one or a later.
  uint64_t Since;
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

} // namespace

static thread_local ThreadFlags ThisThread;
[[gnu::noinline]] ThreadFlags &threadFlags() { return ThisThread; }

namespace {

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

/// The process-wide state. Hot paths take no lock but the writer's queue.
struct Session {
  /// Distinct for every session of the process (a pointer may be reused).
  uint64_t Serial = 0;
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

std::mutex SessionMutex;
Session *Current = nullptr;

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
OpenCallTable *OpenCalls = new OpenCallTable;

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
        OpenNow(std::make_shared<OpenCallCell>()) {
    Spare.reserve(SpareKept); // a push never allocates
    {
      std::lock_guard<std::mutex> Lock(OpenCalls->Mutex);
      OpenCalls->ByThread[RecordThreadId] = OpenNow;
      OpenCalls->Added.fetch_add(1, std::memory_order_release);
    }
    ThisThread.State = this;
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
    ThisThread.State = nullptr; // an op context freed later goes to the heap
    ThisThread.StateGone = true;
    for (void *Memory : Spare)
      ::operator delete(Memory);
  }
};

/// Builds this thread's state, at its first use.
[[gnu::noinline]] ThreadState &buildThreadState() {
  thread_local ThreadState State;
  return State;
}

/// This thread's state, looked up once by each caller. Once it is gone
/// (Flags.StateGone), the op and launch callbacks ask first and leave the
/// thread alone; a module call's entry and exit, which no thread's last
/// destructors make, do not.
inline ThreadState &thisThread(ThreadFlags &Flags = threadFlags()) {
  if (Flags.State)
    return *static_cast<ThreadState *>(Flags.State);
  return buildThreadState();
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

const void *storageOf(const at::Tensor &T) {
  return T.defined() && T.has_storage() ? T.storage().unsafeGetStorageImpl() : nullptr;
}

/// An op is about to write to \p T.
void noteWrite(const at::Tensor &T) {
  if (const void *Storage = storageOf(T))
    StorageWriteCounts::process().noteWrite(Storage);
}

/// The end of a root's forward: its outputs feed nothing later. \p Unwatch
/// is false in a forked child, whose table of writes is new.
void forgetProducers(ThreadState &TS, bool Unwatch = true) {
  if (Unwatch)
    for (const auto &[Impl, Produced] : TS.Producers)
      if (Produced.Storage)
        StorageWriteCounts::process().unwatch(Produced.Storage);
  TS.Producers.clear();
  TS.PruneProducersAt = ThreadState::ProducersPrunedFrom;
}

/// Lets go of the outputs recorded in this forward that are freed: no later
/// input can be one (its record's weak reference keeps its address from
/// another tensor), and the watch of its storage would count the writes to
/// whatever uses that storage, or is allocated at its address, next. Once
/// the table has doubled since the last look, so that a long forward (a
/// loop of steps inside one root) keeps about what lives.
void pruneProducers(ThreadState &TS) {
  StorageWriteCounts &Counts = StorageWriteCounts::process();
  for (auto It = TS.Producers.begin(); It != TS.Producers.end();) {
    if (!It->second.Impl.expired()) {
      ++It;
      continue;
    }
    if (It->second.Storage)
      Counts.unwatch(It->second.Storage);
    It = TS.Producers.erase(It);
  }
  TS.PruneProducersAt = std::max(ThreadState::ProducersPrunedFrom, 2 * TS.Producers.size());
}
/// Sets the call open on this thread now, for the backward passes of other
/// threads that look it up (openCall).
void publishOpenCall(ThreadState &TS) {
  if (TS.CallStack.empty())
    TS.OpenNow->set(0, 0);
  else
    TS.OpenNow->set(TS.CallStack.back().Id, TS.CallStack.back().Since);
}

/// The call open now on the thread whose RecordFunction id is \p Thread,
/// and its OpenCall::Since ({0, 0} if none, or if that thread never
/// recorded or is gone). A thread not found is remembered too, until
/// another thread is added (an ended one's id is never reused): a pass over
/// a finished thread's graph (a parallel_apply worker's) takes no lock per
/// op.
std::pair<int64_t, uint64_t> openCallOn(ThreadState &TS, uint64_t Thread) {
  bool Known = Thread == TS.LookedUpThread && TS.LookedUpCell &&
               (!TS.LookedUpMissing ||
                OpenCalls->Added.load(std::memory_order_acquire) == TS.LookedUpAdded);
  if (!Known) {
    static const auto *Nowhere = new std::shared_ptr<const OpenCallCell>(
        std::make_shared<OpenCallCell>()); // never set: {0, 0}
    std::lock_guard<std::mutex> Lock(OpenCalls->Mutex);
    auto It = OpenCalls->ByThread.find(Thread);
    TS.LookedUpThread = Thread;
    TS.LookedUpMissing = It == OpenCalls->ByThread.end();
    TS.LookedUpAdded = OpenCalls->Added.load(std::memory_order_relaxed);
    TS.LookedUpCell = TS.LookedUpMissing ? *Nowhere : It->second;
  }
  return TS.LookedUpCell->get();
}

/// The call an op of the backward pass \p Task belongs to, on a thread
/// with no call open: the call open on the thread that ran the forward of
/// the node being evaluated (the call that waits for the backward pass it
/// runs, or none), if the node was made inside it: a node older than that
/// call (the thread has moved on since it built the graph) belongs to no
/// call. Outside any node, the call the task's last node here belonged to.
[[gnu::noinline]] int64_t backwardCall(ThreadState &TS, int Task) {
  auto &Owners = TS.BackwardOwners;
  auto Known = std::find_if(Owners.begin(), Owners.end(),
                            [&](const ThreadState::BackwardOwner &O) { return O.Task == Task; });
  c10::intrusive_ptr<torch::autograd::Node> Evaluated = torch::autograd::get_current_node();
  if (!Evaluated)
    return Known == Owners.end() ? 0 : Known->Call;
  uint64_t Forward = Evaluated->thread_id();
  // Its own forward: no call is open on this thread.
  int64_t Call = 0;
  if (Forward != TS.RecordThreadId) {
    auto [Open, Since] = openCallOn(TS, Forward);
    uint64_t Made = Evaluated->sequence_nr();
    // A gradient's accumulation into a leaf has no number of its forward's
    // (UINT64_MAX): it goes where the pass's last node here went.
    if (Made == std::numeric_limits<uint64_t>::max() && Known != Owners.end())
      Call = Known->Call;
    else if (Made >= Since)
      Call = Open;
  }
  // The task's entry goes first; the oldest makes room for a new one.
  auto Moved = Known == Owners.end() ? Owners.end() - 1 : Known;
  std::rotate(Owners.begin(), Moved, Moved + 1);
  Owners[0] = {Task, Call};
  return Call;
}

/// The module call an op on this thread belongs to: the last one open on
/// it, or, for an op of a backward pass (autograd runs a GPU's on a thread
/// of its own, where no call is open; a thread may call backward() with
/// none open), the one open on the thread that ran the forward
/// (backwardCall): not another thread's call, which runs meanwhile. Not
/// any other op's on a thread with no call open: a helper thread's are no
/// module's, however long another thread's call stays open.
int64_t openCall(ThreadState &TS) {
  if (!TS.CallStack.empty())
    return TS.CallStack.back().Id;
  int Task = torch::autograd::get_current_graph_task_id();
  return Task == -1 ? 0 : backwardCall(TS, Task);
}

OpKind &opKind(ThreadState &TS, const at::RecordFunction &Fn) {
  auto &Kinds = TS.Kinds;
  OpKey Key{Fn.name(), Fn.overload_name()};
  auto It = Kinds.find(Key);
  if (It != Kinds.end()) {
    // No strlen: a compare that stops at either text's end.
    auto Same = [](const std::string &Known, const char *Text) {
      return std::strncmp(Known.c_str(), Text, Known.size() + 1) == 0;
    };
    if (Same(It->second.Name, Key.Name) && Same(It->second.Overload, Key.Overload))
      return It->second;
    Kinds.erase(It);
  }
  auto Schema = Fn.operator_schema();
  if (!Schema) {
    // A scope named by a string (record_function): no operator, and a
    // name that may be new at every call, so nothing is kept of it.
    OpKind &Unnamed = TS.Unnamed;
    Unnamed = OpKind();
    Unnamed.Name = Key.Name;
    return Unnamed;
  }
  OpKind K;
  K.Name = Key.Name;
  K.Overload = Key.Overload;
  std::ostringstream OS;
  OS << *Schema;
  K.Schema = OS.str();
  for (const c10::Argument &A : Schema->arguments())
    K.Written.push_back(A.alias_info() && A.alias_info()->isWrite());
  K.WritesUnmarked = K.Name.rfind("c10d::", 0) == 0;
  return Kinds.emplace(Key, std::move(K)).first->second;
}

/// The op open on this thread, to which a launch or a write belongs (not an
/// echo of it), or null.
OpContext *openOp(ThreadState &TS) {
  if (TS.OpStack.empty())
    return nullptr;
  OpContext *Top = TS.OpStack.back();
  return Top->Echoes ? Top->Echoes : Top;
}

/// Under a program's TorchDispatchMode (a logging mode, FlopCounterMode,
/// AOTAutograd's check at a compiled graph's first call) an op reaches the
/// dispatcher twice: at the mode, and again from the mode's `func(*args)`,
/// inside a scope PyTorch names "PythonDispatchMode". The op is recorded
/// once, at the mode: what the program called, with the outputs the mode
/// returned. The scope, and the same op again right inside it, echo it:
/// nothing of theirs is recorded, and what runs inside (other ops, kernels)
/// is the op's. Returns the op that \p Kind's would echo, or null.
OpContext *echoed(ThreadState &TS, const OpKind &Kind) {
  if (Kind.Schema.empty())
    return Kind.Name == "PythonDispatchMode" ? openOp(TS) : nullptr;
  OpContext *Top = TS.OpStack.empty() ? nullptr : TS.OpStack.back();
  return Top && Top->ModeScope && Top->Echoes->Kind == &Kind ? Top->Echoes : nullptr;
}

uint64_t nowNanos() {
  timespec T;
  clock_gettime(CLOCK_MONOTONIC, &T);
  return uint64_t(T.tv_sec) * 1000000000u + uint64_t(T.tv_nsec);
}

bool withinCaptureBudget(Session &S, uint64_t Bytes) {
  if (S.Options.ByteBudget && S.CapturedBytes + Bytes > S.Options.ByteBudget) {
    ++S.OverBudget;
    return false;
  }
  S.CapturedBytes += Bytes;
  return true;
}

/// The step that \p TS's calls and ops belong to: its last root call's, or
/// the session's latest for a thread that made none.
int64_t stepOf(Session &S, const ThreadState &TS) {
  return TS.Step && TS.StepIn == S.Serial ? TS.Step : S.Step.load();
}

bool stepCaptured(Session &S, const ThreadState &TS) {
  return S.Options.MaxSteps < 0 || stepOf(S, TS) <= S.Options.MaxSteps;
}

/// Whether CUPTI sees, in \p S, the writes to device memory that no op
/// announces (kernels launched outside ops, copies, graph launches) and the
/// calls that order work across streams: what holding GPU statistics back
/// (DeviceStatsBatcher), and reusing them for a later record of the same
/// tensor, rely on.
bool deviceWritesSeen(const Session &S) { return S.TracingKernels && kernelTracingSeesWrites(); }

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
                     std::optional<int64_t> SourceId = std::nullopt,
                     std::shared_ptr<DeferredStats> Known = nullptr,
                     std::shared_ptr<DeferredStats> *Computed = nullptr) {
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

/// What is known of where a module input came from.
struct Provenance {
  std::optional<int64_t> Source; ///< The recorded module output it still is.
  bool ChangedInPlace = false;   ///< It was one, but an op has written to it since.
  /// That record's statistics, if no op at all ran since: then not even
  /// a write that leaves the version counter alone (through `.data`, a
  /// C extension's op) can have changed the values. On a GPU, also no
  /// kernel, copy or graph launch that no op announced, which CUPTI's
  /// callbacks count; without them, never.
  std::shared_ptr<DeferredStats> Stats;
};

Provenance provenanceOf(ThreadState &TS, const at::Tensor &T) {
  Provenance P;
  if (!T.defined())
    return P;
  auto It = TS.Producers.find(T.unsafeGetTensorImpl());
  if (It == TS.Producers.end())
    return P;
  auto Alive = It->second.Impl.lock();
  if (Alive.get() != T.unsafeGetTensorImpl())
    return P;
  const ProducedTensor &Produced = It->second;
  // Written (its storage's count moved, or its version), or given other
  // memory since (`y.data = z`, set_: no op the observer sees, no version).
  bool Changed = (Produced.Storage &&
                  StorageWriteCounts::process().writes(Produced.Storage) != Produced.Writes) ||
                 (!Produced.Inference && T._version() != Produced.Version) ||
                 storageOf(T) != Produced.Storage;
  if (Changed) {
    P.ChangedInPlace = true;
  } else {
    P.Source = It->second.TensorId;
    bool WritesSeen = !T.is_cuda() || (Current && deviceWritesSeen(*Current));
    if (It->second.OpsBefore == TS.OpsBegun && WritesSeen)
      P.Stats = It->second.Stats;
  }
  return P;
}

DeviceMemoryOps DeviceMemory;

/// The buffers the op's kernels were given, as they were after each kernel:
/// owned by the kernel, `mutated` if the op's schema marks the tensor as
/// written, else `argument`; the index is the kernel parameter's position.
void recordKernelSnapshots(Session &S, OpContext &Ctx) {
  std::vector<uint64_t> Synced;
  try {
    for (KernelSnapshot &K : Ctx.Snapshots) {
      if (K.Copy.is_cuda() && DeviceMemory.Synchronize &&
          std::find(Synced.begin(), Synced.end(), K.Stream) == Synced.end()) {
        DeviceMemory.Synchronize(K.Stream);
        Synced.push_back(K.Stream);
      }
      if (recordTensor(S, K.Copy, TensorOwner::Kernel, K.KernelId,
                       K.Mutable ? "mutated" : "argument", K.Param, /*Stats=*/true,
                       /*Capture=*/true))
        ++S.RecordedSnapshots;
    }
  } catch (const std::exception &E) {
    std::lock_guard<std::mutex> Lock(S.SnapshotErrorMutex);
    if (S.SnapshotError.empty())
      S.SnapshotError = E.what();
  }
  Ctx.Snapshots.clear();
}

std::unique_ptr<at::ObserverContext> onOpStartImpl(const at::RecordFunction &Fn);
void onOpEndImpl(const at::RecordFunction &Fn, at::ObserverContext *Raw);
/// A forked child has an op observer of its parent's session: see below.
extern std::atomic<bool> StaleObserverPending;
void removeStaleObserver();

} // namespace

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

namespace {

// RecordFunction callbacks must not throw into PyTorch.
std::unique_ptr<at::ObserverContext> onOpStart(const at::RecordFunction &Fn) {
  TracerTimer Timer(TracerPart::Ops);
  try {
    return onOpStartImpl(Fn);
  } catch (const std::exception &E) {
    lostRecord("op start", E);
    return nullptr;
  }
}

void onOpEnd(const at::RecordFunction &Fn, at::ObserverContext *Raw) {
  TracerTimer Timer(TracerPart::Ops, /*NewCall=*/false);
  try {
    onOpEndImpl(Fn, Raw);
  } catch (const std::exception &E) {
    lostRecord("op end", E);
  }
}

/// Whether this process runs a Python interpreter (a native program may
/// embed one).
bool pythonRunning() {
  using IsInitializedFn = int (*)();
  static auto IsInitialized =
      reinterpret_cast<IsInitializedFn>(dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
  return IsInitialized && IsInitialized();
}

/// Whether torch.compile or torch.export is tracing the program on this
/// thread: FakeTensorMode or make_fx's proxy mode is on. Their ops run on
/// fake tensors: not what the program computed, and reading a symbolic
/// size would make it a constant (a dimension marked dynamic fails the
/// compile; one that would have become dynamic recompiles).
bool tracingWithFakes() {
  using c10::impl::TorchDispatchModeKey;
  using c10::impl::TorchDispatchModeTLS;
  return TorchDispatchModeTLS::stack_len() > 0 &&
         (TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FAKE) ||
          TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::PROXY));
}

std::unique_ptr<at::ObserverContext> onOpStartImpl(const at::RecordFunction &Fn) {
  Session *S = Current;
  if (!S) {
    if (StaleObserverPending.load(std::memory_order_relaxed))
      removeStaleObserver();
    return nullptr;
  }
  // An op of the thread's last destructors, after its state's: not seen.
  ThreadFlags &Flags = threadFlags();
  if (Flags.InsideEkka || Flags.StateGone || setAsideOn(Flags))
    return nullptr;
  standStillIfTerminating(Flags);
  ThreadState &TS = thisThread(Flags);
  std::string_view Name = Fn.name();
  if (Name.substr(0, 6) == "ekka::" || tracingWithFakes())
    return nullptr;
  OpKind &Kind = opKind(TS, Fn);
  if (OpContext *Echoed = echoed(TS, Kind)) {
    std::unique_ptr<OpContext> Echo(new (TS) OpContext);
    Echo->Echoes = Echoed;
    Echo->ModeScope = Kind.Schema.empty();
    TS.OpStack.push_back(Echo.get());
    return Echo;
  }
  ++TS.OpsBegun;
  ++TS.OpStarts;
  // A native program has no module entries, where settled statistics'
  // tensors are let go: every few thousand ops instead. Not where Python
  // runs (a release may take the GIL, which this op's caller may not hold).
  if (S->Options.Native && TS.OpStarts % 4096 == 0 &&
      (S->Deferred.holding() || S->DeviceDeferred.holding()) && !pythonRunning()) {
    S->Deferred.releaseSettled();
    S->DeviceDeferred.releaseSettled();
  }
  std::unique_ptr<OpContext> Ctx(new (TS) OpContext);
  int64_t Id = Ctx->OpId = S->Writer->nextOpId();
  std::optional<int64_t> Call;
  if (int64_t Open = openCall(TS))
    Call = Open;
  int64_t Seq = S->OpSeq++;
  Ctx->Kind = &Kind;
  if (S->Options.OpFilter && Kind.FilteredIn != S->Serial) {
    Kind.Captured = std::regex_search(Kind.Name, *S->Options.OpFilter);
    Kind.FilteredIn = S->Serial;
  }
  Ctx->Capture = S->Options.OpFilter && Kind.Captured && stepCaptured(*S, TS);
  auto Inputs = Fn.inputs();
  Ctx->Operator = !Kind.Schema.empty();
  std::vector<at::Tensor> Read; // what the op reads, to capture as it is now
  std::vector<size_t> WrittenLists;
  std::vector<at::Tensor> Unmarked; // what it may write besides
  for (size_t I = 0; I < Inputs.size(); ++I) {
    bool Written = I < Kind.Written.size() && Kind.Written[I];
    if (Kind.WritesUnmarked && !Written) {
      if (Inputs[I].isTensor())
        Unmarked.push_back(Inputs[I].toTensor());
      else if (Inputs[I].isList())
        WrittenLists.push_back(I);
    }
    if (Written && Inputs[I].isList()) // _foreach_mul_'s Tensor(a!)[]
      WrittenLists.push_back(I);
    if (!Inputs[I].isTensor()) {
      // A list it reads: index_put_'s indices (a KV-cache write's slot
      // mapping, a Tensor?[]), cat's and stack's Tensor[]: each tensor of it.
      if (Inputs[I].isList() && !Written && !Kind.WritesUnmarked && Ctx->Capture &&
          S->Options.OpInputs)
        for (const c10::IValue &V : Inputs[I].toListRef())
          if (V.isTensor() && V.toTensor().defined()) // `cache[:, idx]`: an undefined first
            Read.push_back(V.toTensor());
      continue;
    }
    if (Written)
      Ctx->Mutated.push_back(Inputs[I].toTensor());
    else if (Ctx->Capture && S->Options.OpInputs)
      Read.push_back(Inputs[I].toTensor());
    if (Ctx->Capture) {
      Ctx->Arguments.push_back(Inputs[I].toTensor());
      Ctx->ArgumentMutable.push_back(Written);
    }
  }
  // Before anything that may fail: statistics the writer's thread has not
  // computed yet, of what the op is about to write, are computed now,
  // before it runs; and the writes to recorded module outputs counted.
  bool Watching = StorageWriteCounts::process().watching();
  if (S->Deferred.holding() || S->DeviceDeferred.waiting() || Watching) {
    auto WillWrite = [&](const at::Tensor &T) {
      S->Deferred.beforeWrite(T);
      S->DeviceDeferred.beforeWrite(T);
      if (Watching)
        noteWrite(T);
    };
    for (const at::Tensor &T : Ctx->Mutated)
      WillWrite(T);
    for (const at::Tensor &T : Unmarked)
      WillWrite(T);
    for (size_t I : WrittenLists)
      for (const c10::IValue &V : Inputs[I].toListRef()) {
        if (V.isTensor())
          WillWrite(V.toTensor());
        else if (V.isList()) // c10d::allgather_'s Tensor[][] outputs
          for (const c10::IValue &W : V.toListRef())
            if (W.isTensor())
              WillWrite(W.toTensor());
      }
  }
  if (Kind.Schema.empty()) {
    S->Writer->addOp(OpRecord{Id, Call, Seq, Kind.Name, ""}); // a named scope
  } else {
    if (Kind.InternedIn != S->Serial) {
      Kind.Text = S->Writer->internOp(Kind.Name, Kind.Schema);
      Kind.InternedIn = S->Serial;
    }
    S->Writer->addOp(Id, Call, Seq, Kind.Text);
  }
  if (!Read.empty()) {
    // The inputs it reads (not those it writes: they are its `mutated`
    // tensors at its end), before it runs: a KV-cache write's keys and slot
    // mapping, which un-page the cache it wrote.
    InsideEkkaScope Inside(Flags);
    for (size_t I = 0; I < Read.size(); ++I)
      recordTensor(*S, Read[I], TensorOwner::Op, Ctx->OpId, "input", int64_t(I), /*Stats=*/true,
                   /*Capture=*/true);
  }
  TS.OpStack.push_back(Ctx.get());
  return Ctx;
}

void onOpEndImpl(const at::RecordFunction &Fn, at::ObserverContext *Raw) {
  ThreadFlags &Flags = threadFlags();
  if (Flags.StateGone)
    return;
  ThreadState &TS = thisThread(Flags);
  Session *S = Current;
  if (Raw && !TS.OpStack.empty())
    TS.OpStack.pop_back();
  if (!S || !Raw || Flags.InsideEkka)
    return;
  auto *Ctx = static_cast<OpContext *>(Raw);
  if (Ctx->Echoes)
    return; // recorded at the end of the op it echoes
  InsideEkkaScope Inside(Flags);
  recordKernelSnapshots(*S, *Ctx);
  bool Capture = Ctx->Capture;
  bool Stats = S->Options.OpStats || Capture;
  int64_t Index = 0;
  for (const c10::IValue &V : Fn.outputs()) {
    if (V.isTensor())
      recordTensor(*S, V.toTensor(), TensorOwner::Op, Ctx->OpId, "output", Index++, Stats,
                   Capture);
    else if (V.isTensorList())
      for (const at::Tensor &T : V.toTensorList().vec())
        recordTensor(*S, T, TensorOwner::Op, Ctx->OpId, "output", Index++, Stats, Capture);
  }
  // Arguments the schema marks as written (`Tensor(a!)`): what the op did
  // to them in place, as vLLM's fused kernels do.
  int64_t Mutated = 0;
  for (const at::Tensor &T : Ctx->Mutated)
    recordTensor(*S, T, TensorOwner::Op, Ctx->OpId, "mutated", Mutated++, Stats, Capture);
}

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

/// A module call's input: as the earlier output it is, or with statistics
/// (and bytes, if captured) when no module produced it. \p AtExit: recorded
/// after the call ran (keyword inputs, which PyTorch's global pre-hooks do
/// not see); then an output produced inside the call is no source of it,
/// and an input written in place since it was produced is unknown — its
/// value at the call's entry is gone.
void recordInput(Session &S, int64_t CallId, const at::Tensor &T, int64_t Index, bool Capture,
                 bool AtExit = false, int64_t FirstTensor = 0) {
  ThreadState &TS = thisThread();
  Provenance P = provenanceOf(TS, T);
  if (P.Source && AtExit && *P.Source >= FirstTensor)
    P.Source.reset();
  if (P.Source)
    recordTensor(S, T, TensorOwner::ModuleCall, CallId, "input", Index, /*Stats=*/false,
                 /*Capture=*/false, P.Source);
  else if (AtExit && P.ChangedInPlace)
    recordTensor(S, T, TensorOwner::ModuleCall, CallId, "input", Index, /*Stats=*/false,
                 /*Capture=*/false);
  else
    recordTensor(S, T, TensorOwner::ModuleCall, CallId, "input", Index, /*Stats=*/true, Capture);
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

} // namespace

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

void setDeviceMemoryOps(DeviceMemoryOps Ops) { DeviceMemory = Ops; }

int64_t recordKernelLaunch(const KernelLaunch &L, const std::vector<PointerArgument> &Pointers) {
  Session *S = Current;
  ThreadFlags &Flags = threadFlags();
  if (!S || Flags.InsideEkka || Flags.StateGone || setAsideOn(Flags))
    return 0;
  ThreadState &TS = thisThread(Flags);
  // Interned once per kernel: a copy of its mangled name at every launch,
  // made here and freed on the writer's thread, would cost more than the
  // rest of the record. A hit is checked against the text, as a module
  // unloaded may leave its address to another kernel's name. Should the
  // names come at ever new addresses, the cache starts over now and then.
  const char *Text = L.Name ? L.Name : "";
  auto Found = TS.KernelNames.find(Text);
  if (Found == TS.KernelNames.end()) {
    if (TS.KernelNames.size() >= ThreadState::MaxKernelNames)
      TS.KernelNames.clear();
    Found = TS.KernelNames.emplace(Text, KernelNameEntry()).first;
  }
  KernelNameEntry &Name = Found->second;
  if (Name.InternedIn != S->Serial || std::strcmp(Name.Name->c_str(), Text) != 0) {
    Name.Name = S->Writer->internKernelName(Text);
    Name.InternedIn = S->Serial;
  }
  KernelRecord R;
  R.Id = S->Writer->nextKernelId();
  OpContext *Op = openOp(TS);
  if (Op)
    R.OpId = Op->OpId;
  if (int64_t Call = openCall(TS))
    R.ModuleCallId = Call;
  R.Seq = S->KernelSeq++;
  for (int I = 0; I < 3; ++I) {
    R.Grid[I] = L.Grid[I];
    R.Block[I] = L.Block[I];
  }
  R.SharedMem = L.SharedMem;
  R.Stream = L.Stream;
  R.CorrelationId = L.CorrelationId;
  int64_t Id = R.Id;
  S->Writer->addKernel(R, Name.Name);
  TS.PendingSnapshots.clear();
  TS.LastLaunch = {Op, Id, L.Stream};
  if (Op && Op->Capture) {
    ++S->CapturedOpLaunches;
    ++S->UnmatchedLaunches; // until a pointer matches
  }
  matchKernelPointers(Pointers);
  return Id;
}

void beforeDeviceWrite(bool Ordering) {
  Session *S = Current;
  ThreadFlags &Flags = threadFlags();
  if (!S || Flags.InsideEkka || Flags.StateGone)
    return;
  ThreadState &TS = thisThread(Flags);
  // Inside an op, its own launches and copies write what its schema says
  // (seen at its start); inside a named scope (record_function, an
  // autograd Function's forward) nothing says what they write.
  OpContext *Open = openOp(TS);
  bool InOperator = Open && Open->Operator;
  if (!Ordering && !InOperator)
    ++TS.OpsBegun; // a write no op announced: what was produced before may have changed
  if (S->DeviceDeferred.waiting() && (Ordering || !InOperator))
    S->DeviceDeferred.launchAll();
}

void matchKernelPointers(const std::vector<PointerArgument> &Pointers) {
  Session *S = Current;
  ThreadFlags &Flags = threadFlags();
  if (!S || Flags.StateGone)
    return;
  ThreadState &TS = thisThread(Flags);
  OpContext *Op = TS.LastLaunch.Op;
  if (!Op || !Op->Capture || Pointers.empty() || !TS.PendingSnapshots.empty())
    return;
  // Which of the kernel's pointer parameters point into a tensor the op was
  // given: those buffers are copied once the kernel is enqueued.
  for (size_t A = 0; A < Op->Arguments.size(); ++A) {
    const at::Tensor &T = Op->Arguments[A];
    if (!T.defined() || !T.has_storage() || !T.is_contiguous() || T.numel() == 0)
      continue;
    uint64_t Begin = reinterpret_cast<uint64_t>(T.data_ptr());
    uint64_t End = Begin + uint64_t(T.numel()) * T.element_size();
    for (const PointerArgument &P : Pointers)
      if (P.Value >= Begin && P.Value < End) {
        TS.PendingSnapshots.push_back({Op, TS.LastLaunch.KernelId, P.Index, A, TS.LastLaunch.Stream});
        break; // one copy of each tensor per kernel
      }
  }
  if (!TS.PendingSnapshots.empty())
    --S->UnmatchedLaunches;
}

bool kernelSnapshotsWanted() {
  ThreadFlags &Flags = threadFlags();
  if (!Current || Flags.InsideEkka || Flags.StateGone || setAsideOn(Flags))
    return false;
  ThreadState &TS = thisThread(Flags);
  OpContext *Op = openOp(TS);
  return Op && Op->Capture && !Op->Arguments.empty();
}

void snapshotKernelBuffers() {
  Session *S = Current;
  ThreadFlags &Flags = threadFlags();
  if (!S || Flags.InsideEkka || Flags.StateGone)
    return;
  ThreadState &TS = thisThread(Flags);
  if (TS.PendingSnapshots.empty())
    return;
  InsideEkkaScope Inside(Flags);
  OwnOps Own; // the copies' allocations are no op of the program's
  TS.LastLaunch = {};
  try {
    for (const PendingSnapshot &P : TS.PendingSnapshots) {
      const at::Tensor &T = P.Op->Arguments[P.Argument];
      size_t Bytes = size_t(T.numel()) * T.element_size();
      if (!withinCaptureBudget(*S, Bytes))
        break;
      at::Tensor Copy = at::empty_like(T, at::MemoryFormat::Contiguous);
      if (T.is_cuda()) {
        if (!DeviceMemory.CopyAsync ||
            !DeviceMemory.CopyAsync(Copy.data_ptr(), T.data_ptr(), Bytes, P.Stream)) {
          ++S->FailedCopies;
          continue;
        }
      } else if (T.device().is_cpu()) {
        std::memcpy(Copy.data_ptr(), T.data_ptr(), Bytes);
      } else {
        continue;
      }
      P.Op->Snapshots.push_back(
          {P.KernelId, P.Param, bool(P.Op->ArgumentMutable[P.Argument]), std::move(Copy), P.Stream});
      ++S->KernelSnapshots;
    }
  } catch (const std::exception &E) {
    ++S->FailedCopies;
    lostRecord("kernel snapshot", E);
  }
  TS.PendingSnapshots.clear();
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

int64_t enterModule(std::string_view Path, std::string_view ClassName,
                    std::string_view ClassQualname, std::string_view SourceFile,
                    int64_t SourceLine, bool IsRoot, const std::vector<at::Tensor> &Inputs) {
  Session *S = Current;
  if (!S)
    return 0;
  ThreadFlags &Flags = threadFlags();
  standStillIfTerminating(Flags);
  InsideEkkaScope Inside(Flags);
  TracerTimer Timer(TracerPart::Modules);
  S->Deferred.releaseSettled();
  ThreadState &TS = thisThread(Flags);
  S->DeviceDeferred.releaseSettled();
  if (IsRoot) {
    TS.Step = ++S->Step;
    TS.StepIn = S->Serial;
  }
  int64_t Id = S->Writer->nextModuleCallId();
  std::optional<int64_t> ParentId;
  if (!TS.CallStack.empty())
    ParentId = TS.CallStack.back().Id;
  // The call's texts, interned once per path and session: checked, as a
  // path may name another module later (another model, another trace).
  auto Known = TS.ModuleTexts.find(Path);
  if (Known == TS.ModuleTexts.end())
    Known = TS.ModuleTexts.emplace(std::string(Path), ModuleTextEntry()).first;
  ModuleTextEntry &Text = Known->second;
  if (Text.InternedIn != S->Serial || Text.Text->ClassName != ClassName ||
      Text.Text->ClassQualname != ClassQualname || Text.Text->SourceFile != SourceFile ||
      Text.Text->SourceLine != SourceLine) {
    Text.Text = S->Writer->internModule(Path, ClassName, ClassQualname, SourceFile, SourceLine);
    Text.InternedIn = S->Serial;
  }
  S->Writer->addModuleCall(Id, ParentId, S->CallSeq++, stepOf(*S, TS), Text.Text);
  bool Capture = S->Options.CaptureModules && stepCaptured(*S, TS) &&
                 (!S->Options.ModuleFilter ||
                  std::regex_search(Path.begin(), Path.end(), *S->Options.ModuleFilter));
  // Inputs: one that is an earlier module call's output, unchanged, is
  // recorded as that (the dataflow); any other — the root's inputs, what a
  // parent computed with plain ops — with statistics and, if captured, bytes
  // (the root's always, for the inputs check, unless nothing is captured).
  for (size_t I = 0; I < Inputs.size(); ++I)
    recordInput(*S, Id, Inputs[I], int64_t(I), Capture || (IsRoot && S->Options.CaptureModules));
  TS.CallStack.push_back({Id, Capture, S->Writer->nextTensorId(), at::sequence_number::peek()});
  publishOpenCall(TS);
  return Id;
}

/// \p T, recorded as the output \p TensorId, may feed a later module call.
static void produced(ThreadState &TS, const at::Tensor &T, int64_t TensorId,
                     std::shared_ptr<DeferredStats> Computed) {
  StorageWriteCounts &Counts = StorageWriteCounts::process();
  // What the same tensor was recorded as before: this output replaces it.
  if (auto It = TS.Producers.find(T.unsafeGetTensorImpl()); It != TS.Producers.end()) {
    if (It->second.Storage)
      Counts.unwatch(It->second.Storage);
    TS.Producers.erase(It);
  }
  if (TS.Producers.size() >= TS.PruneProducersAt)
    pruneProducers(TS);
  const void *Storage = storageOf(T);
  std::optional<int64_t> Writes = Storage ? Counts.watch(Storage) : 0;
  if (!Writes)
    return; // out of memory: unwatched, so no later input is vouched for as it
  bool Inference = T.is_inference();
  TS.Producers.emplace(
      T.unsafeGetTensorImpl(),
      ProducedTensor{
          c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(T.getIntrusivePtr()),
          Storage, *Writes, Inference ? 0 : T._version(), Inference, TensorId,
          std::move(Computed), TS.OpsBegun});
}

void exitModule(int64_t Id, const std::vector<at::Tensor> &Outputs,
                const std::vector<at::Tensor> &KeywordInputs, int64_t FirstKeywordIndex) {
  Session *S = Current;
  if (!S || Id == 0)
    return;
  ThreadFlags &Flags = threadFlags();
  standStillIfTerminating(Flags);
  InsideEkkaScope Inside(Flags);
  TracerTimer Timer(TracerPart::Modules, /*NewCall=*/false);
  ThreadState &TS = thisThread(Flags);
  // Calls that raised never reached their exit; close them with this one
  // (if this thread has it open at all).
  if (llvm::none_of(TS.CallStack, [&](const OpenCall &C) { return C.Id == Id; })) {
    return;
  }
  while (!TS.CallStack.empty() && TS.CallStack.back().Id != Id)
    TS.CallStack.pop_back();
  bool Capture = S->Options.CaptureModules && stepCaptured(*S, TS);
  int64_t FirstTensor = 0;
  if (!TS.CallStack.empty()) {
    Capture = TS.CallStack.back().Capture;
    FirstTensor = TS.CallStack.back().FirstTensor;
    TS.CallStack.pop_back();
  }
  publishOpenCall(TS);
  // The root's keyword inputs (HF generate()'s input_ids=...) are captured
  // as its positional ones are, whatever the capture's filter.
  bool CaptureInputs = Capture || (TS.CallStack.empty() && S->Options.CaptureModules);
  for (size_t I = 0; I < KeywordInputs.size(); ++I)
    recordInput(*S, Id, KeywordInputs[I], FirstKeywordIndex + int64_t(I), CaptureInputs,
                /*AtExit=*/true, FirstTensor);
  // A forward of the root is over: its tensors feed nothing later (also
  // when recording one of them fails), and the statistics of its GPU
  // tensors are launched, before the program does anything else with them.
  struct AtRootEnd {
    Session &S;
    ThreadState &TS;
    ~AtRootEnd() {
      if (!TS.CallStack.empty())
        return;
      forgetProducers(TS);
      S.DeviceDeferred.launchAll();
    }
  } ForgetAtRootEnd{*S, TS};
  for (size_t I = 0; I < Outputs.size(); ++I) {
    const at::Tensor &T = Outputs[I];
    // A module often returns what its last submodule returned (a model its
    // final norm's output, an MLP its down projection's): the statistics
    // of that record hold for this one.
    std::shared_ptr<DeferredStats> Computed;
    int64_t TensorId = recordTensor(*S, T, TensorOwner::ModuleCall, Id, "output", int64_t(I),
                                    /*Stats=*/true, Capture, std::nullopt,
                                    provenanceOf(TS, T).Stats, &Computed);
    // An inference tensor's writes are counted by storage alone; a jagged
    // one's go to its values' storage, not its own: it feeds no dataflow.
    if (TensorId && T.defined() && !(T.is_inference() && isJagged(T)))
      produced(TS, T, TensorId, std::move(Computed));
  }
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
