//===- TensorRecording.h - From at::Tensor to a trace record ---*- C++ -*-===//
#ifndef EKKA_LIB_RUNTIME_TENSORRECORDING_H
#define EKKA_LIB_RUNTIME_TENSORRECORDING_H

#include "ekka/Trace/TraceFormat.h"
#include "ekka/Trace/TraceWriter.h"

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/GradMode.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ekka {

/// The trace dtype of a tensor, if the trace can hold it.
std::optional<DType> traceDType(const at::Tensor &T);
/// \p T with its negation and conjugation bits applied to its values (a
/// new tensor), where it has them: what reading its memory gives otherwise
/// is not what the program computes with.
at::Tensor logicalValues(const at::Tensor &T);
/// logicalValues, and a complex tensor as its parts (torch.view_as_real):
/// what statistics are computed over.
at::Tensor realValues(const at::Tensor &T);
/// How many values statistics are over: a complex tensor's parts, a
/// float4_e2m1fn_x2 tensor's 4-bit elements (two to its element).
int64_t valueCount(const at::Tensor &T);
/// While it lives, the ATen ops this library runs on the program's tensors
/// (copies, reductions) are its own: not recorded (RecordFunction: the op
/// observer, a profiler), not in autograd, and not seen by the program's
/// TorchDispatchMode (a logging mode would list them as the program's). A
/// tensor subclass that Python dispatches is never read here.
struct OwnOps {
  at::RecordFunctionGuard NoRecord{false};
  c10::NoGradGuard NoGrad;
  c10::impl::ExcludeDispatchKeyGuard NoModes{
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot})};
};

/// Shape, strides, dtype and device of \p T into \p R.
bool describeTensor(const at::Tensor &T, TensorRecord &R);
/// `cpu`, `cuda:0`: a device's name, made once per device and thread
/// (c10::Device::str() builds it anew, at every op's every tensor). Valid
/// until the thread's next call.
std::string_view deviceName(c10::Device D);
/// For a sparse (COO, CSR, CSC, BSR, BSC), nested (strided) or quantized
/// tensor, which describeTensor does not take: its layout, dtype, shape
/// and device into \p R (no strides; a nested tensor's shape is its
/// values' count), and, given \p Values, what its statistics are of: a
/// strided tensor of its stored values (a sparse one's coalesced, a nested
/// one's parts' flattened one after another, a quantized one's
/// dequantized), and \p Zeros, the elements a sparse tensor does not
/// store. False for others, and for a tensor subclass that Python
/// dispatches (reading it would run Python: torch.nested's jagged layout,
/// which jaggedValues reads).
bool describeValues(const at::Tensor &T, TensorRecord &R, at::Tensor *Values, int64_t &Zeros);
/// Whether \p T is a jagged nested tensor (torch.nested's layout=torch.jagged),
/// asked without running Python.
bool isJagged(const at::Tensor &T);
/// A jagged nested tensor's packed values (its sequences one after another
/// along the ragged dimension), a strided tensor that shares its memory.
/// Undefined for any other tensor; for one with holes (its packed values
/// hold more than its sequences); under a TorchDispatchMode of the
/// program's (which would see the question); or where asking fails. The
/// tensor is a subclass that Python dispatches: the question runs its
/// Python (taking the GIL), so it is asked of module calls' tensors only,
/// outside ops.
at::Tensor jaggedValues(const at::Tensor &T);
/// \p S, the statistics of some values, with \p Zeros zeros more.
TensorStats withZeros(TensorStats S, int64_t Zeros);
/// The statistics from six doubles in their order in the trace: sum, sum
/// of squares, min, max, NaN count, infinity count.
TensorStats statsOfDoubles(const double *V);
/// Sum, sum of squares, min, max (in double precision) and NaN/Inf counts.
TensorStats tensorStats(const at::Tensor &T);
/// A tensor's statistics, known, or to be computed later from the tensor
/// itself (no copy) by whichever thread gets there first: the trace
/// writer's, or a program's thread about to write to the tensor in place
/// (DeferredStatsQueue::beforeWrite); or, for a GPU tensor, read back from
/// the device by the first record that needs them (another record of the
/// same tensor, unchanged, shares them). Settled once computed.
class DeferredStats {
public:
  explicit DeferredStats(std::optional<TensorStats> Known);
  /// For a contiguous CPU tensor of dtype \p Type, held until released.
  /// Statistics that cannot be computed are counted in \p Unavailable.
  DeferredStats(at::Tensor T, DType Type, std::atomic<int64_t> &Unavailable);
  /// Computed by \p Later (on a GPU: waiting for the device's read-back).
  explicit DeferredStats(std::function<std::optional<TensorStats>()> Later);
  /// Computes the statistics here unless another thread does or did (then
  /// waits for it); returns them. None if the tensor's memory is no longer
  /// where it was when it was handed over (its storage was resized or moved
  /// outside PyTorch's ops): then nothing is read.
  const std::optional<TensorStats> &resolve();
  /// The statistics, if they are settled.
  const std::optional<TensorStats> *settled() const;
  const c10::StorageImpl *storage() const { return Storage; }
  uint64_t bytes() const { return Bytes; }
  /// Drops the tensor; only once settled.
  void release() { Tensor.reset(); }

private:
  enum : int { Pending, Computing, Settled };
  std::atomic<int> State;
  at::Tensor Tensor;
  const c10::StorageImpl *Storage = nullptr;
  /// Where the bytes were when handed over, and the storage's extent then.
  const char *Data = nullptr;
  const void *StorageData = nullptr;
  size_t StorageBytes = 0;
  uint64_t Bytes = 0;
  DType Type = DType::F32;
  std::atomic<int64_t> *Unavailable = nullptr;
  std::function<std::optional<TensorStats>()> Later;
  std::optional<TensorStats> Stats;
};

/// The CPU tensors whose statistics are computed later, on the writer's
/// thread, so that the program's thread only hands them over (the session
/// hands over outputs only: what ops just wrote). What makes
/// that sound: every write to a tensor through PyTorch's dispatcher is an
/// op whose schema marks the argument written, and the session's op
/// observer calls beforeWrite() at such an op's start, which settles the
/// statistics of every held tensor sharing its storage first. (A write that
/// bypasses the dispatcher — through a NumPy view, a C extension's raw
/// pointer, code torch.compile generated — between a module's return and
/// the writer's turn would be seen in the statistics; PyTorch's own version
/// counter misses most of those too.) Tensors are released on a program's
/// thread only: releasing the last reference of a tensor whose Python
/// object it keeps alive takes the GIL, which the writer must never wait for.
class DeferredStatsQueue {
public:
  /// A deferred computation for \p T; null when it is cheaper to compute
  /// them now (a small or non-contiguous tensor, one not in host memory, a
  /// negated or conjugated view) or too many bytes are held already.
  std::shared_ptr<DeferredStats> defer(const at::Tensor &T);
  /// Before an op writes to \p T: settles the statistics of the tensors
  /// held that share its storage.
  void beforeWrite(const at::Tensor &T);
  /// Whether any tensor is held (a relaxed read, for the hot path).
  bool holding() const { return Count.load(std::memory_order_relaxed) != 0; }
  /// Settles everything held (before the observer stops watching writes).
  void settleAll();
  /// Takes no more tensors (tracing stops).
  void stop();
  /// Releases the settled tensors. On a program's thread, outside ops (a
  /// module call's entry, the end of tracing): a release may take the GIL.
  void releaseSettled();
  /// Statistics that could not be computed (resolve()), for the trace's meta.
  int64_t unavailable() const { return Unavailable.load(); }

  /// Smaller tensors' statistics are computed at once: handing them over
  /// would cost about as much.
  static constexpr uint64_t MinBytes = 64 << 10;
  /// Past this many bytes held, statistics are computed at once.
  static constexpr uint64_t MaxHeldBytes = uint64_t(256) << 20;

private:
  std::mutex Mutex;
  std::deque<std::shared_ptr<DeferredStats>> Held;
  std::atomic<size_t> Count{0};
  uint64_t HeldBytes = 0; ///< Under Mutex.
  bool Stopped = false;   ///< Under Mutex.
  std::atomic<int64_t> Unavailable{0};
};

/// A contiguous CPU copy of \p T's bytes, into \p Out (whose memory is
/// reused where it is large enough): what it holds now, even if an op later
/// changes it in place.
void tensorBytes(const at::Tensor &T, std::string &Out);

/// How a session's GPU tensors' statistics were read back, for the
/// trace's meta `gpu_statistics`: by this library's own kernel, or by
/// ATen's reductions (other element types, a GPU the kernel was not built
/// for, a runtime built without nvcc).
struct DeviceStatsCounts {
  std::atomic<int64_t> ByKernel{0}, ByReductions{0};
  /// The kernel's launches, for ByKernel tensors.
  std::atomic<int64_t> KernelLaunches{0};
  /// Empty when there were none.
  std::string describe() const;
};

/// The GPU tensors whose statistics this library's kernel computes, several
/// in one launch: a launch and an event record cost the program 10-45 us
/// each on an H200 machine, so one launch for a forward's module outputs
/// instead of one for each saves most of what the statistics cost there.
///
/// A tensor is handed over when a module or op returns it, or a module is
/// given it; its statistics are enqueued, in the order of the stream
/// current then, before anything can write to it, which is before
/// whichever comes first of:
/// - an op that writes to its storage: the session's op observer calls
///   beforeWrite() at the start of every op whose schema marks an argument
///   written (`Tensor(a!)`), as for the CPU's DeferredStatsQueue;
/// - a kernel launched outside any op (a Triton kernel called from Python,
///   NCCL through ctypes, code torch.compile generated), which CUPTI's
///   launch callback sees before the launch: the session hands tensors
///   over only while it traces kernels;
/// - the end of the root module's forward, the end of tracing, an exec;
/// - MaxItems tensors or MaxUnlaunchedBytes waiting;
/// - the trace writer's thread needing them and waiting Patience in vain.
/// The session adds: a copy, a set, a CUDA graph's launch or the start of
/// a capture made outside an op (inside a named scope, such as an autograd
/// Function's forward, counts as outside), and, anywhere, an event's
/// record, a wait for one or a synchronisation (after which the program
/// may write on another stream, ordered only after what the tensor's
/// stream held then); c10d's collectives, which write tensors their
/// schemas do not mark.
/// A write that none of these sees (a GPU write through another process's
/// CUDA IPC mapping, the host writing managed memory) between the hand-over
/// and the launch would show in the statistics. A tensor whose storage was
/// freed or moved outside ops meanwhile (`UntypedStorage.resize_`) is not
/// read: it goes without statistics (unless it was given the same memory
/// back, and then written, before the launch).
///
/// Tensors are held until their statistics are read, so that their memory
/// is not reused meanwhile (MaxHeldBytes at most), and released on a
/// program's thread only (releaseSettled), as DeferredStatsQueue does: the
/// last reference may keep a Python object alive.
class DeviceStatsBatcher {
public:
  /// The statistics of one launch's tensors.
  class Launch {
  public:
    virtual ~Launch() = default;
    /// The statistics of the launch's tensor \p I, once the device
    /// delivered them (waited for); none if it did not.
    virtual std::optional<TensorStats> stats(size_t I) = 0;
  };
  /// Enqueues the statistics of \p Values (contiguous tensors of one
  /// device, at most MaxItems) on \p Stream; null when nothing was
  /// enqueued.
  using LaunchFn = std::function<std::shared_ptr<Launch>(const std::vector<at::Tensor> &Values,
                                                         const c10::Stream &Stream)>;

  explicit DeviceStatsBatcher(LaunchFn Launcher,
                              std::chrono::milliseconds Patience = std::chrono::milliseconds(20),
                              uint64_t MaxHeld = MaxHeldBytes)
      : Launcher(std::move(Launcher)), Patience(Patience), MaxHeld(MaxHeld) {}
  DeviceStatsBatcher(const DeviceStatsBatcher &) = delete;
  DeviceStatsBatcher &operator=(const DeviceStatsBatcher &) = delete;

  /// The statistics of \p Values, contiguous, as they are now in the order
  /// of \p Stream: launched with others later, or with those waiting \p Now.
  std::shared_ptr<DeferredStats> defer(at::Tensor Values, const c10::Stream &Stream, bool Now);
  /// Before an op writes to \p T: launches what waits, if any of it shares
  /// \p T's storage.
  void beforeWrite(const at::Tensor &T);
  /// Launches everything that waits.
  void launchAll();
  /// Whether anything waits for its launch (a relaxed read, for the hot path).
  bool waiting() const { return Waiting.load(std::memory_order_relaxed) != 0; }
  /// Whether any tensor is held (a relaxed read).
  bool holding() const { return HeldCount.load(std::memory_order_relaxed) != 0; }
  /// Releases the tensors whose statistics were read. On a program's
  /// thread, outside ops.
  void releaseSettled();
  /// Launches and reads everything held (before the observer stops).
  void settleAll();
  /// From now on every tensor is launched as it is handed over.
  void stop();
  static constexpr size_t MaxItems = 96; ///< devicestats::MaxItems
  static constexpr uint64_t MaxUnlaunchedBytes = uint64_t(256) << 20;
  /// Past this many bytes held (waiting, or launched and not yet read), a
  /// tensor is launched with those waiting at once and not held: released
  /// right after its launch, as its caller still holds it.
  static constexpr uint64_t MaxHeldBytes = uint64_t(512) << 20;

private:
  struct Entry {
    explicit Entry(const c10::Stream &Stream) : Stream(Stream) {}
    at::Tensor Values;
    const c10::StorageImpl *Storage = nullptr;
    /// Where the storage's memory was when handed over, and its extent.
    const void *StorageData = nullptr;
    size_t StorageBytes = 0;
    c10::Stream Stream;
    uint64_t Bytes = 0; ///< Held: 0 once released, or if never held.
    bool Launched = false;
    std::shared_ptr<Launch> Batch; ///< Null if the launch failed.
    size_t Index = 0;              ///< In Batch.
    std::weak_ptr<DeferredStats> Stats;
  };
  /// Under Mutex.
  void launchLocked();
  std::optional<TensorStats> await(const std::shared_ptr<Entry> &E);

  LaunchFn Launcher;
  std::chrono::milliseconds Patience;
  uint64_t MaxHeld;
  std::mutex Mutex;
  std::condition_variable LaunchDone;
  /// In the order handed over; the last Unlaunched wait for their launch.
  std::deque<std::shared_ptr<Entry>> Held;
  size_t Unlaunched = 0;
  uint64_t UnlaunchedBytes = 0, HeldBytes = 0;
  bool Stopped = false;
  std::atomic<size_t> Waiting{0}, HeldCount{0};
};

/// The values this library's kernel reads for \p T's statistics (its own,
/// or its parts', contiguous), and the stream they are current on; an
/// undefined tensor where the kernel cannot take them (built without nvcc,
/// an element type or a GPU it does not take). \p OutOfMemory: a copy
/// could not be had (ATen's reductions, which need more, are not tried then).
at::Tensor kernelStatsValues(const at::Tensor &T, c10::Stream &Stream, bool &OutOfMemory);

/// Launches the statistics of \p Values by this library's kernel: the
/// DeviceStatsBatcher's launcher. Counted in \p Counts.
std::shared_ptr<DeviceStatsBatcher::Launch> launchDeviceStats(const std::vector<at::Tensor> &Values,
                                                              const c10::Stream &Stream,
                                                              DeviceStatsCounts &Counts);

/// For a tensor on a GPU that the kernel does not take: its statistics by
/// ATen's reductions, enqueued now in stream order (so, as the tensor is
/// now, even if an op later changes it in place), without blocking the
/// program. The function returned, run on the trace writer's thread, waits
/// for them; none where the device did not deliver them. Not for a stream
/// capturing a CUDA graph (capturingGraph(): the caller asks first).
std::function<std::optional<TensorStats>()> deviceStats(const at::Tensor &T,
                                                        DeviceStatsCounts &Counts);

/// For a tensor on a GPU: its bytes copied to pinned host memory in stream
/// order, without blocking the program. The completion, run on the trace
/// writer's thread, waits for the copy and fills in the record's data (the
/// writer computes the statistics from it); a failure there leaves the
/// record without them and counts it in \p Lost. Not for a stream capturing
/// a CUDA graph.
TraceWriter::Completion deviceBytes(const at::Tensor &T, std::atomic<int64_t> &Lost);

/// \p T's statistics by ATen's reductions, wherever it is, waited for: the
/// GPU's fallback, and a CPU tensor the byte loop does not take.
TensorStats statsByReductions(const at::Tensor &T);

/// Whether \p T is on a GPU whose current stream is capturing a CUDA graph:
/// nothing may be read back from it then (the read-back would be captured
/// into the graph).
bool capturingGraph(const at::Tensor &T);

} // namespace ekka

#endif
