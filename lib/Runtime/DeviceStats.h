//===- DeviceStats.h - A GPU tensor's statistics in one pass ----*- C++ -*-===//
//
// The statistics of every module output on a GPU were nine ATen reductions
// and a stack, each a kernel launch (about 250 us a tensor on an H200
// machine, which made a traced Llama forward 6x slower). Here they are one
// pass over the tensor in one kernel, two for a large tensor (per-block
// partials, then their sum in a fixed order: the result does not depend on
// scheduling), written straight into pinned host memory.
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

/// Enqueues on \p Stream (a cudaStream_t of the current device) the
/// statistics of the \p N contiguous elements at \p Data: sum, sum of
/// squares, min and max (both skipping NaNs; NaN if all are), NaN count and
/// infinity count, as six doubles at \p Out, which the device can write
/// (see deviceAddress). \p Scratch holds deviceStatsScratch(N) doubles of
/// device memory, untouched until the kernels ran. Returns 0, or the CUDA
/// error of the launch (nothing was enqueued then: the caller falls back).
int launchDeviceStats(DeviceStatsType Type, const void *Data, int64_t N, double *Scratch,
                      double *Out, void *Stream);

/// The device's address of pinned host memory \p Host, or null where it
/// has none (the caller copies instead).
double *deviceAddress(void *Host);

} // namespace ekka

#endif
