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

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ekka {

/// How a launch names the function it runs, which decides how its
/// parameter layout is asked for.
enum class KernelHandle {
  None,     ///< Not known.
  Function, ///< A driver CUfunction (cuLaunchKernel, Triton).
  Kernel,   ///< A CUkernel (CUDA 13's __cudaLaunchKernel: cudaKernel_t).
  HostStub, ///< The host-side stub of a runtime launch (cudaLaunchKernel).
};

/// What CUPTI tells about one kernel launch.
struct KernelLaunch {
  /// The kernel's symbol, mangled, as CUPTI reports it: valid while the
  /// launch's callback runs (not copied: a launch is recorded with the
  /// name interned once per kernel).
  const char *Name = "";
  uint32_t Grid[3] = {0, 0, 0}, Block[3] = {0, 0, 0};
  uint64_t SharedMem = 0, Stream = 0, CorrelationId = 0;
  /// The function launched and its parameter values (`kernelParams`: one
  /// pointer to each parameter), when the launch passes them that way.
  KernelHandle HandleKind = KernelHandle::None;
  const void *Handle = nullptr;
  void *const *Params = nullptr;
  /// Or packed into one buffer (cuLaunchKernel's `extra`,
  /// CU_LAUNCH_PARAM_BUFFER_POINTER), at the offsets the driver reports.
  const void *ArgBuffer = nullptr;
  size_t ArgBufferSize = 0;
};

/// Where a kernel parameter lies in the packed argument buffer.
struct KernelParam {
  size_t Offset, Size;
};

/// A kernel parameter the size of a device pointer, and its value.
struct PointerArgument {
  uint32_t Index; ///< The parameter's position.
  uint64_t Value;
};

/// The pointer-sized parameters of a launch, given each parameter's size as
/// the driver reports it (cuFuncGetParamInfo): the candidates for device
/// buffers the kernel reads or writes.
std::vector<PointerArgument> pointerArguments(void *const *Params,
                                              const std::vector<size_t> &ParamSizes);
/// The same from a packed argument buffer of \p Bytes bytes.
std::vector<PointerArgument> pointerArguments(const void *ArgBuffer, size_t Bytes,
                                              const std::vector<KernelParam> &Layout);

/// Callback domains, as CUPTI numbers them.
enum class LaunchDomain : int { RuntimeApi = 1, DriverApi = 2 };

/// Whether callback \p Cbid of \p Domain launches a kernel: the runtime's
/// cudaLaunchKernel (and _ptsz), cudaLaunchKernelExC, CUDA 13's
/// __cudaLaunchKernel (505/506, which has no published parameter struct),
/// and the driver's cuLaunchKernel and cuLaunchKernelEx (Triton's path).
bool isLaunchCallback(LaunchDomain Domain, uint32_t Cbid);

/// Whether GPU statistics that wait for their launch must be launched
/// before the API call that CUPTI names \p CallbackName (its
/// cuptiGetCallbackName): one that may write to device memory other than
/// by a kernel launch — the copies and sets (cudaMemcpy*, cuMemsetD8Async,
/// ...), a CUDA graph's launch (whose kernels no launch callback reports),
/// the stream memory operations (cuStreamWriteValue32, cuStreamBatchMemOp)
/// — or one after which a launch would be captured into a graph
/// (cudaStreamBeginCapture).
bool precedesDeviceStatistics(const char *CallbackName);

/// Whether the API call that CUPTI names \p CallbackName orders device
/// work across streams or with the host: an event's record, a stream's
/// wait for an event or a value (cuStreamWaitValue32), a synchronisation of
/// a stream, an event, a context or the device. Work that the program puts after it on another stream is
/// ordered after what the first stream held then, and no later: GPU
/// statistics waiting on that stream are launched before it. (Queries are
/// not: the caching allocator polls events at every allocation.)
bool ordersDeviceWork(const char *CallbackName);

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
  /// At a launch callback's API exit: whether it ends a recorded launch
  /// (its kernel is then enqueued).
  bool exit(LaunchDomain Domain);
  /// Whether a recorded runtime launch is under way on this thread (a
  /// launch callback now is its own driver launch, or one nested in it).
  bool insideLaunch() const { return RuntimeDepth != 0; }

private:
  unsigned RuntimeDepth = 0;
};

} // namespace ekka

#endif
