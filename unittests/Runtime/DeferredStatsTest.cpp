//===- DeferredStatsTest.cpp - Statistics computed later, writes seen first ===//
//
// A large host tensor's statistics are computed on the writer's thread, from
// the tensor itself. An op about to write to it (or to anything sharing its
// storage) settles them first; without that, the statistics would be of the
// changed values.
//
//===----------------------------------------------------------------------===//
#include "../../lib/Runtime/TensorRecording.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

using namespace ekka;

namespace {

at::Tensor large(double Value) { return at::full({256, 256}, Value); } // 256 KiB

TEST(DeferredStats, AWriteSettlesTheStatisticsOfTheValuesBefore) {
  DeferredStatsQueue Queue;
  at::Tensor T = large(2);
  std::shared_ptr<DeferredStats> Job = Queue.defer(T);
  ASSERT_TRUE(Job);
  EXPECT_TRUE(Queue.holding());
  EXPECT_EQ(Job->settled(), nullptr);
  // Through a view: the same storage.
  Queue.beforeWrite(T.select(0, 0));
  T.mul_(3);
  ASSERT_NE(Job->settled(), nullptr);
  const std::optional<TensorStats> &S = Job->resolve();
  ASSERT_TRUE(S);
  EXPECT_EQ(S->Sum, 2.0 * 65536);
  EXPECT_EQ(S->Max, 2.0);
}

TEST(DeferredStats, AWriteElsewhereLeavesThemPending) {
  DeferredStatsQueue Queue;
  at::Tensor T = large(1), Other = large(1);
  std::shared_ptr<DeferredStats> Job = Queue.defer(T);
  ASSERT_TRUE(Job);
  Queue.beforeWrite(Other);
  EXPECT_EQ(Job->settled(), nullptr);
  EXPECT_EQ(Job->resolve()->Sum, 65536.0);
}

TEST(DeferredStats, SmallNonContiguousAndUntracedTensorsAreComputedAtOnce) {
  DeferredStatsQueue Queue;
  EXPECT_FALSE(Queue.defer(at::ones({4, 4})));
  EXPECT_FALSE(Queue.defer(large(1).t().contiguous().t()));
  EXPECT_FALSE(Queue.defer(at::empty({256, 256}, at::kBits8))); // no trace type
  EXPECT_FALSE(Queue.holding());
}

TEST(DeferredStats, HeldTensorsAreReleasedOnceSettledAndBoundedInBytes) {
  DeferredStatsQueue Queue;
  at::Tensor T = large(1);
  std::shared_ptr<DeferredStats> Job = Queue.defer(T);
  ASSERT_TRUE(Job);
  EXPECT_EQ(T.use_count(), 2);
  Queue.releaseSettled(); // not settled: still held
  EXPECT_EQ(T.use_count(), 2);
  Job->resolve();
  Queue.releaseSettled();
  EXPECT_EQ(T.use_count(), 1);
  EXPECT_FALSE(Queue.holding());
  // Past the bound on the bytes held, statistics are computed at once (the
  // tensors are allocated, not touched).
  int64_t Third = int64_t(DeferredStatsQueue::MaxHeldBytes / 4 / 3);
  at::Tensor A = at::empty({Third}), B = at::empty({Third}), C = at::empty({2 * Third});
  EXPECT_TRUE(Queue.defer(A));
  EXPECT_TRUE(Queue.defer(B));
  EXPECT_FALSE(Queue.defer(C));
  Queue.settleAll();
  Queue.releaseSettled();
  EXPECT_TRUE(Queue.defer(C)); // released, room again
}

TEST(DeferredStats, NoTensorIsTakenOnceStopped) {
  DeferredStatsQueue Queue;
  Queue.stop();
  EXPECT_FALSE(Queue.defer(large(1)));
}

// A storage resized outside PyTorch's ops (UntypedStorage.resize_) may
// have freed the bytes: they are not read, and the loss is counted.
TEST(DeferredStats, AStorageChangedBehindTheOpsIsNotRead) {
  DeferredStatsQueue Queue;
  at::Tensor T = large(1);
  std::shared_ptr<DeferredStats> Job = Queue.defer(T);
  ASSERT_TRUE(Job);
  c10::StorageImpl *Storage = T.storage().unsafeGetStorageImpl();
  size_t Bytes = Storage->nbytes();
  Storage->set_nbytes(Bytes / 2);
  EXPECT_FALSE(Job->resolve());
  EXPECT_EQ(Queue.unavailable(), 1);
  Storage->set_nbytes(Bytes);
}

// The writer's thread and a program's thread settling at once: both see the
// same statistics, of the values handed over.
TEST(DeferredStats, TwoThreadsSettlingAtOnceGetTheSameStatistics) {
  for (int Round = 0; Round < 20; ++Round) {
    DeferredStatsQueue Queue;
    at::Tensor T = large(Round);
    std::shared_ptr<DeferredStats> Job = Queue.defer(T);
    ASSERT_TRUE(Job);
    std::optional<TensorStats> FromWriter;
    std::thread Writer([&] { FromWriter = Job->resolve(); });
    Queue.settleAll();
    Writer.join();
    ASSERT_TRUE(FromWriter);
    EXPECT_EQ(FromWriter->Sum, double(Round) * 65536);
    EXPECT_EQ(Job->resolve()->Sum, FromWriter->Sum);
  }
}

} // namespace
