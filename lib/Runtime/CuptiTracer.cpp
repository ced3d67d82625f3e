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

#include <mutex>
#include <unordered_map>
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
};

CuptiApi Api;
void *Library = nullptr;
CUpti_SubscriberHandle Subscriber = nullptr;
thread_local LaunchDeduplicator Dedup;

/// The driver API, for a kernel's parameter layout and for snapshots of the
/// buffers it was given. Resolved from the libcuda the program loaded, at
/// the first launch that needs it (CUDA is initialised by then).
struct DriverApi {
  bool Tried = false, Loaded = false;
  CUresult (*FuncGetParamInfo)(CUfunction, size_t, size_t *, size_t *) = nullptr;
  CUresult (*KernelGetParamInfo)(CUkernel, size_t, size_t *, size_t *) = nullptr;
  CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*StreamSynchronize)(CUstream) = nullptr;
  CUresult (*StreamIsCapturing)(CUstream, CUstreamCaptureStatus *) = nullptr;
  int (*GetFuncBySymbol)(CUfunction *, const void *) = nullptr; // the runtime's
};
DriverApi Driver;
std::mutex DriverMutex;

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
                  loadFrom(Cuda, Driver.MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2") &&
                  loadFrom(Cuda, Driver.StreamSynchronize, "cuStreamSynchronize") &&
                  loadFrom(Cuda, Driver.StreamIsCapturing, "cuStreamIsCapturing");
  // Optional: only launches through cudaLaunchKernel's host stub need it.
  loadFrom(RTLD_DEFAULT, Driver.GetFuncBySymbol, "cudaGetFuncBySymbol");
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

/// Each parameter's size, as the driver reports it; cached per function.
const std::vector<size_t> &parameterSizes(const KernelLaunch &L) {
  thread_local std::unordered_map<const void *, std::vector<size_t>> Cache;
  auto [It, Inserted] = Cache.try_emplace(L.Handle);
  if (!Inserted)
    return It->second;
  CUfunction Function = nullptr;
  if (L.HandleKind == KernelHandle::Function)
    Function = static_cast<CUfunction>(const_cast<void *>(L.Handle));
  else if (L.HandleKind == KernelHandle::HostStub &&
           (!Driver.GetFuncBySymbol || Driver.GetFuncBySymbol(&Function, L.Handle) != 0))
    return It->second;
  for (size_t I = 0; I < 1024; ++I) {
    size_t Offset = 0, Size = 0;
    CUresult R = L.HandleKind == KernelHandle::Kernel
                     ? Driver.KernelGetParamInfo(
                           static_cast<CUkernel>(const_cast<void *>(L.Handle)), I, &Offset, &Size)
                     : Driver.FuncGetParamInfo(Function, I, &Offset, &Size);
    if (R != CUDA_SUCCESS)
      break;
    It->second.push_back(Size);
  }
  return It->second;
}

/// The launch's pointer-sized parameters, when the open op wants the
/// buffers its kernels are given and the stream is not capturing a graph
/// (a copy would become part of the graph).
std::vector<PointerArgument> snapshotCandidates(const KernelLaunch &L) {
  if (!L.Params || L.HandleKind == KernelHandle::None || !kernelSnapshotsWanted() ||
      !loadDriver())
    return {};
  CUstreamCaptureStatus Capturing = CU_STREAM_CAPTURE_STATUS_NONE;
  if (Driver.StreamIsCapturing(reinterpret_cast<CUstream>(L.Stream), &Capturing) !=
          CUDA_SUCCESS ||
      Capturing != CU_STREAM_CAPTURE_STATUS_NONE)
    return {};
  return pointerArguments(L.Params, parameterSizes(L));
}

void CUPTIAPI onCallback(void *, CUpti_CallbackDomain Domain, CUpti_CallbackId Cbid,
                         const void *Data) {
  if (Domain != CUPTI_CB_DOMAIN_RUNTIME_API && Domain != CUPTI_CB_DOMAIN_DRIVER_API)
    return;
  LaunchDomain D = Domain == CUPTI_CB_DOMAIN_RUNTIME_API ? LaunchDomain::RuntimeApi
                                                         : LaunchDomain::DriverApi;
  const auto *Info = static_cast<const CUpti_CallbackData *>(Data);
  if (Info->callbackSite == CUPTI_API_EXIT) {
    // The recorded launch has returned: its kernel is on the stream.
    if (Dedup.exit(D))
      snapshotKernelBuffers();
    return;
  }
  if (!Dedup.enter(D))
    return;
  if (auto Launch = decodeLaunch(D, Cbid, Info->functionParams, Info->symbolName,
                                 Info->correlationId))
    recordKernelLaunch(*Launch, snapshotCandidates(*Launch));
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
  return "traced";
}

void stopKernelTracing() {
  if (Subscriber)
    Api.Unsubscribe(Subscriber);
  Subscriber = nullptr;
}

#else

std::string startKernelTracing(const std::string &) {
  return "not traced: this runtime was built without CUPTI headers";
}
void stopKernelTracing() {}

#endif

} // namespace ekka
