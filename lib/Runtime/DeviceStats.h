//===- DeviceStats.h - A GPU tensor's statistics in one pass ----*- C++ -*-===//
//
// The statistics of every module output on a GPU were nine ATen reductions
// and a stack, each a kernel launch, plus a pinned buffer, a copy and an
// event: about 380 us of the program's time a tensor on an H200 machine,
// where each CUDA call costs several microseconds, which made a traced
// Llama forward 6x slower. Here they are one pass over each tensor, for up
// to devicestats::MaxItems tensors in one kernel launch (for each tensor,
// the last of its blocks to finish sums its blocks' partials in a fixed
// order: the result depends neither on scheduling nor on the other tensors
// of the launch), written straight into a ring of pinned memory, and one
// event record from a pool for the launch.
//
// Built with nvcc when it is found (EKKA_HAVE_DEVICE_STATS); without it, or
// for a GPU the kernels were not built for, the ATen reductions remain.
// No CUDA header here: the runtime's C++ includes this.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_LIB_RUNTIME_DEVICESTATS_H
#define EKKA_LIB_RUNTIME_DEVICESTATS_H

#include <cstdint>
#include <vector>

namespace ekka {

enum class DeviceStatsType { F32, F64, F16, BF16 };

/// One tensor of a launch: \p N contiguous elements of type \p Type at
/// \p Data, in device memory.
struct DeviceStatsItem {
  DeviceStatsType Type = DeviceStatsType::F32;
  const void *Data = nullptr;
  int64_t N = 0;
};

/// Statistics in flight: the slots of pinned memory that the kernel writes,
/// one a tensor, and the event recorded after it.
struct DeviceStatsTicket {
  int Device = -1;
  std::vector<uint32_t> Slots;
  void *Event = nullptr;
};

/// Sets the device's ring up at its first call (pinned slots, counters
/// zeroed on \p Stream and waited for, the kernels loaded; tried again
/// after a failure, three times at most). Whether the kernel can be used.
bool prepareDeviceStats(int Device, void *Stream);

/// Enqueues on \p Stream (a cudaStream_t of device \p Device, which is
/// current) the statistics of \p Count tensors (1 to devicestats::MaxItems):
/// for each, sum, sum of squares, min and max (both skipping NaNs; NaN if
/// all are), NaN count and infinity count. One kernel, which writes each
/// tensor's six doubles into a slot of the device's ring of pinned memory
/// (prepareDeviceStats first), and an event from a pool.
/// A tensor of several blocks has its blocks' partial results in a run of
/// the device's arena, free again once the kernel was waited for; where
/// launches in flight hold all of it, in memory from CUDA's stream-ordered
/// pool, freed after the kernel; failing that, each tensor is computed in
/// one block (its sums in another order).
/// Allocates nothing and waits for nothing: it may be called from inside
/// the caching allocator's critical section, or during the program's
/// capture of a graph on another stream. False when nothing was enqueued
/// (not enough free slots, a GPU the kernel was not built for, a CUDA
/// error): those tensors go without statistics.
bool enqueueDeviceStats(int Device, const DeviceStatsItem *Items, int Count, void *Stream,
                        DeviceStatsTicket &Ticket);

/// Waits for \p Ticket's kernel and gives each tensor's six doubles, in
/// the launch's order, into \p Values (6 per tensor); frees the slots, the
/// partials and the event. Exactly once per ticket. False on a CUDA error (a
/// fault in the program's own kernels makes every later wait fail): then
/// what the kernel may still write stays taken.
bool awaitDeviceStats(const DeviceStatsTicket &Ticket, double *Values);

/// Why the kernel could not be set up on a device, if it could not (a CUDA
/// error's description); else null.
const char *deviceStatsUnavailable();

} // namespace ekka

#endif
