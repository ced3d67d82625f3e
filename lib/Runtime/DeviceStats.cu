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
#include "DeviceStatsMath.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <mutex>
#include <vector>

namespace ekka {

namespace {

using namespace devicestats;

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

/// The kernel's parameters: the tensors of one launch.
struct Batch {
  const void *Data[MaxItems];
  int64_t N[MaxItems];
  uint32_t FirstBlock[MaxItems + 1]; ///< planBlocks'
  uint32_t Slot[MaxItems];           ///< Each tensor's slot of the ring.
  /// A tensor of several blocks: where its blocks' partials go in the
  /// ring's arena, in blocks.
  uint32_t PartialsAt[MaxItems];
  uint8_t Type[MaxItems];            ///< DeviceStatsType
  int Count;
};

static_assert(sizeof(Batch) + 3 * sizeof(void *) <= 4096,
              "the kernel's parameters must fit the 4 KB every GPU takes");

/// This thread's elements of \p X: block \p Local of \p Blocks, the
/// elements grid-strided.
template <typename T>
__device__ Acc accumulate(const void *X, int64_t N, unsigned Local, unsigned Blocks) {
  const T *Y = static_cast<const T *>(X);
  Acc A = start();
  int64_t Stride = int64_t(Blocks) * Threads;
  for (int64_t I = int64_t(Local) * Threads + threadIdx.x; I < N; I += Stride)
    add(A, load(Y, I));
  return A;
}

/// The statistics of each tensor of \p B into its slot of \p Results. A
/// tensor of several blocks has each block write its partials into its
/// run of \p Partials (six doubles a block) and count itself in its slot's
/// counter (zero before); its last block reduces them, and sets the
/// counter back to zero.
__global__ void __launch_bounds__(Threads)
    stats(const Batch B, double *Partials, unsigned *Counters, double *Results) {
  int Item = itemOfBlock(B.FirstBlock, B.Count, blockIdx.x);
  unsigned First = B.FirstBlock[Item];
  unsigned Blocks = B.FirstBlock[Item + 1] - First;
  unsigned Local = blockIdx.x - First;
  const void *X = B.Data[Item];
  int64_t N = B.N[Item];
  double *Out = Results + 8 * size_t(B.Slot[Item]);
  Acc A;
  switch (DeviceStatsType(B.Type[Item])) {
  case DeviceStatsType::F32: A = accumulate<float>(X, N, Local, Blocks); break;
  case DeviceStatsType::F64: A = accumulate<double>(X, N, Local, Blocks); break;
  case DeviceStatsType::F16: A = accumulate<__half>(X, N, Local, Blocks); break;
  default: A = accumulate<__nv_bfloat16>(X, N, Local, Blocks); break;
  }
  A = reduceBlock(A);
  if (Blocks == 1) {
    if (threadIdx.x == 0)
      finish(A, N, Out);
    return;
  }
  unsigned *Counter = Counters + B.Slot[Item];
  __shared__ bool Last;
  if (threadIdx.x == 0) {
    double *P = Partials + 6 * (int64_t(B.PartialsAt[Item]) + Local);
    P[0] = A.Sum;
    P[1] = A.SumSq;
    P[2] = A.Min;
    P[3] = A.Max;
    P[4] = A.Nan;
    P[5] = A.Inf;
    __threadfence(); // the partials before the count
    Last = atomicAdd(Counter, 1u) == Blocks - 1;
  }
  __syncthreads();
  if (!Last)
    return;
  __threadfence();
  Acc C = start();
  for (unsigned Block = threadIdx.x; Block < Blocks; Block += Threads) {
    const double *P = Partials + 6 * (int64_t(B.PartialsAt[Item]) + Block);
    merge(C, Acc{__ldcg(P), __ldcg(P + 1), __ldcg(P + 2), __ldcg(P + 3), __ldcg(P + 4),
                 __ldcg(P + 5)});
  }
  C = reduceBlock(C);
  if (threadIdx.x == 0) {
    finish(C, N, Out);
    *Counter = 0;
  }
}

/// A device's slots of pinned memory for results (eight doubles each, six
/// used), their counters in device memory, and idle events. A slot is
/// taken at the launch and freed once its result was read, so that a
/// kernel never writes into a slot that is being read.
struct Ring {
  static constexpr unsigned Slots = 1 << 16;
  /// Blocks' partials in flight at most (9.4 MB of device memory: two
  /// launches of the most tensors, each of the most blocks). Allocated once
  /// rather than per launch: a launch may come from inside the caching
  /// allocator's own critical section (CUPTI's callback for an event it
  /// records), where allocating through it again is not safe.
  static constexpr uint32_t ArenaBlocks = 2 * MaxItems * MaxBlocks;
  /// Set-ups tried and failed before the kernel is given up on this device.
  static constexpr int MaxTries = 3;
  std::mutex Mutex;
  int Failures = 0;
  bool Usable = false;
  const char *Why = nullptr; ///< The last set-up's error.
  double *Host = nullptr, *DeviceView = nullptr;
  unsigned *Counters = nullptr;
  double *Partials = nullptr;
  PartialsArena Arena{ArenaBlocks}; ///< Runs owned by launches' events.
  std::vector<uint32_t> Free;
  std::vector<cudaEvent_t> Events;
};

constexpr int MaxDevices = 64;
/// Never destroyed: a writer's thread may wait on a ring during exit.
Ring *const Rings = new Ring[MaxDevices];

/// Sets up \p R at its device's first statistics, on \p Stream (the
/// counters are zeroed there, and waited for, once). The kernel is
/// loaded now rather than at its first launch (CUDA loads modules
/// lazily), which also tells whether this GPU has an image of it.
cudaError_t setUp(Ring &R, cudaStream_t Stream) {
  void *Host = nullptr, *View = nullptr, *Counters = nullptr, *Partials = nullptr;
  cudaFuncAttributes Attributes;
  cudaError_t E = cudaFuncGetAttributes(&Attributes, stats);
  if (!E)
    E = cudaHostAlloc(&Host, Ring::Slots * 8 * sizeof(double),
                      cudaHostAllocMapped | cudaHostAllocPortable);
  if (!E)
    E = cudaHostGetDevicePointer(&View, Host, 0);
  if (!E)
    E = cudaMalloc(&Counters, Ring::Slots * sizeof(unsigned));
  if (!E)
    E = cudaMalloc(&Partials, size_t(Ring::ArenaBlocks) * 6 * sizeof(double));
  if (!E)
    E = cudaMemsetAsync(Counters, 0, Ring::Slots * sizeof(unsigned), Stream);
  if (!E)
    E = cudaStreamSynchronize(Stream);
  if (E) {
    cudaGetLastError();
    if (Partials)
      cudaFree(Partials);
    if (Counters)
      cudaFree(Counters);
    if (Host)
      cudaFreeHost(Host);
    return E;
  }
  R.Host = static_cast<double *>(Host);
  R.DeviceView = static_cast<double *>(View);
  R.Counters = static_cast<unsigned *>(Counters);
  R.Partials = static_cast<double *>(Partials);
  for (uint32_t Slot = Ring::Slots; Slot-- > 0;)
    R.Free.push_back(Slot);
  return cudaSuccess;
}

} // namespace

bool prepareDeviceStats(int Device, void *Stream) {
  if (Device < 0 || Device >= MaxDevices)
    return false;
  Ring &R = Rings[Device];
  std::lock_guard<std::mutex> Lock(R.Mutex);
  if (!R.Usable && R.Failures < Ring::MaxTries) {
    // Its allocations and its synchronisation, once, in thread-local
    // capture mode: made while another thread captures a graph in global
    // mode, they would fail and invalidate that capture (the program's).
    // This thread's own stream is not capturing: then nothing is read back.
    cudaStreamCaptureMode Mode = cudaStreamCaptureModeThreadLocal;
    bool Swapped = cudaThreadExchangeStreamCaptureMode(&Mode) == cudaSuccess;
    if (Swapped && Mode == cudaStreamCaptureModeRelaxed) { // laxer still: kept
      cudaThreadExchangeStreamCaptureMode(&Mode);
      Swapped = false;
    }
    cudaError_t E = setUp(R, static_cast<cudaStream_t>(Stream));
    if (Swapped)
      cudaThreadExchangeStreamCaptureMode(&Mode);
    R.Usable = E == cudaSuccess;
    if (!R.Usable) {
      ++R.Failures;
      R.Why = cudaGetErrorString(E);
    }
  }
  return R.Usable;
}

bool enqueueDeviceStats(int Device, const DeviceStatsItem *Items, int Count, void *Stream,
                        DeviceStatsTicket &Ticket) {
  if (Device < 0 || Device >= MaxDevices || Count < 1 || Count > MaxItems)
    return false;
  Ring &R = Rings[Device];
  cudaStream_t S = static_cast<cudaStream_t>(Stream);
  Batch B;
  B.Count = Count;
  int64_t Sizes[MaxItems];
  uint32_t PartialBlocks = 0; // the blocks of the tensors of several
  for (int I = 0; I < Count; ++I) {
    B.Data[I] = Items[I].Data;
    B.N[I] = Sizes[I] = Items[I].N;
    B.Type[I] = uint8_t(Items[I].Type);
    B.PartialsAt[I] = 0;
    if (int Blocks = blocksFor(Sizes[I]); Blocks > 1)
      PartialBlocks += uint32_t(Blocks);
  }
  std::vector<uint32_t> Slots;
  cudaEvent_t Event = nullptr;
  std::optional<uint32_t> At;
  {
    std::lock_guard<std::mutex> Lock(R.Mutex);
    if (!R.Usable || R.Free.size() < size_t(Count))
      return false;
    if (!R.Events.empty()) {
      Event = R.Events.back();
      R.Events.pop_back();
    }
  }
  if (!Event && cudaEventCreateWithFlags(&Event, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  {
    std::lock_guard<std::mutex> Lock(R.Mutex);
    if (R.Free.size() < size_t(Count)) {
      R.Events.push_back(Event);
      return false;
    }
    Slots.assign(R.Free.end() - Count, R.Free.end());
    R.Free.resize(R.Free.size() - Count);
    At = R.Arena.take(PartialBlocks, Event);
  }
  // No room in the arena (launches in flight hold it, until the writer's
  // thread has read them): never waited for here (this may be inside the
  // program's capture, or the allocator's lock). The partials go into
  // memory of the stream's own, freed in its order after the kernel
  // (CUDA's pool, not PyTorch's allocator); without that, each tensor is
  // computed in one block, its sums in another order.
  double *Partials = R.Partials, *Own = nullptr;
  if (!At && cudaMallocAsync(reinterpret_cast<void **>(&Own), size_t(PartialBlocks) * 6 *
                                                                   sizeof(double),
                             S) == cudaSuccess) {
    Partials = Own;
    At = 0;
  }
  cudaGetLastError(); // that error, or any left before: not the launch's
  uint32_t Blocks = planBlocks(Sizes, Count, B.FirstBlock, /*OneEach=*/!At);
  for (int I = 0; I < Count; ++I) {
    B.Slot[I] = Slots[I];
    if (At && blocksFor(Sizes[I]) > 1) {
      B.PartialsAt[I] = *At;
      *At += uint32_t(blocksFor(Sizes[I]));
    }
  }
  stats<<<Blocks, Threads, 0, S>>>(B, Partials, R.Counters, R.DeviceView);
  bool Launched = cudaGetLastError() == cudaSuccess;
  if (Own)
    cudaFreeAsync(Own, S);
  if (!Launched) {
    // Nothing was enqueued (a GPU the kernel was not built for).
    std::lock_guard<std::mutex> Lock(R.Mutex);
    R.Free.insert(R.Free.end(), Slots.begin(), Slots.end());
    R.Arena.give(Event);
    R.Events.push_back(Event);
    return false;
  }
  if (cudaEventRecord(Event, S) != cudaSuccess) {
    // The kernel will write the slots and the partials: they stay taken.
    cudaGetLastError();
    return false;
  }
  Ticket.Device = Device;
  Ticket.Slots = std::move(Slots);
  Ticket.Event = Event;
  return true;
}

const char *deviceStatsUnavailable() {
  for (int D = 0; D < MaxDevices; ++D) {
    std::lock_guard<std::mutex> Lock(Rings[D].Mutex);
    if (!Rings[D].Usable && Rings[D].Why)
      return Rings[D].Why;
  }
  return nullptr;
}

bool awaitDeviceStats(const DeviceStatsTicket &Ticket, double *Values) {
  Ring &R = Rings[Ticket.Device];
  cudaEvent_t Event = static_cast<cudaEvent_t>(Ticket.Event);
  bool Ok = cudaEventSynchronize(Event) == cudaSuccess;
  if (!Ok) {
    cudaGetLastError();
    // Not known to be done (a wait refused while this thread captures, a
    // device fault): its slots, partials and event stay taken.
    if (cudaEventQuery(Event) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
  }
  for (size_t I = 0; I < Ticket.Slots.size(); ++I) {
    const volatile double *Slot = R.Host + 8 * size_t(Ticket.Slots[I]);
    for (int J = 0; J < 6; ++J)
      Values[6 * I + J] = Slot[J];
  }
  std::lock_guard<std::mutex> Lock(R.Mutex);
  R.Free.insert(R.Free.end(), Ticket.Slots.begin(), Ticket.Slots.end());
  R.Arena.give(Event);
  R.Events.push_back(Event);
  return true;
}

} // namespace ekka
