//===- SessionInternal.h - Between the session and the CUPTI tracer -*- C++ -*-===//
#ifndef EKKA_LIB_RUNTIME_SESSIONINTERNAL_H
#define EKKA_LIB_RUNTIME_SESSIONINTERNAL_H

#include "ekka/Runtime/KernelLaunch.h"

#include <string>

namespace ekka {

/// Records a kernel launch under the op and module call open on this thread.
void recordKernelLaunch(const KernelLaunch &Launch);

/// Subscribes to CUPTI's launch callbacks through the libcupti at \p Path.
/// Returns what `meta.gpu_kernels` should say: "traced", or "not traced: "
/// and why (another subscriber, a library that does not load, ...).
std::string startKernelTracing(const std::string &Path);
void stopKernelTracing();

} // namespace ekka

#endif
