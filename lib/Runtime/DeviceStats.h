//===- DeviceStats.h - A GPU tensor's statistics in one pass ----*- C++ -*-===//
//
// The statistics of every module output on a GPU were nine ATen reductions
// and a stack, each a kernel launch, plus a pinned buffer, a copy and an
// event: about 380 us of the program's time a tensor on an H200 machine,
// where each CUDA call costs several microseconds, which made a traced
// Llama forward 6x slower. Here they are one pass over the tensor in one
// kernel launch (the last block to finish sums the blocks' partials in a
// fixed order: the result does not depend on scheduling), written straight
// into a ring of pinned memory, and one event record from a pool.
//
// Built with nvcc when it is found (EKKA_HAVE_DEVICE_STATS); without it, or
// for a GPU the kernels were not built for, the ATen reductions remain.
// No CUDA header here: the runtime's C++ includes this.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_LIB_RUNTIME_DEVICESTATS_H
#define EKKA_LIB_RUNTIME_DEVICESTATS_H

#include <cstdint>

namespace ekka {

enum class DeviceStatsType { F32, F64, F16, BF16 };

/// Doubles of device scratch the statistics of \p N elements need (0: none).
int64_t deviceStatsScratch(int64_t N);

/// Statistics in flight: the slot of pinned memory that the kernel writes
/// and the event recorded after it.
struct DeviceStatsTicket {
  int Device = -1;
  uint32_t Slot = 0;
  void *Event = nullptr;
};

/// Sets the device's ring up at its first call (pinned slots, counters
/// zeroed on \p Stream and waited for, the kernels loaded; tried again
/// after a failure, three times at most). Whether the kernel can be used.
bool prepareDeviceStats(int Device, void *Stream);

/// Enqueues on \p Stream (a cudaStream_t of device \p Device, which is
/// current) the statistics of the \p N contiguous elements at \p Data: sum,
/// sum of squares, min and max (both skipping NaNs; NaN if all are), NaN
/// count and infinity count. One kernel, which writes the six doubles into a
/// slot of the device's ring of pinned memory (prepareDeviceStats first),
/// and an event from a pool.
/// \p Scratch holds deviceStatsScratch(N) doubles of device memory,
/// untouched until the kernel ran. False when nothing was enqueued (no free
/// slot, a GPU the kernel was not built for, a CUDA error): the caller
/// computes them otherwise.
bool enqueueDeviceStats(int Device, DeviceStatsType Type, const void *Data, int64_t N,
                        double *Scratch, void *Stream, DeviceStatsTicket &Ticket);

/// Waits for \p Ticket's kernel and gives its six doubles; frees the slot
/// and the event. Exactly once per ticket. False on a CUDA error (a fault
/// in the program's own kernels makes every later wait fail).
bool awaitDeviceStats(const DeviceStatsTicket &Ticket, double Values[6]);

/// Why the kernel could not be set up on a device, if it could not (a CUDA
/// error's description); else null.
const char *deviceStatsUnavailable();

} // namespace ekka

#endif
