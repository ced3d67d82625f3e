//===- DeviceStatsMath.h - The statistics kernel's arithmetic ---*- C++ -*-===//
//
// What DeviceStats.cu's kernel does with each element and each partial
// result, for the kernel and for the host alike, so that a unit test on a
// machine without a GPU checks the GPU's statistics against the CPU's
// (statsOfBytes): min and max skip NaNs, NaN if every element is one; the
// sums take NaNs and infinities in.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_LIB_RUNTIME_DEVICESTATSMATH_H
#define EKKA_LIB_RUNTIME_DEVICESTATSMATH_H

#include <cmath>
#include <cstdint>
#include <deque>
#include <optional>

#ifdef __CUDACC__
#define EKKA_HOST_DEVICE __host__ __device__
#else
#define EKKA_HOST_DEVICE
#endif

namespace ekka {
namespace devicestats {

/// Threads per block.
constexpr int Threads = 256;
/// At most this many blocks; a thread then takes more elements.
constexpr int MaxBlocks = 1024;
/// Elements a thread takes before a second block is worth its launch.
constexpr int64_t PerThread = 16;

/// The blocks the statistics of \p N elements are computed in.
EKKA_HOST_DEVICE inline int blocksFor(int64_t N) {
  int64_t Blocks = (N + Threads * PerThread - 1) / (Threads * PerThread);
  return int(Blocks < 1 ? 1 : Blocks > MaxBlocks ? MaxBlocks : Blocks);
}

/// Tensors one launch computes the statistics of, at most: their pointers,
/// sizes, blocks and slots are the kernel's parameters (2.8 KB of the 4 KB
/// every GPU takes).
constexpr int MaxItems = 96;

/// The grid of one launch for \p Count tensors of \p N elements each:
/// tensor I takes blocks FirstBlock[I] to FirstBlock[I + 1] - 1, as many
/// as blocksFor gives it alone, so that its statistics are added in the
/// same order as in a launch of its own; or, \p OneEach, one block (which
/// needs no room for partials). Returns the grid's size.
EKKA_HOST_DEVICE inline uint32_t planBlocks(const int64_t *N, int Count, uint32_t *FirstBlock,
                                            bool OneEach = false) {
  uint32_t Next = 0;
  for (int I = 0; I < Count; ++I) {
    FirstBlock[I] = Next;
    Next += OneEach ? 1u : uint32_t(blocksFor(N[I]));
  }
  FirstBlock[Count] = Next;
  return Next;
}

/// Room on the device for the partials of the tensors of several blocks in
/// flight, in blocks (six doubles each), handed out first in, first out: a
/// launch takes a contiguous run, which is free again once its kernel is
/// done, and the runs after it once theirs are. Never waits: a launch that
/// finds no room computes each tensor in one block instead.
class PartialsArena {
public:
  explicit PartialsArena(uint32_t Size) : Size(Size) {}
  /// Where \p N blocks of \p Owner's (a launch's: non-null, one run each
  /// at a time) go, if there is room; 0 without a run for \p N = 0.
  std::optional<uint32_t> take(uint32_t N, const void *Owner) {
    if (N == 0)
      return 0u;
    if (N > Size)
      return std::nullopt;
    uint32_t At = 0;
    if (!Flights.empty()) {
      uint32_t First = Flights.front().Begin, Last = Flights.back().End;
      if (Last > First) { // free: [Last, Size) and [0, First)
        if (Size - Last >= N)
          At = Last;
        else if (First >= N)
          At = 0;
        else
          return std::nullopt;
      } else if (First - Last >= N) { // wrapped around: free [Last, First)
        At = Last;
      } else {
        return std::nullopt;
      }
    }
    Flights.push_back({Owner, At, At + N, false});
    return At;
  }
  /// \p Owner's run is free: its kernel is done (or never ran).
  void give(const void *Owner) {
    for (Flight &F : Flights)
      if (!F.Done && F.Owner == Owner) {
        F.Done = true;
        break;
      }
    while (!Flights.empty() && Flights.front().Done)
      Flights.pop_front();
  }
  /// Blocks in runs not yet free, or behind one.
  uint32_t used() const {
    if (Flights.empty())
      return 0;
    uint32_t First = Flights.front().Begin, Last = Flights.back().End;
    return Last > First ? Last - First : Size - First + Last;
  }

private:
  struct Flight {
    const void *Owner;
    uint32_t Begin, End;
    bool Done;
  };
  uint32_t Size;
  std::deque<Flight> Flights;
};

/// The tensor that block \p Block of the grid planBlocks planned works on:
/// the last I with FirstBlock[I] <= Block (every tensor has a block).
EKKA_HOST_DEVICE inline int itemOfBlock(const uint32_t *FirstBlock, int Count, uint32_t Block) {
  int Low = 0, High = Count - 1;
  while (Low < High) {
    int Mid = (Low + High + 1) / 2;
    if (FirstBlock[Mid] <= Block)
      Low = Mid;
    else
      High = Mid - 1;
  }
  return Low;
}

/// A running sum, sum of squares, min and max of the non-NaN elements, and
/// the NaN and infinity counts (as doubles: exact below 2^53).
struct Acc {
  double Sum, SumSq, Min, Max, Nan, Inf;
};

EKKA_HOST_DEVICE inline Acc start() {
  return {0.0, 0.0, double(INFINITY), -double(INFINITY), 0.0, 0.0};
}

EKKA_HOST_DEVICE inline void add(Acc &A, double V) {
  A.Sum += V;
  A.SumSq += V * V;
  if (V != V) {
    A.Nan += 1;
    return;
  }
  if (V == double(INFINITY) || V == -double(INFINITY))
    A.Inf += 1;
  A.Min = V < A.Min ? V : A.Min;
  A.Max = V > A.Max ? V : A.Max;
}

EKKA_HOST_DEVICE inline void merge(Acc &A, const Acc &B) {
  A.Sum += B.Sum;
  A.SumSq += B.SumSq;
  A.Min = B.Min < A.Min ? B.Min : A.Min;
  A.Max = B.Max > A.Max ? B.Max : A.Max;
  A.Nan += B.Nan;
  A.Inf += B.Inf;
}

/// The six doubles of the trace's statistics of \p N elements, from their
/// accumulator: sum, sum of squares, min, max, NaN count, infinity count.
EKKA_HOST_DEVICE inline void finish(const Acc &A, int64_t N, double *Out) {
  bool AllNan = A.Nan == double(N);
  Out[0] = A.Sum;
  Out[1] = A.SumSq;
  Out[2] = AllNan ? double(NAN) : A.Min;
  Out[3] = AllNan ? double(NAN) : A.Max;
  Out[4] = A.Nan;
  Out[5] = A.Inf;
}

} // namespace devicestats
} // namespace ekka

#endif
