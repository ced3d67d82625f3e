//===- KernelLaunch.cpp - Decoding CUPTI launch callbacks -----------------===//
#include "ekka/Runtime/KernelLaunch.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti.h>

namespace ekka {

namespace {

/// CUDA 13 launches through `__cudaLaunchKernel(const void *func, dim3 grid,
/// dim3 block, void **args, size_t sharedMem, cudaStream_t stream)`, and
/// CUPTI publishes no parameter struct for it (CBIDs 505/506). Its
/// parameters are laid out as this struct, the same as cudaLaunchKernel's.
struct CudaLaunchKernel13Params {
  const void *Func;
  dim3 GridDim;
  dim3 BlockDim;
  void **Args;
  size_t SharedMem;
  cudaStream_t Stream;
};

template <typename P> void fromRuntimeParams(const P *Params, KernelLaunch &L) {
  L.Grid[0] = Params->gridDim.x;
  L.Grid[1] = Params->gridDim.y;
  L.Grid[2] = Params->gridDim.z;
  L.Block[0] = Params->blockDim.x;
  L.Block[1] = Params->blockDim.y;
  L.Block[2] = Params->blockDim.z;
  L.SharedMem = Params->sharedMem;
  L.Stream = reinterpret_cast<uint64_t>(Params->stream);
}

} // namespace

bool isLaunchCallback(LaunchDomain Domain, uint32_t Cbid) {
  if (Domain == LaunchDomain::RuntimeApi)
    return Cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000 ||
           Cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000 ||
           Cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060 ||
           Cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060 ||
           Cbid == CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000 ||
           Cbid == CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000;
  return Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel ||
         Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz ||
         Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx ||
         Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz;
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
      fromRuntimeParams(static_cast<const cudaLaunchKernel_v7000_params *>(FunctionParams), L);
      return L;
    case CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000:
    case CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000: {
      auto *P = static_cast<const CudaLaunchKernel13Params *>(FunctionParams);
      L.Grid[0] = P->GridDim.x;
      L.Grid[1] = P->GridDim.y;
      L.Grid[2] = P->GridDim.z;
      L.Block[0] = P->BlockDim.x;
      L.Block[1] = P->BlockDim.y;
      L.Block[2] = P->BlockDim.z;
      L.SharedMem = P->SharedMem;
      L.Stream = reinterpret_cast<uint64_t>(P->Stream);
      return L;
    }
    default: { // cudaLaunchKernelExC: the launch configuration holds it all
      auto *P = static_cast<const cudaLaunchKernelExC_v11060_params *>(FunctionParams);
      if (!P->config)
        return L;
      const cudaLaunchConfig_t &C = *P->config;
      L.Grid[0] = C.gridDim.x;
      L.Grid[1] = C.gridDim.y;
      L.Grid[2] = C.gridDim.z;
      L.Block[0] = C.blockDim.x;
      L.Block[1] = C.blockDim.y;
      L.Block[2] = C.blockDim.z;
      L.SharedMem = C.dynamicSmemBytes;
      L.Stream = reinterpret_cast<uint64_t>(C.stream);
      return L;
    }
    }
  }
  if (Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel ||
      Cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz) {
    auto *P = static_cast<const cuLaunchKernel_params *>(FunctionParams);
    L.Grid[0] = P->gridDimX;
    L.Grid[1] = P->gridDimY;
    L.Grid[2] = P->gridDimZ;
    L.Block[0] = P->blockDimX;
    L.Block[1] = P->blockDimY;
    L.Block[2] = P->blockDimZ;
    L.SharedMem = P->sharedMemBytes;
    L.Stream = reinterpret_cast<uint64_t>(P->hStream);
    return L;
  }
  auto *P = static_cast<const cuLaunchKernelEx_params *>(FunctionParams);
  if (!P->config)
    return L;
  const CUlaunchConfig &C = *P->config;
  L.Grid[0] = C.gridDimX;
  L.Grid[1] = C.gridDimY;
  L.Grid[2] = C.gridDimZ;
  L.Block[0] = C.blockDimX;
  L.Block[1] = C.blockDimY;
  L.Block[2] = C.blockDimZ;
  L.SharedMem = C.sharedMemBytes;
  L.Stream = reinterpret_cast<uint64_t>(C.hStream);
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

void LaunchDeduplicator::exit(LaunchDomain Domain) {
  if (Domain == LaunchDomain::RuntimeApi && RuntimeDepth > 0)
    --RuntimeDepth;
}

} // namespace ekka
