//===- SessionInternal.h - Between the session and the CUPTI tracer -*- C++ -*-===//
#ifndef EKKA_LIB_RUNTIME_SESSIONINTERNAL_H
#define EKKA_LIB_RUNTIME_SESSIONINTERNAL_H

#include "ekka/Runtime/KernelLaunch.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace ekka {

/// What the runtime's callbacks ask of the thread at every op, in one
/// thread_local that needs no code to build: a library loaded with dlopen
/// reaches each thread_local through a call of __tls_get_addr (about 20 an
/// op when these were apart).
struct ThreadFlags {
  /// Whether this thread is inside Ekka: its own tensor ops, launches and
  /// waits are not the program's (not recorded; no statistics launched for
  /// them).
  bool InsideEkka = false;
  /// Set once the session's state of this thread is destroyed (at the
  /// thread's exit): an op of the thread's last destructors is not seen.
  bool StateGone = false;
  /// That state (TraceSession.cpp's ThreadState) while it lives.
  void *State = nullptr;
  /// How many scopes of work a library does for itself on this thread are
  /// open (setAside: an autotuner's benchmark runs).
  unsigned Aside = 0;
};
/// The flags of the thread on which torch.compile compiles (setCompiling),
/// or null: its ops and launches meanwhile are not the program's.
extern std::atomic<const ThreadFlags *> CompilingThread;
inline bool compilingOn(const ThreadFlags &Flags) {
  return CompilingThread.load(std::memory_order_relaxed) == &Flags;
}
/// Whether the thread's ops and launches are not the program's now: torch
/// compiles on it, or a library works for itself (setAside). Not recorded;
/// what they write is still watched for (statistics waiting for their
/// launch are launched before it).
inline bool setAsideOn(const ThreadFlags &Flags) { return Flags.Aside || compilingOn(Flags); }

/// This thread's flags, looked up once by the caller: a thread_local's
/// address the compiler would find again (a call of __tls_get_addr) after
/// every call the function makes.
ThreadFlags &threadFlags();

/// Marks the thread as inside Ekka for a scope, also when an exception
/// leaves it.
struct InsideEkkaScope {
  ThreadFlags &Flags;
  bool Saved;
  explicit InsideEkkaScope(ThreadFlags &Flags = threadFlags())
      : Flags(Flags), Saved(Flags.InsideEkka) {
    Flags.InsideEkka = true;
  }
  ~InsideEkkaScope() { Flags.InsideEkka = Saved; }
  InsideEkkaScope(const InsideEkkaScope &) = delete;
  InsideEkkaScope &operator=(const InsideEkkaScope &) = delete;
};

/// Records a kernel launch under the op and module call open on this thread;
/// returns its kernel id, 0 when nothing is traced. \p Pointers are the
/// launch's pointer-sized parameters: when the open op's tensors are
/// captured, those that point into a tensor the op was given are copied by
/// snapshotKernelBuffers(), which the launch's API exit calls, once the
/// kernel is on its stream.
int64_t recordKernelLaunch(const KernelLaunch &Launch,
                           const std::vector<PointerArgument> &Pointers = {});
void snapshotKernelBuffers();
/// Before a kernel launch, a copy, a set or a graph's launch (CUPTI's API
/// entry, before anything else): one made outside any op may write to the
/// GPU tensors whose statistics wait for their launch (DeviceStatsBatcher),
/// which are launched first.
/// \p Ordering: a call that orders work across streams or with the host
/// (an event's record, a stream's wait, a synchronisation), before which
/// they are launched wherever it is made: work after it on another stream
/// is ordered only after what their stream had then.
void beforeDeviceWrite(bool Ordering = false);
/// More pointer parameters of the launch recorded last on this thread (the
/// driver launch a runtime launch makes underneath, when the runtime's own
/// parameters gave none).
void matchKernelPointers(const std::vector<PointerArgument> &Pointers);
/// Whether the op open on this thread wants its kernels' buffers copied.
bool kernelSnapshotsWanted();

/// A record lost to an error in the tracer: counted, and the first error
/// kept (without a C++ backtrace), for the trace's meta `lost_records`: a
/// trace must not be silently partial. False when no trace is being written.
bool lostRecord(const char *Where, const std::exception &E);

/// The parts of the tracer's own time on the program's threads that
/// `timings=1` (ekka-trace --timings) records in meta `tracer_time`.
/// DeviceSubmit: within Statistics, the CUDA work a GPU tensor's read-back
/// enqueues (the statistics kernel and its event, or ATen's reductions, the
/// copy and its event), to tell it from the tracer's own code around it.
enum class TracerPart { Ops, Modules, Statistics, KernelCallbacks, DeviceSubmit };
constexpr int TracerParts = int(TracerPart::DeviceSubmit) + 1;
/// A scope whose duration counts toward a part, when the session records
/// timings (otherwise a branch).
class TracerTimer {
public:
  /// \p NewCall: the scope begins a call of the part (an op's start, not
  /// its end), counted in `tracer_time`.
  explicit TracerTimer(TracerPart Part, bool NewCall = true);
  ~TracerTimer();
  TracerTimer(const TracerTimer &) = delete;
  TracerTimer &operator=(const TracerTimer &) = delete;

private:
  TracerPart Part;
  bool NewCall;
  uint64_t Start = 0; ///< 0: not timing.
};

/// How device buffers are copied (stream-ordered, after the kernel) and
/// waited for; the CUPTI tracer sets them from the driver API it loads.
struct DeviceMemoryOps {
  bool (*CopyAsync)(void *Dst, const void *Src, size_t Bytes, uint64_t Stream) = nullptr;
  void (*Synchronize)(uint64_t Stream) = nullptr;
};
void setDeviceMemoryOps(DeviceMemoryOps Ops);

/// Subscribes to CUPTI's launch callbacks through the libcupti at \p Path.
/// Returns what `meta.gpu_kernels` should say: "traced", or "not traced: "
/// and why (another subscriber, a library that does not load, ...).
std::string startKernelTracing(const std::string &Path);
/// Unsubscribes; returns why launches in captured ops had no buffers
/// snapshotted ("" if none was missed).
std::string stopKernelTracing();
/// What stopKernelTracing would return, while tracing goes on (a trace
/// written out before an exec).
std::string kernelTracingMisses();
/// Whether the kernel tracing started sees the calls that write device
/// memory without a launch (copies, sets, graph launches) too.
bool kernelTracingSeesWrites();

/// While a trace runs, a SIGTERM writes it out first (TerminationFlush.cpp),
/// unless the program handles or ignores SIGTERM itself. Installed when a
/// trace starts, taken back when it stops, and forgotten in a forked child
/// (which has no thread to write with).
void installTerminationFlush();
void uninstallTerminationFlush();
/// Around stopTrace: a SIGTERM on the stopping thread lets the stop finish.
void setStoppingThread(bool Stopping);
void forgetTerminationFlushInChild();
/// After flushTrace() at a SIGTERM whose handlers have let go
/// (TerminationPending), from a thread inside Ekka: the threads they leave
/// finish the step they were in before they stand still, and may record
/// its end after the flush took their buffers. Flushed again, 50 ms
/// apart, until a flush writes nothing new, meta lost_records saying
/// meanwhile that what comes later is missing (as it says if the trace is
/// still growing at \p Deadline, or the process ends first).
std::string settleTraceAfterTermination(std::chrono::steady_clock::time_point Deadline);
/// Set while a SIGTERM's flush goes on without the thread the signal landed
/// on, whose handler returned (it may hold what the flush waits for): the
/// program's threads stand still at their next step into the runtime, and
/// the process ends once the trace is written, as the signal would have
/// ended it.
extern std::atomic<bool> TerminationPending;
[[gnu::cold]] void standStillForTermination();
inline void standStillIfTerminating(const ThreadFlags &Flags) {
  if (TerminationPending.load(std::memory_order_relaxed) && !Flags.InsideEkka)
    standStillForTermination();
}

} // namespace ekka

#endif
