//===- DeviceStatsBatcherTest.cpp - GPU statistics launched together -------===//
//
// DeviceStatsBatcher hands GPU tensors' statistics to one launch for many,
// and launches before anything can write to them. Here with a launcher that
// computes the statistics of host tensors at the moment of the launch (as
// the kernel reads them in stream order then): a statistic of values
// written after the hand-over but before the launch would show it.
//
//===----------------------------------------------------------------------===//
#include "../../lib/Runtime/TensorRecording.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <future>
#include <mutex>
#include <thread>

using namespace ekka;

namespace {

/// A launch's statistics, computed when launched.
class HostLaunch : public DeviceStatsBatcher::Launch {
public:
  explicit HostLaunch(std::vector<TensorStats> Stats) : Stats(std::move(Stats)) {}
  std::optional<TensorStats> stats(size_t I) override { return Stats.at(I); }

private:
  std::vector<TensorStats> Stats;
};

/// The launches a batcher made: how many tensors each, on which stream.
struct Launches {
  std::vector<std::pair<size_t, c10::StreamId>> Made;
  bool Fail = false;
  std::thread::id LastThread;

  DeviceStatsBatcher::LaunchFn launcher() {
    return [this](const std::vector<at::Tensor> &Values, const c10::Stream &Stream)
               -> std::shared_ptr<DeviceStatsBatcher::Launch> {
      Made.push_back({Values.size(), Stream.id()});
      LastThread = std::this_thread::get_id();
      if (Fail)
        return nullptr;
      std::vector<TensorStats> Stats;
      for (const at::Tensor &V : Values)
        Stats.push_back(V.numel() < (1 << 20) ? tensorStats(V) : TensorStats()); // not the large
      return std::make_shared<HostLaunch>(std::move(Stats));
    };
  }
};

c10::Stream stream(c10::StreamId Id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::kCPU), Id);
}

TEST(DeviceStatsBatcher, TensorsWaitAndGoInOneLaunch) {
  Launches L;
  DeviceStatsBatcher B(L.launcher());
  at::Tensor X = at::full({4}, 1.0), Y = at::full({8}, 2.0), Z = at::full({2}, -3.0);
  auto SX = B.defer(X, stream(0), false);
  auto SY = B.defer(Y, stream(0), false);
  auto SZ = B.defer(Z, stream(0), false);
  EXPECT_TRUE(L.Made.empty());
  EXPECT_TRUE(B.waiting());
  B.launchAll();
  ASSERT_EQ(L.Made.size(), 1u);
  EXPECT_EQ(L.Made[0].first, 3u);
  EXPECT_FALSE(B.waiting());
  EXPECT_EQ(SX->resolve()->Sum, 4.0);
  EXPECT_EQ(SY->resolve()->Sum, 16.0);
  EXPECT_EQ(SZ->resolve()->Min, -3.0);
  B.launchAll(); // nothing waits: no launch
  EXPECT_EQ(L.Made.size(), 1u);
}

TEST(DeviceStatsBatcher, AWriteLaunchesThemBeforeIt) {
  Launches L;
  DeviceStatsBatcher B(L.launcher());
  at::Tensor X = at::full({16}, 2.0), Other = at::zeros({16});
  auto S = B.defer(X, stream(0), false);
  B.beforeWrite(Other); // another storage: they wait on
  EXPECT_TRUE(L.Made.empty());
  B.beforeWrite(X.narrow(0, 4, 4)); // a view of the same storage
  ASSERT_EQ(L.Made.size(), 1u);
  X.mul_(5);
  ASSERT_TRUE(S->resolve());
  EXPECT_EQ(S->resolve()->Sum, 32.0); // what the module returned, not what came after
}

TEST(DeviceStatsBatcher, NowLaunchesThoseWaitingWithIt) {
  Launches L;
  DeviceStatsBatcher B(L.launcher());
  auto A = B.defer(at::ones({3}), stream(0), false);
  auto In = B.defer(at::ones({5}), stream(0), /*Now=*/true);
  ASSERT_EQ(L.Made.size(), 1u);
  EXPECT_EQ(L.Made[0].first, 2u);
  EXPECT_EQ(A->resolve()->Sum, 3.0);
  EXPECT_EQ(In->resolve()->Sum, 5.0);
}

TEST(DeviceStatsBatcher, OneLaunchPerStreamAndAtMostMaxItems) {
  Launches L;
  DeviceStatsBatcher B(L.launcher());
  std::vector<std::shared_ptr<DeferredStats>> Stats;
  for (int I = 0; I < 10; ++I)
    Stats.push_back(B.defer(at::full({2}, double(I)), stream(I % 2 ? 7 : 3), false));
  B.launchAll();
  ASSERT_EQ(L.Made.size(), 2u);
  EXPECT_EQ(L.Made[0], std::make_pair(size_t(5), c10::StreamId(3)));
  EXPECT_EQ(L.Made[1], std::make_pair(size_t(5), c10::StreamId(7)));
  for (int I = 0; I < 10; ++I)
    EXPECT_EQ(Stats[I]->resolve()->Sum, 2.0 * I) << I; // each its own, through the grouping
  L.Made.clear();
  for (size_t I = 0; I < DeviceStatsBatcher::MaxItems; ++I)
    Stats.push_back(B.defer(at::ones({1}), stream(0), false));
  ASSERT_EQ(L.Made.size(), 1u); // the cap reached: launched
  EXPECT_EQ(L.Made[0].first, DeviceStatsBatcher::MaxItems);
  EXPECT_FALSE(B.waiting());
}

TEST(DeviceStatsBatcher, ManyBytesWaitingAreLaunched) {
  Launches L;
  DeviceStatsBatcher B(L.launcher());
  int64_t Half = int64_t(DeviceStatsBatcher::MaxUnlaunchedBytes / 2 / sizeof(float));
  auto A = B.defer(at::zeros({Half}), stream(0), false);
  EXPECT_TRUE(L.Made.empty());
  auto C = B.defer(at::zeros({Half}), stream(0), false);
  ASSERT_EQ(L.Made.size(), 1u);
  EXPECT_EQ(L.Made[0].first, 2u);
}

TEST(DeviceStatsBatcher, AWaitingReaderLaunchesThemAfterItsPatience) {
  Launches L;
  DeviceStatsBatcher B(L.launcher(), std::chrono::milliseconds(5));
  auto S = B.defer(at::full({4}, 3.0), stream(0), false);
  std::optional<TensorStats> Got;
  std::thread Writer([&] { Got = S->resolve(); });
  Writer.join();
  ASSERT_TRUE(Got);
  EXPECT_EQ(Got->Sum, 12.0);
  ASSERT_EQ(L.Made.size(), 1u);
  EXPECT_NE(L.LastThread, std::this_thread::get_id());
}

TEST(DeviceStatsBatcher, AReaderTakesTheProgramsLaunchWhenItComes) {
  Launches L;
  DeviceStatsBatcher B(L.launcher(), std::chrono::seconds(30));
  auto S = B.defer(at::full({4}, 3.0), stream(0), false);
  std::optional<TensorStats> Got;
  std::thread Writer([&] { Got = S->resolve(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  B.launchAll(); // the program's thread, at the root's end
  Writer.join();
  ASSERT_TRUE(Got);
  EXPECT_EQ(Got->Sum, 12.0);
  ASSERT_EQ(L.Made.size(), 1u);
  EXPECT_EQ(L.LastThread, std::this_thread::get_id());
}

TEST(DeviceStatsBatcher, AFailedLaunchLeavesThemWithout) {
  Launches L;
  L.Fail = true;
  DeviceStatsBatcher B(L.launcher());
  auto S = B.defer(at::ones({4}), stream(0), true);
  EXPECT_FALSE(S->resolve());
}

TEST(DeviceStatsBatcher, TensorsAreHeldUntilTheirStatisticsAreRead) {
  Launches L;
  DeviceStatsBatcher B(L.launcher());
  at::Tensor X = at::ones({4});
  auto S = B.defer(X, stream(0), false);
  EXPECT_EQ(X.use_count(), 2);
  B.releaseSettled(); // not launched: kept
  EXPECT_EQ(X.use_count(), 2);
  B.launchAll();
  B.releaseSettled(); // launched, not read: kept (the device may read it yet)
  EXPECT_EQ(X.use_count(), 2);
  EXPECT_TRUE(B.holding());
  S->resolve();
  B.releaseSettled();
  EXPECT_EQ(X.use_count(), 1);
  EXPECT_FALSE(B.holding());
}

TEST(DeviceStatsBatcher, AWriteAfterTheLaunchLaunchesNothingMore) {
  Launches L;
  DeviceStatsBatcher B(L.launcher());
  at::Tensor X = at::ones({8});
  auto S = B.defer(X, stream(0), false);
  B.launchAll();
  B.beforeWrite(X);
  EXPECT_EQ(L.Made.size(), 1u);
  EXPECT_EQ(S->resolve()->Sum, 8.0);
}

// A storage freed or moved outside ops (UntypedStorage.resize_, which
// FSDP uses to free parameters) before the launch: its memory is not read.
TEST(DeviceStatsBatcher, AStorageMovedBeforeTheLaunchIsNotRead) {
  Launches L;
  DeviceStatsBatcher B(L.launcher());
  at::Tensor X = at::ones({8}), Y = at::ones({4});
  auto SX = B.defer(X, stream(0), false);
  auto SY = B.defer(Y, stream(0), false);
  X.storage().set_data_ptr_noswap(c10::GetAllocator(c10::kCPU)->allocate(8 * sizeof(float)));
  B.launchAll();
  ASSERT_EQ(L.Made.size(), 1u);
  EXPECT_EQ(L.Made[0].first, 1u); // Y's alone
  EXPECT_FALSE(SX->resolve());
  EXPECT_EQ(SY->resolve()->Sum, 4.0);
}

// Past MaxHeldBytes held, a tensor is launched at once and not held.
TEST(DeviceStatsBatcher, HeldBytesAreBounded) {
  Launches L;
  DeviceStatsBatcher B(L.launcher());
  int64_t Quarter = int64_t(DeviceStatsBatcher::MaxHeldBytes / 4 / sizeof(float));
  std::vector<at::Tensor> Ts;
  std::vector<std::shared_ptr<DeferredStats>> Stats;
  for (int I = 0; I < 4; ++I) { // held: waiting, then launched unread
    Ts.push_back(at::empty({Quarter}));
    Stats.push_back(B.defer(Ts.back(), stream(0), false));
    EXPECT_EQ(Ts.back().use_count(), 2) << I;
  }
  size_t Before = L.Made.size();
  at::Tensor Over = at::ones({16});
  auto S = B.defer(Over, stream(0), false);
  EXPECT_EQ(L.Made.size(), Before + 1); // launched at once
  EXPECT_EQ(Over.use_count(), 1);       // and not held
  EXPECT_EQ(S->resolve()->Sum, 16.0);
  for (auto &St : Stats)
    St->resolve();
  B.releaseSettled();
  at::Tensor Again = at::ones({16});
  B.defer(Again, stream(0), false);
  EXPECT_EQ(Again.use_count(), 2); // held again, the others released
}

// A tensor not held is let go after the batcher's lock: its last reference
// may free memory through an allocator whose own lock another thread holds
// while it waits for the batcher's (the caching allocator records an event
// under its lock, and CUPTI's callback for that launches what waits).
TEST(DeviceStatsBatcher, ATensorIsLetGoOutsideTheLock) {
  std::mutex AllocatorLock;
  Launches L;
  DeviceStatsBatcher::LaunchFn Slow = [&, Inner = L.launcher()](const auto &Values,
                                                                 const c10::Stream &S) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return Inner(Values, S);
  };
  DeviceStatsBatcher B(Slow, std::chrono::milliseconds(20), /*MaxHeld=*/16);
  auto Run = std::async(std::launch::async, [&] {
    std::vector<float> *Memory = new std::vector<float>(64, 1.0f);
    at::Tensor Only = at::from_blob(
        Memory->data(), {64},
        [&, Memory](void *) {
          std::lock_guard<std::mutex> Lock(AllocatorLock);
          delete Memory;
        },
        at::kFloat);
    std::atomic<bool> Held{false};
    std::thread Other([&] {
      std::lock_guard<std::mutex> Lock(AllocatorLock); // inside the allocator
      Held = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      B.launchAll(); // an event recorded there: what waits is launched
    });
    while (!Held)
      std::this_thread::yield();
    auto S = B.defer(std::move(Only), stream(0), false); // over the cap: not held
    Other.join();
    return S->resolve()->Sum;
  });
  if (Run.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "deadlock: the batcher's lock held while a tensor was let go";
    std::_Exit(1); // the threads cannot be joined
  }
  EXPECT_EQ(Run.get(), 64.0);
}

TEST(DeviceStatsBatcher, SettleAllLaunchesAndReadsAndStopLaunchesAtOnce) {
  Launches L;
  DeviceStatsBatcher B(L.launcher());
  auto A = B.defer(at::ones({4}), stream(0), false);
  B.stop();
  B.settleAll();
  ASSERT_NE(A->settled(), nullptr);
  EXPECT_EQ((*A->settled())->Sum, 4.0);
  auto After = B.defer(at::ones({2}), stream(0), false);
  EXPECT_EQ(L.Made.size(), 2u); // launched as it came
  EXPECT_EQ(After->resolve()->Sum, 2.0);
}

} // namespace
