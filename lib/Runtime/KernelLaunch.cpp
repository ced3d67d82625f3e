//===- KernelLaunch.cpp - Decoding CUPTI launch callbacks -----------------===//
#include "ekka/Runtime/KernelLaunch.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti.h>

#include <cstring>
#include <initializer_list>
#include <string_view>

namespace ekka {

namespace {

/// CUDA 13 launches through `__cudaLaunchKernel(cudaKernel_t kernel, dim3 grid,
/// dim3 block, void **args, size_t sharedMem, cudaStream_t stream)`, and
/// CUPTI publishes no parameter struct for it (CBIDs 505/506). Its
/// parameters are laid out as this struct, the same as cudaLaunchKernel's.
struct CudaLaunchKernel13Params {
  const void *Kernel; // cudaKernel_t
  dim3 GridDim;
  dim3 BlockDim;
  void **Args;
  size_t SharedMem;
  cudaStream_t Stream;
};

void setLaunch(KernelLaunch &L, dim3 Grid, dim3 Block, uint64_t SharedMem, const void *Stream) {
  L.Grid[0] = Grid.x;
  L.Grid[1] = Grid.y;
  L.Grid[2] = Grid.z;
  L.Block[0] = Block.x;
  L.Block[1] = Block.y;
  L.Block[2] = Block.z;
  L.SharedMem = SharedMem;
  L.Stream = reinterpret_cast<uint64_t>(Stream);
}

void setHandle(KernelLaunch &L, KernelHandle Kind, const void *Handle, void **Params) {
  L.HandleKind = Handle ? Kind : KernelHandle::None;
  L.Handle = Handle;
  L.Params = Params;
}

} // namespace

std::vector<PointerArgument> pointerArguments(void *const *Params,
                                              const std::vector<size_t> &ParamSizes) {
  std::vector<PointerArgument> Out;
  if (!Params)
    return Out;
  for (size_t I = 0; I < ParamSizes.size(); ++I) {
    if (ParamSizes[I] != sizeof(uint64_t) || !Params[I])
      continue;
    uint64_t Value;
    std::memcpy(&Value, Params[I], sizeof(Value)); // parameters need not be aligned
    if (Value)
      Out.push_back({uint32_t(I), Value});
  }
  return Out;
}

std::vector<PointerArgument> pointerArguments(const void *ArgBuffer, size_t Bytes,
                                              const std::vector<KernelParam> &Layout) {
  std::vector<PointerArgument> Out;
  if (!ArgBuffer)
    return Out;
  for (size_t I = 0; I < Layout.size(); ++I) {
    const KernelParam &P = Layout[I];
    if (P.Size != sizeof(uint64_t) || P.Offset + P.Size > Bytes)
      continue;
    uint64_t Value;
    std::memcpy(&Value, static_cast<const char *>(ArgBuffer) + P.Offset, sizeof(Value));
    if (Value)
      Out.push_back({uint32_t(I), Value});
  }
  return Out;
}

/// cuLaunchKernel's `extra`: key/value pairs up to CU_LAUNCH_PARAM_END.
void setArgBuffer(KernelLaunch &L, void **Extra) {
  if (!Extra)
    return;
  for (size_t I = 0; I < 64 && Extra[I] != CU_LAUNCH_PARAM_END; I += 2) {
    if (Extra[I] == CU_LAUNCH_PARAM_BUFFER_POINTER)
      L.ArgBuffer = Extra[I + 1];
    else if (Extra[I] == CU_LAUNCH_PARAM_BUFFER_SIZE && Extra[I + 1])
      L.ArgBufferSize = *static_cast<size_t *>(Extra[I + 1]);
  }
}

bool isLaunchCallback(LaunchDomain Domain, uint32_t Cbid) {
  if (Domain == LaunchDomain::RuntimeApi)
    return Cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000 ||
           Cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000 ||
           Cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060 ||
           Cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060 ||
           Cbid == CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000 ||
           Cbid == CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000 ||
           Cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000 ||
           Cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000;
  return Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel ||
         Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz ||
         Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel ||
         Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz ||
         Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx ||
         Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz;
}

namespace {

/// Whether \p CallbackName is a CUDA API call's (cuda*, cu*) whose name
/// holds one of \p Parts.
bool cudaCallNamed(const char *CallbackName, std::initializer_list<std::string_view> Parts) {
  std::string_view Name(CallbackName ? CallbackName : "");
  if (Name.substr(0, 2) != "cu")
    return false;
  for (std::string_view Part : Parts)
    if (Name.find(Part) != std::string_view::npos)
      return true;
  return false;
}

} // namespace

bool precedesDeviceStatistics(const char *CallbackName) {
  return cudaCallNamed(CallbackName, {"Memcpy", "Memset", "GraphLaunch", "WriteValue",
                                      "BatchMemOp", "BeginCapture"});
}

bool ordersDeviceWork(const char *CallbackName) {
  return cudaCallNamed(CallbackName,
                       {"EventRecord", "StreamWaitEvent", "Synchronize", "WaitValue"});
}

std::optional<KernelLaunch> decodeLaunch(LaunchDomain Domain, uint32_t Cbid,
                                         const void *FunctionParams,
                                         const char *SymbolName, uint32_t CorrelationId) {
  if (!FunctionParams || !isLaunchCallback(Domain, Cbid))
    return std::nullopt;
  KernelLaunch L;
  L.Name = SymbolName ? SymbolName : "";
  L.CorrelationId = CorrelationId;
  if (Domain == LaunchDomain::RuntimeApi) {
    switch (Cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000: {
      // The cooperative launch's parameters are laid out as these.
      auto *P = static_cast<const cudaLaunchKernel_v7000_params *>(FunctionParams);
      setLaunch(L, P->gridDim, P->blockDim, P->sharedMem, P->stream);
      setHandle(L, KernelHandle::HostStub, P->func, P->args);
      return L;
    }
    case CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000:
    case CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000: {
      auto *P = static_cast<const CudaLaunchKernel13Params *>(FunctionParams);
      setLaunch(L, P->GridDim, P->BlockDim, P->SharedMem, P->Stream);
      setHandle(L, KernelHandle::Kernel, P->Kernel, P->Args);
      return L;
    }
    default: { // cudaLaunchKernelExC: the launch configuration holds it all
      auto *P = static_cast<const cudaLaunchKernelExC_v11060_params *>(FunctionParams);
      setHandle(L, KernelHandle::HostStub, P->func, P->args);
      if (!P->config)
        return L;
      const cudaLaunchConfig_t &C = *P->config;
      setLaunch(L, C.gridDim, C.blockDim, C.dynamicSmemBytes, C.stream);
      return L;
    }
    }
  }
  if (Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel ||
      Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz ||
      Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel ||
      Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz) {
    // cuLaunchCooperativeKernel's parameters are cuLaunchKernel's without
    // the trailing `extra`.
    auto *P = static_cast<const cuLaunchKernel_params *>(FunctionParams);
    setLaunch(L, dim3(P->gridDimX, P->gridDimY, P->gridDimZ),
              dim3(P->blockDimX, P->blockDimY, P->blockDimZ), P->sharedMemBytes, P->hStream);
    setHandle(L, KernelHandle::Function, P->f, P->kernelParams);
    if (!P->kernelParams && (Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel ||
                             Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz))
      setArgBuffer(L, P->extra);
    return L;
  }
  auto *P = static_cast<const cuLaunchKernelEx_params *>(FunctionParams);
  setHandle(L, KernelHandle::Function, P->f, P->kernelParams);
  if (!P->kernelParams)
    setArgBuffer(L, P->extra);
  if (!P->config)
    return L;
  const CUlaunchConfig &C = *P->config;
  setLaunch(L, dim3(C.gridDimX, C.gridDimY, C.gridDimZ), dim3(C.blockDimX, C.blockDimY, C.blockDimZ),
            C.sharedMemBytes, C.hStream);
  return L;
}

bool LaunchDeduplicator::enter(LaunchDomain Domain) {
  if (Domain == LaunchDomain::RuntimeApi) {
    ++RuntimeDepth;
    return RuntimeDepth == 1;
  }
  // A driver launch inside a runtime launch is the same kernel.
  return RuntimeDepth == 0;
}

bool LaunchDeduplicator::exit(LaunchDomain Domain) {
  if (Domain == LaunchDomain::RuntimeApi) {
    if (RuntimeDepth == 0)
      return false;
    return --RuntimeDepth == 0;
  }
  return RuntimeDepth == 0;
}

} // namespace ekka
