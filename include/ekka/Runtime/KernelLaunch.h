//===- KernelLaunch.h - Kernel launches as CUPTI reports them --*- C++ -*-===//
//
// The part of GPU kernel tracing that needs no GPU: decoding the parameters of
// CUPTI's launch callbacks, and telling a launch the program made from the
// driver launch the CUDA runtime makes for it. The CUPTI subscriber in the
// runtime feeds it; unit tests feed it synthetic callback data.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_RUNTIME_KERNELLAUNCH_H
#define EKKA_RUNTIME_KERNELLAUNCH_H

#include <cstdint>
#include <optional>
#include <string>

namespace ekka {

/// What CUPTI tells about one kernel launch.
struct KernelLaunch {
  std::string Name; ///< The kernel's symbol, mangled, as CUPTI reports it.
  uint32_t Grid[3] = {0, 0, 0}, Block[3] = {0, 0, 0};
  uint64_t SharedMem = 0, Stream = 0, CorrelationId = 0;
};

/// Callback domains, as CUPTI numbers them.
enum class LaunchDomain : int { RuntimeApi = 1, DriverApi = 2 };

/// Whether callback \p Cbid of \p Domain launches a kernel: the runtime's
/// cudaLaunchKernel (and _ptsz), cudaLaunchKernelExC, CUDA 13's
/// __cudaLaunchKernel (505/506, which has no published parameter struct),
/// and the driver's cuLaunchKernel and cuLaunchKernelEx (Triton's path).
bool isLaunchCallback(LaunchDomain Domain, uint32_t Cbid);

/// Decodes a launch callback's `functionParams`; nullopt for other callbacks.
std::optional<KernelLaunch> decodeLaunch(LaunchDomain Domain, uint32_t Cbid,
                                         const void *FunctionParams,
                                         const char *SymbolName, uint32_t CorrelationId);

/// A runtime launch calls the driver's launch underneath, and CUPTI reports
/// both: this keeps one record per kernel. Per thread; enter/exit in the
/// order CUPTI calls back.
class LaunchDeduplicator {
public:
  /// At a launch callback's API entry: whether to record this launch.
  bool enter(LaunchDomain Domain);
  void exit(LaunchDomain Domain);

private:
  unsigned RuntimeDepth = 0;
};

} // namespace ekka

#endif
