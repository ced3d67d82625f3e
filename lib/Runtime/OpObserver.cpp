//===- OpObserver.cpp - Every op, through RecordFunction ------------------===//
//
// The op observer: at each op's start, which module call it belongs to (on
// its thread, or for a backward pass the thread that ran its forward), what
// it reads and writes, and its record; at its end, its outputs and what it
// wrote in place, and its span. Registered by startTrace (TraceSession.cpp).
//
//===----------------------------------------------------------------------===//
#include "SessionState.h"

#include <ATen/SequenceNumber.h>
#include <ATen/core/function_schema.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>
#include <cstring>
#include <dlfcn.h>
#include <limits>
#include <regex>
#include <sstream>

namespace ekka {

using namespace session;

namespace {
int64_t backwardCall(ThreadState &TS, int Task);
std::unique_ptr<at::ObserverContext> onOpStartImpl(const at::RecordFunction &Fn);
void onOpEndImpl(const at::RecordFunction &Fn, at::ObserverContext *Raw);
} // namespace

namespace session {

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

} // namespace session

namespace {

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
  Ctx->Thread = TS.OsThread;
  Ctx->SessionSerial = S->Serial;
  Ctx->StartNs = nowNanos();
  TS.OpStack.push_back(Ctx.get());
  return Ctx;
}

void onOpEndImpl(const at::RecordFunction &Fn, at::ObserverContext *Raw) {
  ThreadFlags &Flags = threadFlags();
  if (Flags.StateGone)
    return;
  uint64_t EndNs = nowNanos(); // before the tracer's own work on its outputs
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
  if (Ctx->SessionSerial == S->Serial)
    S->Writer->addSpan(SpanRecord{TensorOwner::Op, Ctx->OpId, Ctx->Thread,
                                  int64_t(Ctx->StartNs), int64_t(EndNs)});
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

} // namespace



} // namespace ekka
