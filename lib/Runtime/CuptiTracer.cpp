//===- CuptiTracer.cpp - GPU kernel launches through CUPTI callbacks ------===//
//
// libcupti is loaded at run time (the one that ships with the torch wheel,
// found by the shim), so the runtime builds and loads on machines without a
// GPU. Only the launch callbacks are enabled, one by one: enabling whole
// domains would call back on every CUDA API call. The callback copies what it
// needs and returns; the TraceWriter's thread does the rest, as in Kineto.
//
//===----------------------------------------------------------------------===//
#include "SessionInternal.h"

#include "ekka/Config.h"

#include <cstdlib>
#include <string>

#if EKKA_HAVE_CUPTI
#include <cuda.h>
#include <cupti.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <bitset>
#include <iterator>
#include <string_view>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>
#endif

namespace ekka {

#if EKKA_HAVE_CUPTI

namespace {

struct CuptiApi {
  decltype(&cuptiSubscribe) Subscribe = nullptr;
  decltype(&cuptiUnsubscribe) Unsubscribe = nullptr;
  decltype(&cuptiEnableCallback) EnableCallback = nullptr;
  decltype(&cuptiGetResultString) ResultString = nullptr;
  decltype(&cuptiGetCallbackName) CallbackName = nullptr; ///< Optional.
};

CuptiApi Api;
void *Library = nullptr;
/// The callbacks enabled for calls that write device memory without a
/// launch, or start a graph's capture (precedesDeviceStatistics), and for
/// those that order work across streams (ordersDeviceWork), by domain:
/// runtime, driver.
std::bitset<2048> WriteCallbacks[2], OrderCallbacks[2];
std::atomic<bool> SeesWrites{false};
CUpti_SubscriberHandle Subscriber = nullptr;
thread_local LaunchDeduplicator Dedup;

/// The driver API, for a kernel's parameter layout and for snapshots of the
/// buffers it was given. Resolved from the libcuda the program loaded, at
/// the first launch that needs it (CUDA is initialised by then).
struct DriverApi {
  bool Tried = false, Loaded = false;
  CUresult (*FuncGetParamInfo)(CUfunction, size_t, size_t *, size_t *) = nullptr;
  CUresult (*KernelGetParamInfo)(CUkernel, size_t, size_t *, size_t *) = nullptr;
  CUresult (*KernelGetFunction)(CUfunction *, CUkernel) = nullptr;
  CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*StreamSynchronize)(CUstream) = nullptr;
  CUresult (*StreamIsCapturing)(CUstream, CUstreamCaptureStatus *) = nullptr;
};
DriverApi Driver;
std::mutex DriverMutex;

/// Why launches in captured ops had no buffers snapshotted, for the trace's
/// meta: a snapshot that silently never happens would look like a kernel
/// that wrote nothing.
std::map<std::string, uint64_t> SnapshotMisses;
std::atomic<uint64_t> NestedDriverLaunches{0}, NestedRuntimeLaunches{0};
void missedSnapshot(const std::string &Why) {
  std::lock_guard<std::mutex> Lock(DriverMutex);
  ++SnapshotMisses[Why];
}

template <typename F> bool loadFrom(void *Handle, F &Fn, const char *Name) {
  Fn = reinterpret_cast<F>(dlsym(Handle, Name));
  return Fn != nullptr;
}

bool loadDriver() {
  std::lock_guard<std::mutex> Lock(DriverMutex);
  if (Driver.Tried)
    return Driver.Loaded;
  Driver.Tried = true;
  void *Cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!Cuda)
    return false;
  Driver.Loaded = loadFrom(Cuda, Driver.FuncGetParamInfo, "cuFuncGetParamInfo") &&
                  loadFrom(Cuda, Driver.KernelGetParamInfo, "cuKernelGetParamInfo") &&
                  loadFrom(Cuda, Driver.KernelGetFunction, "cuKernelGetFunction") &&
                  loadFrom(Cuda, Driver.MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2") &&
                  loadFrom(Cuda, Driver.StreamSynchronize, "cuStreamSynchronize") &&
                  loadFrom(Cuda, Driver.StreamIsCapturing, "cuStreamIsCapturing");
  if (Driver.Loaded)
    setDeviceMemoryOps({[](void *Dst, const void *Src, size_t Bytes, uint64_t Stream) {
                          return Driver.MemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(Dst),
                                                        reinterpret_cast<CUdeviceptr>(Src), Bytes,
                                                        reinterpret_cast<CUstream>(Stream)) ==
                                 CUDA_SUCCESS;
                        },
                        [](uint64_t Stream) {
                          Driver.StreamSynchronize(reinterpret_cast<CUstream>(Stream));
                        }});
  return Driver.Loaded;
}

/// A CUDA runtime's functions for resolving a host stub, and for keeping
/// its per-thread last error as the program left it.
struct StubRuntime {
  int (*GetFuncBySymbol)(CUfunction *, const void *) = nullptr;
  int (*PeekAtLastError)() = nullptr;
  int (*GetLastError)() = nullptr;
  bool usable() const { return GetFuncBySymbol && PeekAtLastError && GetLastError; }
};

/// The runtime that registered host stub \p Stub: the library holding the
/// stub resolves it, to its own statically linked runtime (nvcc's default)
/// or to the libcudart it depends on (torch, cuBLAS); else the process-wide
/// one. Only the registering runtime knows the stub.
StubRuntime runtimeOf(const void *Stub) {
  thread_local std::unordered_map<std::string, StubRuntime> ByLibrary;
  auto Load = [](void *Lib, StubRuntime &R) {
    loadFrom(Lib, R.GetFuncBySymbol, "cudaGetFuncBySymbol");
    loadFrom(Lib, R.PeekAtLastError, "cudaPeekAtLastError");
    loadFrom(Lib, R.GetLastError, "cudaGetLastError");
  };
  Dl_info Where;
  std::string Library = dladdr(Stub, &Where) && Where.dli_fname ? Where.dli_fname : "";
  auto [It, Inserted] = ByLibrary.try_emplace(Library);
  if (Inserted) {
    if (void *Lib = Library.empty() ? nullptr : dlopen(Library.c_str(), RTLD_LAZY | RTLD_NOLOAD))
      Load(Lib, It->second);
    if (!It->second.usable())
      Load(RTLD_DEFAULT, It->second);
  }
  return It->second;
}

/// Resolves a host stub to its function. A runtime that does not know the
/// stub records the failure as its last error, which the program's next
/// error check would report as its own (torch raises "invalid device
/// function" at its next launch): that error is cleared, and the lookup is
/// not tried while the program has an error of its own pending.
CUfunction functionOfStub(const void *Stub, std::string &Why, bool &Retry) {
  StubRuntime Runtime = runtimeOf(Stub);
  if (!Runtime.usable()) {
    Why = "no parameter layout: no CUDA runtime to resolve the host stub";
    return nullptr;
  }
  if (int Pending = Runtime.PeekAtLastError()) {
    Why = "no parameter layout: the program had a CUDA error pending (" +
          std::to_string(Pending) + ")";
    Retry = true;
    return nullptr;
  }
  CUfunction Function = nullptr;
  if (int R = Runtime.GetFuncBySymbol(&Function, Stub)) {
    Runtime.GetLastError(); // ours, not the program's
    Why = "no parameter layout: cudaGetFuncBySymbol error " + std::to_string(R);
    return nullptr;
  }
  return Function;
}

/// Each parameter's size, as the driver reports it; cached per function.
/// Empty, with the reason in \p Why, when the driver does not tell.
const std::vector<KernelParam> &parameterLayout(const KernelLaunch &L, std::string &Why) {
  thread_local std::map<std::pair<int, const void *>,
                        std::pair<std::vector<KernelParam>, std::string>>
      Cache;
  auto [It, Inserted] = Cache.try_emplace({int(L.HandleKind), L.Handle});
  auto &[Layout, Reason] = It->second;
  bool Retry = false; // not known now, but perhaps at the next launch
  if (Inserted) {
    // A CUkernel is asked directly, then through its function in this
    // context; a host stub through the runtime that registered it.
    CUfunction Function = nullptr;
    CUresult First = CUDA_SUCCESS;
    auto Ask = [&](auto Fn, auto Handle) {
      for (size_t I = 0; I < 1024; ++I) {
        size_t Offset = 0, Size = 0;
        CUresult R = Fn(Handle, I, &Offset, &Size);
        if (R != CUDA_SUCCESS) {
          if (I == 0)
            First = R;
          return I > 0;
        }
        Layout.push_back({Offset, Size});
      }
      return true;
    };
    bool Known = false;
    if (L.HandleKind == KernelHandle::Function) {
      Known = Ask(Driver.FuncGetParamInfo, static_cast<CUfunction>(const_cast<void *>(L.Handle)));
      // The runtime launches a CUkernel cast to a CUfunction (CUDA 12's
      // context-independent loading), which only the kernel query takes.
      if (!Known)
        Known = Ask(Driver.KernelGetParamInfo, static_cast<CUkernel>(const_cast<void *>(L.Handle)));
    } else if (L.HandleKind == KernelHandle::Kernel) {
      auto *K = static_cast<CUkernel>(const_cast<void *>(L.Handle));
      Known = Ask(Driver.KernelGetParamInfo, K);
      if (!Known && Driver.KernelGetFunction(&Function, K) == CUDA_SUCCESS)
        Known = Ask(Driver.FuncGetParamInfo, Function);
    } else if ((Function = functionOfStub(L.Handle, Reason, Retry))) {
      Known = Ask(Driver.FuncGetParamInfo, Function);
    }
    if (!Known && Reason.empty())
      Reason = "no parameter layout: driver error " + std::to_string(int(First));
    static const char *Kinds[] = {"", " (CUfunction)", " (CUkernel)", " (host stub)"};
    if (!Reason.empty())
      Reason += Kinds[int(L.HandleKind)];
  }
  Why = Reason;
  if (Retry) {
    Cache.erase(It);
    static const std::vector<KernelParam> Unknown;
    return Unknown;
  }
  return Layout;
}

/// The launch's pointer-sized parameters, when the open op wants the
/// buffers its kernels are given and the stream is not capturing a graph
/// (a copy would become part of the graph).
std::vector<PointerArgument> snapshotCandidates(const KernelLaunch &L) {
  if (!kernelSnapshotsWanted())
    return {};
  if ((!L.Params && !L.ArgBuffer) || L.HandleKind == KernelHandle::None) {
    missedSnapshot("no parameter array in the launch");
    return {};
  }
  if (!loadDriver()) {
    missedSnapshot("the CUDA driver API could not be loaded");
    return {};
  }
  CUstreamCaptureStatus Capturing = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult R = Driver.StreamIsCapturing(reinterpret_cast<CUstream>(L.Stream), &Capturing);
  if (R != CUDA_SUCCESS || Capturing != CU_STREAM_CAPTURE_STATUS_NONE) {
    missedSnapshot(R != CUDA_SUCCESS ? "stream state unknown: driver error " + std::to_string(int(R))
                                     : "stream capturing a CUDA graph");
    return {};
  }
  std::string Why;
  const std::vector<KernelParam> &Layout = parameterLayout(L, Why);
  if (!Why.empty())
    missedSnapshot(Why);
  if (!L.Params)
    return pointerArguments(L.ArgBuffer, L.ArgBufferSize, Layout);
  std::vector<size_t> Sizes;
  for (const KernelParam &P : Layout)
    Sizes.push_back(P.Size);
  return pointerArguments(L.Params, Sizes);
}

void onCallbackImpl(CUpti_CallbackDomain Domain, CUpti_CallbackId Cbid, const void *Data);

/// Nothing may throw into CUPTI's C frames (that would terminate the
/// program): an error costs the record, and is counted.
void CUPTIAPI onCallback(void *, CUpti_CallbackDomain Domain, CUpti_CallbackId Cbid,
                         const void *Data) {
  TracerTimer Timer(TracerPart::KernelCallbacks);
  try {
    onCallbackImpl(Domain, Cbid, Data);
  } catch (const std::exception &E) {
    missedSnapshot(std::string("an error in the launch callback: ") + E.what());
  } catch (...) {
    missedSnapshot("an error in the launch callback");
  }
}

/// A recorded runtime launch by host stub whose parameters are not known
/// yet: the driver launch underneath usually tells them (by CUkernel); only
/// when none does is the stub resolved, at the launch's exit.
thread_local bool StubPending = false;

void onCallbackImpl(CUpti_CallbackDomain Domain, CUpti_CallbackId Cbid, const void *Data) {
  if (Domain != CUPTI_CB_DOMAIN_RUNTIME_API && Domain != CUPTI_CB_DOMAIN_DRIVER_API)
    return;
  LaunchDomain D = Domain == CUPTI_CB_DOMAIN_RUNTIME_API ? LaunchDomain::RuntimeApi
                                                         : LaunchDomain::DriverApi;
  const auto *Info = static_cast<const CUpti_CallbackData *>(Data);
  if (Cbid < WriteCallbacks[0].size() && (WriteCallbacks[D == LaunchDomain::DriverApi][Cbid] ||
                                           OrderCallbacks[D == LaunchDomain::DriverApi][Cbid])) {
    // A copy, a set, a graph's launch, a capture's start: what may write
    // to tensors whose statistics wait, or capture their launch, goes
    // after them; so does an event's record, a wait or a synchronisation.
    if (Info->callbackSite == CUPTI_API_ENTER)
      beforeDeviceWrite(OrderCallbacks[D == LaunchDomain::DriverApi][Cbid]);
    return;
  }
  auto Decode = [&] {
    return decodeLaunch(D, Cbid, Info->functionParams, Info->symbolName, Info->correlationId);
  };
  if (Info->callbackSite == CUPTI_API_EXIT) {
    // The recorded launch has returned: its kernel is on the stream.
    if (Dedup.exit(D)) {
      if (std::exchange(StubPending, false) && kernelSnapshotsWanted())
        if (auto Launch = Decode())
          matchKernelPointers(snapshotCandidates(*Launch));
      snapshotKernelBuffers();
    }
    return;
  }
  if (!Dedup.insideLaunch()) // once per kernel, before our own launches' callbacks
    beforeDeviceWrite();
  if (!Dedup.enter(D)) {
    // A launch underneath a recorded runtime launch: the same kernel, which
    // may tell its parameters (a driver launch, by CUfunction) when the
    // outer launch's handle did not.
    ++(D == LaunchDomain::DriverApi ? NestedDriverLaunches : NestedRuntimeLaunches);
    if (kernelSnapshotsWanted())
      if (auto Launch = Decode(); Launch && Launch->HandleKind != KernelHandle::None) {
        StubPending = false;
        matchKernelPointers(snapshotCandidates(*Launch));
      }
    return;
  }
  if (auto Launch = Decode()) {
    StubPending = Launch->HandleKind == KernelHandle::HostStub && kernelSnapshotsWanted();
    recordKernelLaunch(*Launch, StubPending ? std::vector<PointerArgument>{}
                                            : snapshotCandidates(*Launch));
  }
}

/// Which other profiler holds CUPTI, as far as the environment tells.
std::string otherSubscriber() {
  if (std::getenv("NSYS_PROFILING_SESSION_ID") || std::getenv("NSYS_LAUNCH_ID"))
    return "Nsight Systems (nsys)";
  if (std::getenv("NV_COMPUTE_PROFILER_PERFWORKS_DIR") || std::getenv("NV_NSIGHT_INJECTION_TRANSPORT_TYPE"))
    return "Nsight Compute (ncu)";
  return "torch.profiler (Kineto), Nsight Systems or Nsight Compute";
}

template <typename F> bool load(F &Fn, const char *Name) { return loadFrom(Library, Fn, Name); }

} // namespace

std::string startKernelTracing(const std::string &Path) {
  Library = dlopen(Path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!Library)
    return std::string("not traced: cannot load ") + Path + ": " + dlerror();
  if (!load(Api.Subscribe, "cuptiSubscribe") || !load(Api.Unsubscribe, "cuptiUnsubscribe") ||
      !load(Api.EnableCallback, "cuptiEnableCallback") ||
      !load(Api.ResultString, "cuptiGetResultString"))
    return "not traced: " + Path + " lacks the CUPTI callback API";
  CUptiResult R = Api.Subscribe(&Subscriber, reinterpret_cast<CUpti_CallbackFunc>(onCallback),
                                nullptr);
  if (R == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
    return "not traced: another CUPTI subscriber is active: " + otherSubscriber();
  if (R != CUPTI_SUCCESS) {
    const char *Why = nullptr;
    Api.ResultString(R, &Why);
    return std::string("not traced: cuptiSubscribe failed: ") + (Why ? Why : "unknown error");
  }
  unsigned Enabled = 0;
  for (auto [Domain, Launch] : {std::pair{CUPTI_CB_DOMAIN_RUNTIME_API, LaunchDomain::RuntimeApi},
                                std::pair{CUPTI_CB_DOMAIN_DRIVER_API, LaunchDomain::DriverApi}})
    for (uint32_t Cbid = 0; Cbid < 1024; ++Cbid)
      if (isLaunchCallback(Launch, Cbid) &&
          Api.EnableCallback(1, Subscriber, Domain, Cbid) == CUPTI_SUCCESS)
        ++Enabled;
  if (!Enabled) {
    Api.Unsubscribe(Subscriber);
    Subscriber = nullptr;
    return "not traced: no launch callback could be enabled";
  }
  // The calls that write device memory without a launch (or start a
  // capture), by their names.
  load(Api.CallbackName, "cuptiGetCallbackName");
  bool Writes = true;
  // Each kind seen at least once, in one domain or the other.
  const char *const Kinds[] = {"cudaMemcpy", "cuMemcpy", "EventRecord", "Synchronize",
                               "GraphLaunch"};
  bool Seen[std::size(Kinds)] = {};
  for (auto [Domain, Index] : {std::pair{CUPTI_CB_DOMAIN_RUNTIME_API, 0},
                               std::pair{CUPTI_CB_DOMAIN_DRIVER_API, 1}}) {
    WriteCallbacks[Index].reset();
    OrderCallbacks[Index].reset();
    LaunchDomain Launch = Index ? LaunchDomain::DriverApi : LaunchDomain::RuntimeApi;
    for (uint32_t Cbid = 1; Api.CallbackName && Cbid < WriteCallbacks[Index].size(); ++Cbid) {
      const char *Name = nullptr;
      if (isLaunchCallback(Launch, Cbid) || Api.CallbackName(Domain, Cbid, &Name) != CUPTI_SUCCESS)
        continue;
      bool Write = precedesDeviceStatistics(Name), Order = ordersDeviceWork(Name);
      if (!Write && !Order)
        continue;
      if (Api.EnableCallback(1, Subscriber, Domain, Cbid) != CUPTI_SUCCESS) {
        Writes = false; // one that cannot be seen: not all are
        continue;
      }
      WriteCallbacks[Index].set(Cbid, Write);
      OrderCallbacks[Index].set(Cbid, Order);
      std::string_view Called(Name);
      for (size_t K = 0; K < std::size(Kinds); ++K)
        Seen[K] |= Called.find(Kinds[K]) != std::string_view::npos;
    }
  }
  // Not if names were missing or matched little: then some are not seen.
  SeesWrites = Writes && std::all_of(std::begin(Seen), std::end(Seen), [](bool B) { return B; });
  return "traced";
}

bool kernelTracingSeesWrites() { return SeesWrites.load(); }

std::string kernelTracingMisses() {
  std::lock_guard<std::mutex> Lock(DriverMutex);
  std::string Report;
  uint64_t NestedDriver = NestedDriverLaunches.load();
  uint64_t NestedRuntime = NestedRuntimeLaunches.load();
  if (NestedDriver || NestedRuntime)
    Report = "launches inside a recorded launch, not recorded twice: " +
             std::to_string(NestedDriver) + " driver, " + std::to_string(NestedRuntime) + " runtime";
  for (const auto &[Why, Count] : SnapshotMisses)
    Report += (Report.empty() ? "" : "; ") + std::to_string(Count) + " launches: " + Why;
  return Report;
}

std::string stopKernelTracing() {
  if (Subscriber)
    Api.Unsubscribe(Subscriber);
  Subscriber = nullptr;
  SeesWrites = false;
  std::string Report = kernelTracingMisses();
  std::lock_guard<std::mutex> Lock(DriverMutex);
  NestedDriverLaunches = 0;
  NestedRuntimeLaunches = 0;
  SnapshotMisses.clear();
  return Report;
}

#else

std::string startKernelTracing(const std::string &) {
  return "not traced: this runtime was built without CUPTI headers";
}
std::string stopKernelTracing() { return ""; }
std::string kernelTracingMisses() { return ""; }
bool kernelTracingSeesWrites() { return false; }

#endif

} // namespace ekka
