//===- TerminationFlush.cpp - A SIGTERM writes the trace out first --------===//
//
// A program ended by SIGTERM (kill, timeout, docker stop, torchrun's agent,
// multiprocessing's Pool.terminate) would lose everything the writer had
// not written: the tensors of the open shard, the rows still queued. While
// a trace runs and the program has no SIGTERM handler of its own, the
// runtime's handler wakes a thread that writes the trace out (flushTrace,
// as before an exec), then ends the process with SIGTERM as it would have
// ended: its exit status is the signal's.
//
// The handler only writes to a pipe and waits on another (async-signal-
// safe); the writing happens on the waiting thread, bounded in time. The
// thread the signal interrupted may hold what the writing waits for (its
// buffer's lock, while it waits for room in the writer's queue): after a
// second, its handler returns, and the program's threads stand still at
// their next step into the runtime instead, until the trace is written. A
// trace whose writing does not finish still ends the process, valid up to
// what was written.
//
//===----------------------------------------------------------------------===//

#include "SessionInternal.h"
#include "ekka/Runtime/TraceSession.h"
#include "ekka/Support/QuietThread.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <fcntl.h>
#include <mutex>
#include <new>
#include <pthread.h>
#include <sys/syscall.h>
#include <system_error>
#include <thread>
#include <unistd.h>

namespace ekka {
namespace {

/// The handler writes a byte to Wake and waits for one on Done; the
/// waiting thread of the process that made them reads Wake, writes the
/// trace out, and answers on Done. (Pipes: read and write are
/// async-signal-safe, a semaphore's wait is not.)
int Wake[2] = {-1, -1}, Done[2] = {-1, -1};
/// The process whose thread reads Wake: a forked child's handler (the
/// parent's, inherited) ends the child at once, as the default would.
std::atomic<pid_t> WaiterPid{0};
std::mutex InstallMutex;
/// The thread that is stopping the trace (stopTrace holds the session's lock
/// while it closes the writer): a SIGTERM there must not wait for a flush
/// that waits for that lock. Its handler returns, the stop goes on, and the
/// waiting thread ends the process once the flush has found it done.
std::atomic<pid_t> StoppingThread{0};
/// Set where a handler does not wait on Done (on the stopping thread), or
/// no longer (HandlerBound): the waiting thread ends the process once the
/// trace is written. No handler clears it.
std::atomic<bool> EndAfterFlush{false};
/// How many handlers wait on Done, or are about to: each gets a byte when
/// the flush goes on without them (HandlerBound).
std::atomic<int> HandlersWaiting{0};

pid_t threadId() { return static_cast<pid_t>(syscall(SYS_gettid)); }

/// How long a SIGTERM waits for the trace to be written before it ends the
/// process anyway.
constexpr std::chrono::seconds FlushBound(10);
/// How long the handler waits before it returns, so that its thread lets go
/// of what the flush may wait for (TerminationPending).
constexpr std::chrono::seconds HandlerBound(1);

void onTerminate(int Signal, siginfo_t *, void *);

bool installedIsOurs(const struct sigaction &Now) {
  return (Now.sa_flags & SA_SIGINFO) && Now.sa_sigaction == onTerminate;
}

/// SIGTERM's default again, where the handler is still the runtime's (not
/// one the program set since). Async-signal-safe: sigaction alone.
void restoreDefaultIfOurs() {
  struct sigaction Now = {};
  if (sigaction(SIGTERM, nullptr, &Now) != 0 || !installedIsOurs(Now))
    return;
  struct sigaction Default = {};
  Default.sa_handler = SIG_DFL;
  sigemptyset(&Default.sa_mask);
  sigaction(SIGTERM, &Default, nullptr);
}

/// The thread that got the signal waits here until the trace is written:
/// where it ran the program's Python it holds the GIL, and the program
/// stands still meanwhile (its other threads, if they run, run on). Then
/// the signal ends the process as it would have: raised again at this
/// thread (not at the process, where a thread waiting for it with sigwait
/// would take it), blocked until the handler returns.
void onTerminate(int Signal, siginfo_t *, void *) {
  int Saved = errno;
  if (::getpid() == WaiterPid.load(std::memory_order_relaxed)) {
    // A SIGTERM while the flush goes on without its handler (HandlerBound):
    // the waiting thread ends the process once the trace is written.
    if (TerminationPending.load()) {
      errno = Saved;
      return;
    }
    bool Wait = StoppingThread.load() != threadId();
    if (!Wait)
      EndAfterFlush = true;
    else
      ++HandlersWaiting;
    char Byte = 0;
    ssize_t N;
    while ((N = write(Wake[1], &Byte, 1)) < 0 && errno == EINTR) {
    }
    if (N == 1 && !Wait) {
      errno = Saved;
      return;
    }
    // Either the waiting thread counts this handler when it lets the
    // handlers go, or this handler sees that it has (both are sequentially
    // consistent).
    if (N == 1 && !TerminationPending.load())
      while (read(Done[0], &Byte, 1) < 0 && errno == EINTR) {
      }
    if (Wait)
      --HandlersWaiting;
    if (N == 1 && TerminationPending.load()) {
      errno = Saved; // the flush goes on without this thread (see HandlerBound)
      return;
    }
  }
  restoreDefaultIfOurs();
  raise(Signal);
  errno = Saved;
}

/// Writes the trace out at the first SIGTERM, for FlushBound at most, and
/// answers every handler that waits.
void waitForTermination() {
  pthread_setname_np(pthread_self(), "ekka-sigterm");
  bool Written = false;
  for (;;) {
    char Byte;
    ssize_t N;
    while ((N = read(Wake[0], &Byte, 1)) < 0 && errno == EINTR) {
    }
    if (N != 1)
      return;
    bool Answered = false;
    if (!Written) {
      Written = true;
      struct Flush {
        std::mutex M;
        std::condition_variable Done;
        bool Finished = false;
      };
      // Shared with the writing thread, which may outlive the wait: leaked.
      auto *F = new Flush();
      // A second before the process is ended anyway, for the last flush.
      auto Deadline = std::chrono::steady_clock::now() + FlushBound - HandlerBound;
      startQuietThread([F, Deadline] {
        InsideEkkaScope Inside; // never stands still (TerminationPending)
        std::string Error = flushTrace();
        for (bool Settled = false;;) {
          // The handlers let go (below) under F->M: either before this
          // looks, and the threads they leave are waited for, or after
          // Finished, which they then see.
          if (Error.empty() && !Settled && TerminationPending.load()) {
            Error = settleTraceAfterTermination(Deadline);
            Settled = true;
          }
          std::lock_guard<std::mutex> Lock(F->M);
          if (Settled || !Error.empty() || !TerminationPending.load()) {
            if (!Error.empty())
              std::fprintf(stderr, "ekka-trace: %s\n", Error.c_str());
            F->Finished = true;
            F->Done.notify_all();
            break;
          }
        }
      }).detach();
      std::unique_lock<std::mutex> Lock(F->M);
      auto Finished = [F] { return F->Finished; };
      if (!F->Done.wait_for(Lock, HandlerBound, Finished) && !EndAfterFlush) {
        // The handler's thread may hold what the flush waits for: the
        // handlers return, and the program's threads stand still at their
        // next step into the runtime, until this thread ends the process.
        TerminationPending = true;
        EndAfterFlush = true;
        Answered = true;
        for (int I = HandlersWaiting.load(); I > 0; --I)
          while (write(Done[1], &Byte, 1) < 0 && errno == EINTR) {
          }
      }
      if (!F->Done.wait_for(Lock, FlushBound - HandlerBound, Finished))
        std::fprintf(stderr, "ekka-trace: warning: the trace was not written out within %lld s "
                             "of SIGTERM: it holds what was written before\n",
                     static_cast<long long>(FlushBound.count()));
    }
    if (EndAfterFlush.exchange(false)) {
      // A handler returned (to a stop under way, now done: the flush waited
      // for it; or after HandlerBound): SIGTERM ends the process, as it
      // would have.
      restoreDefaultIfOurs();
      ::kill(::getpid(), SIGTERM);
      TerminationPending = false; // a handler the program set since took it
    }
    if (!Answered)
      while (write(Done[1], &Byte, 1) < 0 && errno == EINTR) {
      }
  }
}

} // namespace

void installTerminationFlush() {
  std::lock_guard<std::mutex> Lock(InstallMutex);
  struct sigaction Now = {};
  if (sigaction(SIGTERM, nullptr, &Now) != 0)
    return;
  bool Ours = installedIsOurs(Now);
  if (!Ours && ((Now.sa_flags & SA_SIGINFO) || Now.sa_handler != SIG_DFL))
    return; // the program's own handler, or SIGTERM ignored: theirs to keep
  pid_t Pid = ::getpid();
  if (WaiterPid.load() != Pid) {
    // In a forked child, pipes and a thread of its own (the parent's
    // pipes are the parent's).
    int NewWake[2], NewDone[2];
    if (pipe2(NewWake, O_CLOEXEC) != 0)
      return;
    if (pipe2(NewDone, O_CLOEXEC) != 0) {
      close(NewWake[0]);
      close(NewWake[1]);
      return;
    }
    std::copy(NewWake, NewWake + 2, Wake);
    std::copy(NewDone, NewDone + 2, Done);
    try {
      startQuietThread(waitForTermination).detach();
    } catch (const std::system_error &) {
      return;
    }
    WaiterPid = Pid;
  }
  if (Ours)
    return;
  struct sigaction Handler = {};
  Handler.sa_sigaction = onTerminate;
  // A handler that returns (HandlerBound) leaves the system call it
  // interrupted to go on, as if the signal had not come.
  Handler.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&Handler.sa_mask);
  sigaction(SIGTERM, &Handler, nullptr);
}

void setStoppingThread(bool Stopping) { StoppingThread = Stopping ? threadId() : 0; }

std::atomic<bool> TerminationPending{false};

void standStillForTermination() {
  while (TerminationPending.load())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

void uninstallTerminationFlush() {
  std::lock_guard<std::mutex> Lock(InstallMutex);
  restoreDefaultIfOurs();
}

void forgetTerminationFlushInChild() {
  // In a fork handler: no lock (another thread of the parent may have held
  // it), and sigaction alone. The parent's pipes stay open here, unused
  // (closed at an exec).
  new (&InstallMutex) std::mutex();
  TerminationPending = false; // the parent's threads stand still, not the child's
  EndAfterFlush = false;
  HandlersWaiting = 0;
  restoreDefaultIfOurs();
}

} // namespace ekka
