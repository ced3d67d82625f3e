//===- QuietThread.h - Threads that leave signals to the program -*- C++ -*-===//
//
// The threads Ekka starts inside a traced program (the trace writer's, the
// one that writes a trace out at SIGTERM) block the asynchronous signals:
// a signal sent to the process goes to a thread that does not block it,
// and a program that blocks one in its own threads to wait for it (sigwait)
// or to keep it from them must not find it taken by a thread of Ekka's.
// The faults a thread's own code raises (SIGSEGV, SIGBUS, ...) stay
// unblocked: blocked, Linux would end the process without the program's
// handler (faulthandler's report).
//
// Header-only and free of LLVM: the tracing runtime uses it inside the
// traced process.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_SUPPORT_QUIETTHREAD_H
#define EKKA_SUPPORT_QUIETTHREAD_H

#include <csignal>
#include <pthread.h>
#include <thread>
#include <utility>

namespace ekka {

/// A std::thread running \p F with the asynchronous signals blocked from
/// its first instruction (the mask is inherited from the creating thread,
/// which has its own back before this returns).
template <typename Fn> std::thread startQuietThread(Fn &&F) {
  sigset_t Blocked, Old;
  sigfillset(&Blocked);
  for (int Fault : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT})
    sigdelset(&Blocked, Fault);
  pthread_sigmask(SIG_BLOCK, &Blocked, &Old);
  struct Restore {
    sigset_t &Old;
    ~Restore() { pthread_sigmask(SIG_SETMASK, &Old, nullptr); }
  } R{Old};
  return std::thread(std::forward<Fn>(F));
}

} // namespace ekka

#endif
