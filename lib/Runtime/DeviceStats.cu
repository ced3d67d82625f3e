//===- DeviceStats.cu - A GPU tensor's statistics in one pass -------------===//
//
// The same statistics as statsOfBytes (lib/Trace) computes on a CPU, with
// the same treatment of NaNs and infinities, accumulated in double. The
// order of the additions differs from the CPU's, and is fixed: each thread
// adds its grid-strided elements in order, a block reduces its threads in a
// tree, and the blocks' partials are reduced by one block in a tree too.
//
//===----------------------------------------------------------------------===//
#include "DeviceStats.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace ekka {

namespace {

constexpr int Threads = 256;
constexpr int MaxBlocks = 1024;
/// Elements a thread takes before a second block is worth its launch.
constexpr int64_t PerThread = 16;

struct Acc {
  double Sum, SumSq, Min, Max, Nan, Inf;
};

__device__ inline Acc start() { return {0.0, 0.0, INFINITY, -INFINITY, 0.0, 0.0}; }

__device__ inline void add(Acc &A, double V) {
  A.Sum += V;
  A.SumSq += V * V;
  if (V != V) {
    A.Nan += 1;
    return;
  }
  if (isinf(V))
    A.Inf += 1;
  A.Min = V < A.Min ? V : A.Min;
  A.Max = V > A.Max ? V : A.Max;
}

__device__ inline void merge(Acc &A, const Acc &B) {
  A.Sum += B.Sum;
  A.SumSq += B.SumSq;
  A.Min = B.Min < A.Min ? B.Min : A.Min;
  A.Max = B.Max > A.Max ? B.Max : A.Max;
  A.Nan += B.Nan;
  A.Inf += B.Inf;
}

__device__ inline double load(const float *X, int64_t I) { return X[I]; }
__device__ inline double load(const double *X, int64_t I) { return X[I]; }
__device__ inline double load(const __half *X, int64_t I) { return __half2float(X[I]); }
__device__ inline double load(const __nv_bfloat16 *X, int64_t I) {
  return __bfloat162float(X[I]);
}

/// The block's threads' accumulators, reduced in a fixed tree; thread 0
/// returns the block's.
__device__ Acc reduceBlock(Acc A) {
  __shared__ Acc Shared[Threads];
  Shared[threadIdx.x] = A;
  __syncthreads();
  for (int Half = Threads / 2; Half > 0; Half /= 2) {
    if (int(threadIdx.x) < Half)
      merge(Shared[threadIdx.x], Shared[threadIdx.x + Half]);
    __syncthreads();
  }
  return Shared[0];
}

__device__ void writeFinal(const Acc &A, int64_t N, double *Out) {
  bool AllNan = A.Nan == double(N);
  Out[0] = A.Sum;
  Out[1] = A.SumSq;
  Out[2] = AllNan ? NAN : A.Min;
  Out[3] = AllNan ? NAN : A.Max;
  Out[4] = A.Nan;
  Out[5] = A.Inf;
}

/// Each block's statistics of its grid-strided share: the final six at
/// \p Out with one block, else six partials per block.
template <typename T>
__global__ void __launch_bounds__(Threads)
    blockStats(const T *X, int64_t N, double *Out) {
  Acc A = start();
  int64_t Stride = int64_t(gridDim.x) * Threads;
  for (int64_t I = int64_t(blockIdx.x) * Threads + threadIdx.x; I < N; I += Stride)
    add(A, load(X, I));
  A = reduceBlock(A);
  if (threadIdx.x != 0)
    return;
  if (gridDim.x == 1)
    return writeFinal(A, N, Out);
  double *P = Out + 6 * int64_t(blockIdx.x);
  P[0] = A.Sum;
  P[1] = A.SumSq;
  P[2] = A.Min;
  P[3] = A.Max;
  P[4] = A.Nan;
  P[5] = A.Inf;
}

__global__ void __launch_bounds__(Threads)
    finalStats(const double *Partials, int Blocks, int64_t N, double *Out) {
  Acc A = start();
  for (int B = threadIdx.x; B < Blocks; B += Threads) {
    const double *P = Partials + 6 * int64_t(B);
    merge(A, Acc{P[0], P[1], P[2], P[3], P[4], P[5]});
  }
  A = reduceBlock(A);
  if (threadIdx.x == 0)
    writeFinal(A, N, Out);
}

int blocksFor(int64_t N) {
  int64_t Blocks = (N + Threads * PerThread - 1) / (Threads * PerThread);
  return int(Blocks < 1 ? 1 : Blocks > MaxBlocks ? MaxBlocks : Blocks);
}

template <typename T>
int launch(const void *Data, int64_t N, double *Scratch, double *Out, cudaStream_t Stream) {
  int Blocks = blocksFor(N);
  const T *X = static_cast<const T *>(Data);
  if (Blocks == 1) {
    blockStats<T><<<1, Threads, 0, Stream>>>(X, N, Out);
    return cudaGetLastError();
  }
  blockStats<T><<<Blocks, Threads, 0, Stream>>>(X, N, Scratch);
  if (cudaError_t E = cudaGetLastError())
    return E;
  finalStats<<<1, Threads, 0, Stream>>>(Scratch, Blocks, N, Out);
  return cudaGetLastError();
}

} // namespace

int64_t deviceStatsScratch(int64_t N) {
  int Blocks = blocksFor(N);
  return Blocks == 1 ? 0 : 6 * int64_t(Blocks);
}

int launchDeviceStats(DeviceStatsType Type, const void *Data, int64_t N, double *Scratch,
                      double *Out, void *Stream) {
  cudaStream_t S = static_cast<cudaStream_t>(Stream);
  switch (Type) {
  case DeviceStatsType::F32: return launch<float>(Data, N, Scratch, Out, S);
  case DeviceStatsType::F64: return launch<double>(Data, N, Scratch, Out, S);
  case DeviceStatsType::F16: return launch<__half>(Data, N, Scratch, Out, S);
  case DeviceStatsType::BF16: return launch<__nv_bfloat16>(Data, N, Scratch, Out, S);
  }
  return cudaErrorInvalidValue;
}

double *deviceAddress(void *Host) {
  void *Device = nullptr;
  if (cudaHostGetDevicePointer(&Device, Host, 0) != cudaSuccess) {
    cudaGetLastError(); // this library's own runtime's error, not the program's
    return nullptr;
  }
  return static_cast<double *>(Device);
}

} // namespace ekka
