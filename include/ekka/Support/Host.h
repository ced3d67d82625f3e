//===- Host.h - The machine a trace was recorded on -------------*- C++ -*-===//
//
// What a trace records of its machine (meta `host`): the CPU and the
// vector extensions that choose kernels. The same program picks other
// kernels on another CPU (vLLM's CPU attention: `vec` on AVX2, another
// with AVX-512), and they round otherwise: two traces of one program on two
// machines differ by that, and a diagnosis says so.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_SUPPORT_HOST_H
#define EKKA_SUPPORT_HOST_H

#include "llvm/ADT/StringRef.h"

#include <string>

namespace ekka {

/// "AMD EPYC; 2 CPUs; avx avx2 fma f16c" from /proc/cpuinfo's text: the
/// first processor's model name ("unknown CPU" without one), \p CPUs (0:
/// "an unknown number of CPUs"), and the extensions kernels are chosen by
/// that its flags (x86) or features (Arm) list, in a fixed order; "no
/// vector extensions known" where none.
std::string describeCpu(llvm::StringRef CpuInfo, unsigned CPUs);

/// describeCpu of this machine's /proc/cpuinfo and its hardware threads;
/// "unknown CPU; N CPUs; ..." where /proc/cpuinfo cannot be read.
std::string describeHostCpu();

} // namespace ekka

#endif
