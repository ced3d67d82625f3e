//===- TerminationFlushTest.cpp - A SIGTERM's flush waits for late records ===//
//
// Where a SIGTERM's handlers let go of their threads (TerminationPending),
// those threads finish the step they were in before they stand still, and
// may record after the flush took their buffers. The flush is repeated
// while records still come; a trace still growing at the deadline says so.
// A thread launching kernels outside ops (no stand-still there) stands in
// for one that finishes its step.
//
//===----------------------------------------------------------------------===//
#include "../../lib/Runtime/SessionInternal.h"
#include "ekka/Runtime/TraceSession.h"
#include "ekka/Trace/TraceReader.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

using namespace ekka;
using namespace llvm;
using Clock = std::chrono::steady_clock;

namespace {

KernelLaunch launch() {
  KernelLaunch L;
  L.Name = "_Z4latePf";
  L.Grid[0] = L.Block[0] = 1;
  return L;
}

/// A thread that launches a kernel every millisecond until \p Until, or
/// until told to stop, and counts them.
struct Launcher {
  std::atomic<bool> Stop{false};
  std::atomic<int64_t> Launched{0};
  std::thread Thread;
  explicit Launcher(Clock::time_point Until)
      : Thread([this, Until] {
          while (!Stop && Clock::now() < Until) {
            recordKernelLaunch(launch());
            ++Launched;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }) {}
  int64_t finish() {
    Stop = true;
    if (Thread.joinable())
      Thread.join();
    return Launched;
  }
  ~Launcher() { finish(); }
};

struct Written {
  size_t Kernels = 0;
  std::string LostRecords;
};

Written readLive(const std::string &Trace) {
  Written W;
  auto R = TraceReader::open(Trace);
  EXPECT_TRUE(bool(R));
  if (!R) {
    consumeError(R.takeError());
    return W;
  }
  auto Kernels = (*R)->kernels();
  EXPECT_TRUE(bool(Kernels));
  if (Kernels)
    W.Kernels = Kernels->size();
  else
    consumeError(Kernels.takeError());
  auto Meta = (*R)->meta();
  if (auto It = Meta.find("lost_records"); It != Meta.end())
    W.LostRecords = It->second;
  return W;
}

/// A trace running, and a SIGTERM's handlers letting go (TerminationPending).
class TerminationFlush : public testing::Test {
protected:
  void SetUp() override {
    ASSERT_FALSE(sys::fs::createUniqueDirectory("ekka-term", Dir));
    Trace = (Dir + "/trace").str();
    ASSERT_EQ(startTrace(Trace, "gpu=synthetic test;", "test"), "");
    TerminationPending = true;
  }
  void TearDown() override {
    TerminationPending = false;
    stopTrace();
    sys::fs::remove_directories(Dir);
  }
  SmallString<128> Dir;
  std::string Trace;
};

TEST_F(TerminationFlush, RecordsOfThreadsLetGoAreFlushedUntilNoneCome) {
  Written W;
  int64_t Launched;
  {
    Launcher L(Clock::now() + std::chrono::milliseconds(300));
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(settleTraceAfterTermination(Clock::now() + std::chrono::seconds(30)), "");
    // Returned once the launches had stopped by themselves: all of them
    // are written.
    W = readLive(Trace);
    Launched = L.finish();
  }
  EXPECT_GT(Launched, 20);
  EXPECT_EQ(W.Kernels, static_cast<size_t>(Launched));
  EXPECT_EQ(W.LostRecords, "0");
}

TEST_F(TerminationFlush, ATraceStillGrowingAtTheDeadlineSaysWhatIsMissing) {
  Written W;
  {
    Launcher L(Clock::now() + std::chrono::seconds(60));
    EXPECT_EQ(settleTraceAfterTermination(Clock::now() + std::chrono::milliseconds(300)), "");
    W = readLive(Trace);
  }
  EXPECT_GT(W.Kernels, 0u);
  EXPECT_EQ(W.LostRecords.rfind("unknown: SIGTERM ended the process while its threads still "
                                "recorded",
                                0),
            0u)
      << W.LostRecords;
}

} // namespace
