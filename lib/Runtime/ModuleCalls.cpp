//===- ModuleCalls.cpp - Module calls and their dataflow ------------------===//
//
// A module call's entry (its inputs, each either an earlier call's output
// it still is, or recorded with statistics and bytes) and exit (its
// outputs, remembered to recognise them as later calls' inputs), and its
// span. The Python shim and the binding call enterModule and exitModule.
//
//===----------------------------------------------------------------------===//
#include "SessionState.h"

#include "llvm/ADT/STLExtras.h"

#include <ATen/SequenceNumber.h>

#include <algorithm>
#include <unistd.h>

namespace ekka {

using namespace session;

namespace session {

/// The end of a root's forward: its outputs feed nothing later. \p Unwatch
/// is false in a forked child, whose table of writes is new.
void forgetProducers(ThreadState &TS, bool Unwatch) {
  if (Unwatch)
    for (const auto &[Impl, Produced] : TS.Producers)
      if (Produced.Storage)
        StorageWriteCounts::process().unwatch(Produced.Storage);
  TS.Producers.clear();
  TS.PruneProducersAt = ThreadState::ProducersPrunedFrom;
}

/// Sets the call open on this thread now, for the backward passes of other
/// threads that look it up (openCall).
void publishOpenCall(ThreadState &TS) {
  if (TS.CallStack.empty())
    TS.OpenNow->set(0, 0);
  else
    TS.OpenNow->set(TS.CallStack.back().Id, TS.CallStack.back().Since);
}

} // namespace session

namespace {

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

} // namespace

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
  TS.CallStack.push_back({Id, Capture, S->Writer->nextTensorId(), at::sequence_number::peek(),
                          nowNanos(), S->Serial});
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
  uint64_t EndNs = nowNanos(); // before the tracer's own work on its outputs
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
    if (TS.CallStack.back().SessionSerial == S->Serial)
      S->Writer->addSpan(SpanRecord{TensorOwner::ModuleCall, Id, TS.OsThread,
                                    int64_t(TS.CallStack.back().StartNs), int64_t(EndNs)});
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

} // namespace ekka
