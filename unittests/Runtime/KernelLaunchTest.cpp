//===- KernelLaunchTest.cpp - CUPTI launch decoding without a GPU ---------===//
#include "ekka/Runtime/KernelLaunch.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti.h>

#include <gtest/gtest.h>

#include <cstddef>

using namespace ekka;

namespace {

// The calls besides launches that may write a GPU tensor whose statistics
// wait for their launch, or start capturing its stream into a graph, by
// the names cuptiGetCallbackName gives.
TEST(KernelLaunch, CallsThatWriteDeviceMemory) {
  for (const char *Name : {"cudaMemcpyAsync", "cudaMemcpy_v3020", "cudaMemsetAsync_ptsz",
                           "cuMemcpyHtoDAsync_v2", "cuMemsetD32Async", "cuMemcpyPeerAsync",
                           "cudaGraphLaunch", "cuGraphLaunch_ptsz", "cuStreamWriteValue32_v2",
                           "cuStreamBatchMemOp", "cudaStreamBeginCapture_v10000",
                           "cuStreamBeginCapture_v2"})
    EXPECT_TRUE(precedesDeviceStatistics(Name)) << Name;
  for (const char *Name : {"cudaLaunchKernel", "cuLaunchKernel", "cudaMemGetInfo", "cudaMalloc",
                           "cudaStreamSynchronize", "cuGraphInstantiate", "", "Memcpy",
                           "cuMemSetAccess", "cudaEventRecord"})
    EXPECT_FALSE(precedesDeviceStatistics(Name)) << Name;
  EXPECT_FALSE(precedesDeviceStatistics(nullptr));
}

// The calls that order work across streams or with the host.
TEST(KernelLaunch, CallsThatOrderDeviceWork) {
  for (const char *Name : {"cudaEventRecord", "cudaEventRecordWithFlags_ptsz", "cuEventRecord",
                           "cudaStreamWaitEvent_ptsz", "cuStreamWaitEvent", "cudaDeviceSynchronize",
                           "cudaStreamSynchronize_v3020", "cudaEventSynchronize",
                           "cuCtxSynchronize", "cuStreamSynchronize_ptsz",
                           "cuStreamWaitValue32_v2"})
    EXPECT_TRUE(ordersDeviceWork(Name)) << Name;
  for (const char *Name : {"cudaEventQuery", "cudaStreamQuery", "cudaEventCreate", "cudaMemcpyAsync",
                           "cudaLaunchKernel", "", "EventRecord"})
    EXPECT_FALSE(ordersDeviceWork(Name)) << Name;
  EXPECT_FALSE(ordersDeviceWork(nullptr));
}

TEST(KernelLaunch, RuntimeLaunchKernel) {
  cudaLaunchKernel_v7000_params P{};
  P.gridDim = dim3(4, 2, 1);
  P.blockDim = dim3(128, 1, 1);
  P.sharedMem = 4096;
  P.stream = reinterpret_cast<cudaStream_t>(0x1234);
  auto L = decodeLaunch(LaunchDomain::RuntimeApi, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
                        &P, "_Z6kernelPf", 77);
  ASSERT_TRUE(L.has_value());
  EXPECT_STREQ(L->Name, "_Z6kernelPf");
  EXPECT_EQ(L->Grid[0], 4u);
  EXPECT_EQ(L->Grid[1], 2u);
  EXPECT_EQ(L->Block[0], 128u);
  EXPECT_EQ(L->SharedMem, 4096u);
  EXPECT_EQ(L->Stream, 0x1234u);
  EXPECT_EQ(L->CorrelationId, 77u);
}

/// The parameters of `__cudaLaunchKernel(cudaKernel_t, dim3, dim3, void **,
/// size_t, cudaStream_t)` (crt/device_functions.h) as CUPTI lays them out:
/// in order, in a struct.
struct CudaLaunchKernel13Signature {
  cudaKernel_t Kernel;
  dim3 Grid;
  dim3 Block;
  void **Args;
  size_t SharedMem;
  cudaStream_t Stream;
};

TEST(KernelLaunch, Cuda13LaunchMatchesCudaLaunchKernelsLayout) {
  // CBIDs 505/506 have no published parameter struct; the runtime reads
  // them as cudaLaunchKernel's. That holds if the two layouts agree.
  using P7 = cudaLaunchKernel_v7000_params;
  using P13 = CudaLaunchKernel13Signature;
  EXPECT_EQ(sizeof(P7), sizeof(P13));
  EXPECT_EQ(offsetof(P7, gridDim), offsetof(P13, Grid));
  EXPECT_EQ(offsetof(P7, blockDim), offsetof(P13, Block));
  EXPECT_EQ(offsetof(P7, sharedMem), offsetof(P13, SharedMem));
  EXPECT_EQ(offsetof(P7, stream), offsetof(P13, Stream));
}

TEST(KernelLaunch, Cuda13Launch) {
  CudaLaunchKernel13Signature P{};
  P.Grid = dim3(7, 1, 1);
  P.Block = dim3(32, 4, 1);
  P.SharedMem = 16;
  auto L = decodeLaunch(LaunchDomain::RuntimeApi,
                        CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000, &P, "k", 1);
  ASSERT_TRUE(L.has_value());
  EXPECT_EQ(L->Grid[0], 7u);
  EXPECT_EQ(L->Block[1], 4u);
  EXPECT_EQ(L->SharedMem, 16u);
}

TEST(KernelLaunch, RuntimeLaunchKernelExC) {
  cudaLaunchConfig_t Config{};
  Config.gridDim = dim3(3, 3, 3);
  Config.blockDim = dim3(64, 1, 1);
  Config.dynamicSmemBytes = 100;
  cudaLaunchKernelExC_v11060_params P{};
  P.config = &Config;
  auto L = decodeLaunch(LaunchDomain::RuntimeApi,
                        CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060, &P, "k", 2);
  ASSERT_TRUE(L.has_value());
  EXPECT_EQ(L->Grid[2], 3u);
  EXPECT_EQ(L->SharedMem, 100u);
}

TEST(KernelLaunch, DriverLaunchesAsTritonMakesThem) {
  cuLaunchKernel_params P{};
  P.gridDimX = 9;
  P.blockDimX = 256;
  P.sharedMemBytes = 512;
  auto L = decodeLaunch(LaunchDomain::DriverApi, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &P,
                        "triton_poi_fused_add_0", 3);
  ASSERT_TRUE(L.has_value());
  EXPECT_EQ(L->Grid[0], 9u);
  EXPECT_EQ(L->Block[0], 256u);
  EXPECT_EQ(L->Name, "triton_poi_fused_add_0");

  CUlaunchConfig Config{};
  Config.gridDimY = 5;
  Config.blockDimZ = 2;
  cuLaunchKernelEx_params Ex{};
  Ex.config = &Config;
  auto LE = decodeLaunch(LaunchDomain::DriverApi, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, &Ex,
                         "k", 4);
  ASSERT_TRUE(LE.has_value());
  EXPECT_EQ(LE->Grid[1], 5u);
  EXPECT_EQ(LE->Block[2], 2u);
}

TEST(KernelLaunch, OtherCallbacksAreNotLaunches) {
  int Dummy = 0;
  EXPECT_FALSE(decodeLaunch(LaunchDomain::RuntimeApi,
                            CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020, &Dummy, "x", 1));
  EXPECT_FALSE(isLaunchCallback(LaunchDomain::DriverApi, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2));
  EXPECT_TRUE(isLaunchCallback(LaunchDomain::RuntimeApi,
                               CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000));
  EXPECT_TRUE(isLaunchCallback(LaunchDomain::DriverApi,
                               CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel));
}

TEST(KernelLaunch, ARuntimeLaunchIsRecordedOnceNotAgainAsItsDriverLaunch) {
  LaunchDeduplicator D;
  // cudaLaunchKernel enter -> cuLaunchKernel enter/exit -> cudaLaunchKernel exit
  // The recorded launch ends at the runtime's exit, not the driver's.
  EXPECT_FALSE(D.insideLaunch());
  EXPECT_TRUE(D.enter(LaunchDomain::RuntimeApi));
  EXPECT_TRUE(D.insideLaunch()); // the driver launch underneath is the same kernel
  EXPECT_FALSE(D.enter(LaunchDomain::DriverApi));
  EXPECT_FALSE(D.exit(LaunchDomain::DriverApi));
  EXPECT_TRUE(D.exit(LaunchDomain::RuntimeApi));
  EXPECT_FALSE(D.insideLaunch());
  // Triton launches through the driver alone: recorded.
  EXPECT_TRUE(D.enter(LaunchDomain::DriverApi));
  EXPECT_FALSE(D.insideLaunch());
  EXPECT_TRUE(D.exit(LaunchDomain::DriverApi));
  // An unmatched exit ends nothing.
  EXPECT_FALSE(D.exit(LaunchDomain::RuntimeApi));
}

TEST(KernelLaunch, LaunchesCarryTheirFunctionAndParameters) {
  float *Buffer = reinterpret_cast<float *>(0x7f0000001000);
  void *Args[] = {&Buffer};
  CudaLaunchKernel13Signature P{};
  P.Kernel = reinterpret_cast<cudaKernel_t>(0x1234);
  P.Args = Args;
  auto L = decodeLaunch(LaunchDomain::RuntimeApi,
                        CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000, &P, "k", 1);
  ASSERT_TRUE(L.has_value());
  EXPECT_EQ(L->HandleKind, KernelHandle::Kernel);
  EXPECT_EQ(L->Handle, reinterpret_cast<const void *>(P.Kernel));
  EXPECT_EQ(L->Params, Args);

  cuLaunchKernel_params D{};
  D.f = reinterpret_cast<CUfunction>(0x99);
  D.kernelParams = Args;
  auto LD = decodeLaunch(LaunchDomain::DriverApi, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &D, "t", 2);
  ASSERT_TRUE(LD.has_value());
  EXPECT_EQ(LD->HandleKind, KernelHandle::Function);
  EXPECT_EQ(LD->Params, Args);

  cuLaunchKernel_params NoFunction{};
  auto LN = decodeLaunch(LaunchDomain::DriverApi, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
                         &NoFunction, "t", 3);
  EXPECT_EQ(LN->HandleKind, KernelHandle::None);
}

TEST(KernelLaunch, PointerArgumentsAreThePointerSizedParameters) {
  // kernel(float *out, int n, const float *in, double scale, half2 h)
  float *Out = reinterpret_cast<float *>(0x7f0000002000);
  int N = 42;
  const float *In = reinterpret_cast<const float *>(0x7f0000003000);
  double Scale = 0.5;
  uint32_t Half2 = 0x3c003c00;
  void *Params[] = {&Out, &N, &In, &Scale, &Half2};
  auto Pointers = pointerArguments(Params, {8, 4, 8, 8, 4});
  // A double is pointer-sized too: it is a candidate that matches no tensor.
  ASSERT_EQ(Pointers.size(), 3u);
  EXPECT_EQ(Pointers[0].Index, 0u);
  EXPECT_EQ(Pointers[0].Value, reinterpret_cast<uint64_t>(Out));
  EXPECT_EQ(Pointers[1].Index, 2u);
  EXPECT_EQ(Pointers[1].Value, reinterpret_cast<uint64_t>(In));
  EXPECT_EQ(Pointers[2].Index, 3u);
  // Unknown layout or no parameter array: nothing.
  EXPECT_TRUE(pointerArguments(Params, {}).empty());
  EXPECT_TRUE(pointerArguments(nullptr, {8}).empty());
  // A null pointer is no buffer.
  float *Null = nullptr;
  void *NullParams[] = {&Null};
  EXPECT_TRUE(pointerArguments(NullParams, {8}).empty());
}

} // namespace
