//===- DeviceStats.cu - A GPU tensor's statistics in one pass -------------===//
//
// The same statistics as statsOfBytes (lib/Trace) computes on a CPU, with
// the same treatment of NaNs and infinities, accumulated in double. The
// order of the additions differs from the CPU's, and is fixed: each thread
// adds its grid-strided elements in order, a block reduces its threads in a
// tree, and the last block to finish reduces the blocks' partials in a tree
// too.
//
// The CUDA calls here go to this library's own, static CUDA runtime, which
// shares the device's primary context with torch's: its errors are its own,
// never the program's.
//
//===----------------------------------------------------------------------===//
#include "DeviceStats.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <mutex>
#include <vector>

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
  Acc Block = Shared[0];
  __syncthreads(); // Shared may be used again
  return Block;
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

/// The statistics of \p X into \p Out. With several blocks each writes its
/// partials into \p Partials and counts itself in \p Counter (zero before);
/// the last one reduces them, and sets the counter back to zero.
template <typename T>
__global__ void __launch_bounds__(Threads)
    stats(const T *X, int64_t N, double *Partials, unsigned *Counter, double *Out) {
  Acc A = start();
  int64_t Stride = int64_t(gridDim.x) * Threads;
  for (int64_t I = int64_t(blockIdx.x) * Threads + threadIdx.x; I < N; I += Stride)
    add(A, load(X, I));
  A = reduceBlock(A);
  if (gridDim.x == 1) {
    if (threadIdx.x == 0)
      writeFinal(A, N, Out);
    return;
  }
  __shared__ bool Last;
  if (threadIdx.x == 0) {
    double *P = Partials + 6 * int64_t(blockIdx.x);
    P[0] = A.Sum;
    P[1] = A.SumSq;
    P[2] = A.Min;
    P[3] = A.Max;
    P[4] = A.Nan;
    P[5] = A.Inf;
    __threadfence(); // the partials before the count
    Last = atomicAdd(Counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!Last)
    return;
  __threadfence();
  Acc B = start();
  for (unsigned Block = threadIdx.x; Block < gridDim.x; Block += Threads) {
    const double *P = Partials + 6 * int64_t(Block);
    merge(B, Acc{__ldcg(P), __ldcg(P + 1), __ldcg(P + 2), __ldcg(P + 3), __ldcg(P + 4),
                 __ldcg(P + 5)});
  }
  B = reduceBlock(B);
  if (threadIdx.x == 0) {
    writeFinal(B, N, Out);
    *Counter = 0;
  }
}

__global__ void zero(unsigned *P, unsigned N) {
  for (unsigned I = blockIdx.x * blockDim.x + threadIdx.x; I < N; I += gridDim.x * blockDim.x)
    P[I] = 0;
}

int blocksFor(int64_t N) {
  int64_t Blocks = (N + Threads * PerThread - 1) / (Threads * PerThread);
  return int(Blocks < 1 ? 1 : Blocks > MaxBlocks ? MaxBlocks : Blocks);
}

template <typename T>
int launch(const void *Data, int64_t N, double *Scratch, unsigned *Counter, double *Out,
           cudaStream_t Stream) {
  int Blocks = blocksFor(N);
  stats<T><<<Blocks, Threads, 0, Stream>>>(static_cast<const T *>(Data), N, Scratch, Counter,
                                             Out);
  return cudaGetLastError();
}

int launch(DeviceStatsType Type, const void *Data, int64_t N, double *Scratch, unsigned *Counter,
           double *Out, cudaStream_t S) {
  switch (Type) {
  case DeviceStatsType::F32: return launch<float>(Data, N, Scratch, Counter, Out, S);
  case DeviceStatsType::F64: return launch<double>(Data, N, Scratch, Counter, Out, S);
  case DeviceStatsType::F16: return launch<__half>(Data, N, Scratch, Counter, Out, S);
  case DeviceStatsType::BF16: return launch<__nv_bfloat16>(Data, N, Scratch, Counter, Out, S);
  }
  return cudaErrorInvalidValue;
}

/// A device's slots of pinned memory for results (eight doubles each, six
/// used), their counters in device memory, and idle events. A slot is
/// taken at the launch and freed once its result was read, so that a
/// kernel never writes into a slot that is being read.
struct Ring {
  static constexpr unsigned Slots = 4096;
  std::mutex Mutex;
  bool Tried = false, Usable = false;
  double *Host = nullptr, *DeviceView = nullptr;
  unsigned *Counters = nullptr;
  std::vector<uint32_t> Free;
  std::vector<cudaEvent_t> Events;
};

constexpr int MaxDevices = 64;
/// Never destroyed: a writer's thread may wait on a ring during exit.
Ring *const Rings = new Ring[MaxDevices];

/// Sets up \p R at its device's first statistics, on \p Stream (the
/// counters are zeroed there, and waited for, once).
bool setUp(Ring &R, cudaStream_t Stream) {
  void *Host = nullptr, *View = nullptr, *Counters = nullptr;
  bool Ok = cudaHostAlloc(&Host, Ring::Slots * 8 * sizeof(double),
                          cudaHostAllocMapped | cudaHostAllocPortable) == cudaSuccess &&
            cudaHostGetDevicePointer(&View, Host, 0) == cudaSuccess &&
            cudaMalloc(&Counters, Ring::Slots * sizeof(unsigned)) == cudaSuccess;
  if (Ok) {
    zero<<<4, Threads, 0, Stream>>>(static_cast<unsigned *>(Counters), Ring::Slots);
    Ok = cudaGetLastError() == cudaSuccess && cudaStreamSynchronize(Stream) == cudaSuccess;
  }
  if (!Ok) {
    cudaGetLastError();
    if (Counters)
      cudaFree(Counters);
    if (Host)
      cudaFreeHost(Host);
    return false;
  }
  R.Host = static_cast<double *>(Host);
  R.DeviceView = static_cast<double *>(View);
  R.Counters = static_cast<unsigned *>(Counters);
  for (uint32_t Slot = Ring::Slots; Slot-- > 0;)
    R.Free.push_back(Slot);
  return true;
}

} // namespace

int64_t deviceStatsScratch(int64_t N) {
  int Blocks = blocksFor(N);
  return Blocks == 1 ? 0 : 6 * int64_t(Blocks);
}

bool enqueueDeviceStats(int Device, DeviceStatsType Type, const void *Data, int64_t N,
                        double *Scratch, void *Stream, DeviceStatsTicket &Ticket) {
  if (Device < 0 || Device >= MaxDevices)
    return false;
  Ring &R = Rings[Device];
  cudaStream_t S = static_cast<cudaStream_t>(Stream);
  uint32_t Slot;
  cudaEvent_t Event = nullptr;
  {
    std::lock_guard<std::mutex> Lock(R.Mutex);
    if (!R.Tried) {
      R.Tried = true;
      R.Usable = setUp(R, S);
    }
    if (!R.Usable || R.Free.empty())
      return false;
    Slot = R.Free.back();
    R.Free.pop_back();
    if (!R.Events.empty()) {
      Event = R.Events.back();
      R.Events.pop_back();
    }
  }
  auto GiveBack = [&] {
    std::lock_guard<std::mutex> Lock(R.Mutex);
    R.Free.push_back(Slot);
    if (Event)
      R.Events.push_back(Event);
  };
  if (!Event && cudaEventCreateWithFlags(&Event, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    Event = nullptr;
    GiveBack();
    return false;
  }
  if (launch(Type, Data, N, Scratch, R.Counters + Slot, R.DeviceView + 8 * size_t(Slot), S) !=
      cudaSuccess) {
    cudaGetLastError(); // nothing was enqueued (a GPU the kernel was not built for)
    GiveBack();
    return false;
  }
  if (cudaEventRecord(Event, S) != cudaSuccess) {
    // The kernel will write the slot: it is not given back.
    cudaGetLastError();
    cudaEventDestroy(Event);
    return false;
  }
  Ticket = {Device, Slot, Event};
  return true;
}

bool awaitDeviceStats(const DeviceStatsTicket &Ticket, double Values[6]) {
  Ring &R = Rings[Ticket.Device];
  cudaEvent_t Event = static_cast<cudaEvent_t>(Ticket.Event);
  bool Ok = cudaEventSynchronize(Event) == cudaSuccess;
  if (Ok) {
    const volatile double *Slot = R.Host + 8 * size_t(Ticket.Slot);
    for (int I = 0; I < 6; ++I)
      Values[I] = Slot[I];
  } else {
    cudaGetLastError();
  }
  std::lock_guard<std::mutex> Lock(R.Mutex);
  R.Free.push_back(Ticket.Slot);
  R.Events.push_back(Event);
  return Ok;
}

} // namespace ekka
