//===- StorageWritesTest.cpp - Writes counted to watched storages ---------===//
//
// The table behind the dataflow record (a module input is an earlier output
// only while no op wrote to its storage since): writes are counted for the
// storages watched, from any thread, and for no other; a storage is watched
// as often as it was asked to be, and its count goes with its last unwatch;
// a watch that cannot be made (out of memory) leaves nothing watched.
//
//===----------------------------------------------------------------------===//
#include "../../lib/Runtime/StorageWrites.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <thread>
#include <vector>

/// Allocations on this thread that fail (bad_alloc) before the next one
/// succeeds again: the table's out-of-memory path.
static thread_local int FailingAllocations = 0;

void *operator new(size_t Size) {
  if (FailingAllocations > 0) {
    --FailingAllocations;
    throw std::bad_alloc();
  }
  if (void *Memory = std::malloc(Size ? Size : 1))
    return Memory;
  throw std::bad_alloc();
}
void operator delete(void *Memory) noexcept { std::free(Memory); }
void operator delete(void *Memory, size_t) noexcept { std::free(Memory); }

using namespace ekka;

namespace {

/// Storages are only compared by address: any distinct addresses will do.
const void *storage(uintptr_t N) { return reinterpret_cast<const void *>(N * 64 + 4096); }

TEST(StorageWrites, CountsWritesToAWatchedStorageOnly) {
  auto Counts = std::make_unique<StorageWriteCounts>();
  const void *A = storage(1), *B = storage(2);
  EXPECT_FALSE(Counts->watching());
  Counts->noteWrite(A); // before it is watched: not counted
  EXPECT_EQ(Counts->watch(A), 0);
  EXPECT_TRUE(Counts->watching());
  Counts->noteWrite(A);
  Counts->noteWrite(A);
  Counts->noteWrite(B);
  EXPECT_EQ(Counts->writes(A), 2);
  EXPECT_EQ(Counts->writes(B), 0);
  // B was never watched: its writes left nothing behind.
  EXPECT_EQ(Counts->watch(B), 0);
}

TEST(StorageWrites, WatchesAreCountedAndTheLastUnwatchDropsTheCount) {
  auto Counts = std::make_unique<StorageWriteCounts>();
  const void *A = storage(1);
  EXPECT_EQ(Counts->watch(A), 0);
  Counts->noteWrite(A);
  // A second watch (another output over the same storage) sees the writes
  // since the first.
  EXPECT_EQ(Counts->watch(A), 1);
  Counts->noteWrite(A);
  Counts->unwatch(A);
  EXPECT_TRUE(Counts->watching());
  Counts->noteWrite(A); // still watched once
  EXPECT_EQ(Counts->writes(A), 3);
  Counts->unwatch(A);
  EXPECT_FALSE(Counts->watching());
  EXPECT_EQ(Counts->writes(A), 0);
  Counts->noteWrite(A);
  // Watched anew (a new allocation at the same address): from zero.
  EXPECT_EQ(Counts->watch(A), 0);
  EXPECT_EQ(Counts->writes(A), 0);
}

TEST(StorageWrites, AnUnwatchOfAStorageNotWatchedChangesNothing) {
  auto Counts = std::make_unique<StorageWriteCounts>();
  const void *A = storage(1), *B = storage(2);
  ASSERT_EQ(Counts->watch(A), 0);
  Counts->unwatch(B);
  EXPECT_TRUE(Counts->watching());
  Counts->noteWrite(A);
  EXPECT_EQ(Counts->writes(A), 1);
  Counts->unwatch(A);
  Counts->unwatch(A); // once too often
  EXPECT_FALSE(Counts->watching());
  EXPECT_EQ(Counts->watch(A), 0);
  EXPECT_TRUE(Counts->watching());
}

TEST(StorageWrites, WritesToStoragesSharingAWatchedSlotCountNothing) {
  auto Counts = std::make_unique<StorageWriteCounts>();
  const void *A = storage(0);
  ASSERT_EQ(Counts->watch(A), 0);
  // More storages than the table has slots: some share A's, and take the
  // stripe's lock to find that they are not watched.
  constexpr uintptr_t Others = 1 << 16;
  for (uintptr_t N = 1; N <= Others; ++N)
    Counts->noteWrite(storage(N));
  EXPECT_EQ(Counts->writes(A), 0);
  for (uintptr_t N = 1; N <= Others; ++N)
    ASSERT_EQ(Counts->writes(storage(N)), 0) << N;
  EXPECT_EQ(Counts->watch(storage(Others / 2)), 0);
}

TEST(StorageWrites, AWatchOutOfMemoryLeavesTheStorageUnwatched) {
  auto Counts = std::make_unique<StorageWriteCounts>();
  const void *A = storage(1);
  FailingAllocations = 1;
  EXPECT_EQ(Counts->watch(A), std::nullopt);
  FailingAllocations = 0;
  EXPECT_FALSE(Counts->watching());
  Counts->noteWrite(A);
  EXPECT_EQ(Counts->writes(A), 0);
  // Nothing half-made is left: the next watch is the first.
  EXPECT_EQ(Counts->watch(A), 0);
  Counts->noteWrite(A);
  EXPECT_EQ(Counts->writes(A), 1);
  Counts->unwatch(A);
  EXPECT_FALSE(Counts->watching());
}

TEST(StorageWrites, AWatchedStorageOutOfMemoryKeepsItsCount) {
  auto Counts = std::make_unique<StorageWriteCounts>();
  const void *A = storage(1);
  ASSERT_EQ(Counts->watch(A), 0);
  Counts->noteWrite(A);
  // Watched already: no allocation, so none to fail.
  FailingAllocations = 1;
  EXPECT_EQ(Counts->watch(A), 1);
  FailingAllocations = 0;
  Counts->unwatch(A);
  Counts->unwatch(A);
  EXPECT_FALSE(Counts->watching());
}

TEST(StorageWrites, WritesFromManyThreadsAreAllCounted) {
  auto Counts = std::make_unique<StorageWriteCounts>();
  const void *A = storage(1);
  ASSERT_EQ(Counts->watch(A), 0);
  constexpr int Threads = 4, Writes = 250000;
  std::atomic<int> Running{Threads};
  std::atomic<bool> Start{false};
  std::vector<std::thread> Writers;
  for (int T = 0; T < Threads; ++T)
    Writers.emplace_back([&] {
      while (!Start.load())
        std::this_thread::yield();
      for (int I = 0; I < Writes; ++I)
        Counts->noteWrite(A);
      --Running;
    });
  Start = true;
  // Meanwhile other storages are watched, written and let go, some of them
  // in A's stripe.
  for (uintptr_t N = 2; Running.load(); ++N) {
    if (Counts->watch(storage(N)) != 0)
      ADD_FAILURE() << "a fresh storage had writes";
    Counts->noteWrite(storage(N));
    Counts->unwatch(storage(N));
  }
  for (std::thread &W : Writers)
    W.join();
  EXPECT_EQ(Counts->writes(A), int64_t(Threads) * Writes);
  Counts->unwatch(A);
  EXPECT_FALSE(Counts->watching());
}

} // namespace
