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
#include <cupti.h>
#include <dlfcn.h>
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

void CUPTIAPI onCallback(void *, CUpti_CallbackDomain Domain, CUpti_CallbackId Cbid,
                         const void *Data) {
  if (Domain != CUPTI_CB_DOMAIN_RUNTIME_API && Domain != CUPTI_CB_DOMAIN_DRIVER_API)
    return;
  LaunchDomain D = Domain == CUPTI_CB_DOMAIN_RUNTIME_API ? LaunchDomain::RuntimeApi
                                                         : LaunchDomain::DriverApi;
  const auto *Info = static_cast<const CUpti_CallbackData *>(Data);
  if (Info->callbackSite == CUPTI_API_EXIT) {
    Dedup.exit(D);
    return;
  }
  if (!Dedup.enter(D))
    return;
  if (auto Launch = decodeLaunch(D, Cbid, Info->functionParams, Info->symbolName,
                                 Info->correlationId))
    recordKernelLaunch(*Launch);
}

/// Which other profiler holds CUPTI, as far as the environment tells.
std::string otherSubscriber() {
  if (std::getenv("NSYS_PROFILING_SESSION_ID") || std::getenv("NSYS_LAUNCH_ID"))
    return "Nsight Systems (nsys)";
  if (std::getenv("NV_COMPUTE_PROFILER_PERFWORKS_DIR") || std::getenv("NV_NSIGHT_INJECTION_TRANSPORT_TYPE"))
    return "Nsight Compute (ncu)";
  return "torch.profiler (Kineto), Nsight Systems or Nsight Compute";
}

template <typename F> bool load(F &Fn, const char *Name) {
  Fn = reinterpret_cast<F>(dlsym(Library, Name));
  return Fn != nullptr;
}

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
