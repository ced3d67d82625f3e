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
// The handler only posts a semaphore (async-signal-safe); the writing
// happens on the waiting thread, bounded in time: a trace whose writing
// does not finish (a lock held by a thread that never lets go) still ends
// the process, valid up to what was written.
//
//===----------------------------------------------------------------------===//

#include "SessionInternal.h"
#include "ekka/Runtime/TraceSession.h"
#include "ekka/Support/QuietThread.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <pthread.h>
#include <new>
#include <semaphore.h>
#include <system_error>
#include <thread>
#include <unistd.h>

namespace ekka {
namespace {

/// Posted by the handler; the waiting thread of the process that
/// installed it waits on it.
sem_t Wake;
/// The process whose thread waits on Wake: a forked child's handler (the
/// parent's, inherited) ends the child at once, as the default would.
std::atomic<pid_t> WaiterPid{0};
std::mutex InstallMutex;

/// How long a SIGTERM waits for the trace to be written before it ends the
/// process anyway.
constexpr std::chrono::seconds FlushBound(10);

void restoreDefault() {
  struct sigaction Default = {};
  Default.sa_handler = SIG_DFL;
  sigemptyset(&Default.sa_mask);
  sigaction(SIGTERM, &Default, nullptr);
}

void onTerminate(int Signal, siginfo_t *, void *) {
  int Saved = errno;
  if (::getpid() == WaiterPid.load(std::memory_order_relaxed)) {
    sem_post(&Wake);
  } else {
    // No thread here to write anything: end as the default would (the
    // signal is blocked inside its handler, and delivered on its return).
    restoreDefault();
    raise(Signal);
  }
  errno = Saved;
}

bool installedIsOurs(const struct sigaction &Now) {
  return (Now.sa_flags & SA_SIGINFO) && Now.sa_sigaction == onTerminate;
}

/// Writes the trace out, for FlushBound at most, then ends the process with
/// SIGTERM.
void waitForTermination() {
  pthread_setname_np(pthread_self(), "ekka-sigterm");
  while (sem_wait(&Wake) != 0 && errno == EINTR) {
  }
  struct Flush {
    std::mutex M;
    std::condition_variable Done;
    bool Finished = false;
  };
  // Shared with the writing thread, which may outlive the wait: leaked.
  auto *F = new Flush();
  startQuietThread([F] {
    std::string Error = flushTrace();
    if (!Error.empty())
      std::fprintf(stderr, "ekka-trace: %s\n", Error.c_str());
    std::lock_guard<std::mutex> Lock(F->M);
    F->Finished = true;
    F->Done.notify_all();
  }).detach();
  {
    std::unique_lock<std::mutex> Lock(F->M);
    if (!F->Done.wait_for(Lock, FlushBound, [F] { return F->Finished; }))
      std::fprintf(stderr, "ekka-trace: warning: the trace was not written out within %lld s "
                           "of SIGTERM: it holds what was written before\n",
                   static_cast<long long>(FlushBound.count()));
  }
  restoreDefault();
  ::kill(::getpid(), SIGTERM);
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
    // In a forked child, a semaphore of its own: the parent's copy may have
    // been posted.
    if (sem_init(&Wake, /*pshared=*/0, 0) != 0)
      return;
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
  // SA_RESTART: the program's interrupted system calls go on as if no
  // signal had come, which, untraced, would have ended it.
  Handler.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&Handler.sa_mask);
  sigaction(SIGTERM, &Handler, nullptr);
}

void uninstallTerminationFlush() {
  std::lock_guard<std::mutex> Lock(InstallMutex);
  struct sigaction Now = {};
  if (sigaction(SIGTERM, nullptr, &Now) == 0 && installedIsOurs(Now))
    restoreDefault();
}

void forgetTerminationFlushInChild() {
  // In a fork handler: no lock (another thread of the parent may have held
  // it), and sigaction alone.
  new (&InstallMutex) std::mutex();
  struct sigaction Now = {};
  if (sigaction(SIGTERM, nullptr, &Now) == 0 && installedIsOurs(Now))
    restoreDefault();
}

} // namespace ekka
