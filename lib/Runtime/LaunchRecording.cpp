//===- LaunchRecording.cpp - GPU kernel launches, buffers -----------------===//
//
// What CUPTI's callbacks (CuptiTracer.cpp) hand the session: each kernel
// launch, recorded under the op that launched it; a write to device memory
// no op announced; and, for a captured op, a copy of each buffer its kernels
// were given, taken right after the kernel on its stream.
//
//===----------------------------------------------------------------------===//
#include "SessionState.h"

#include <ATen/ops/empty_like.h>

#include <algorithm>
#include <cstring>

namespace ekka {

using namespace session;

namespace session {

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

} // namespace session

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

} // namespace ekka
