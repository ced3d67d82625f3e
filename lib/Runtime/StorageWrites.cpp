//===- StorageWrites.cpp - Writes to module outputs' storages -------------===//
#include "StorageWrites.h"

#include <new>

namespace ekka {

namespace {
/// Made as the runtime is loaded, before any thread can record; replaced in
/// a forked child, which has one thread.
StorageWriteCounts *ProcessCounts = new StorageWriteCounts;
} // namespace

StorageWriteCounts &StorageWriteCounts::process() noexcept { return *ProcessCounts; }

void StorageWriteCounts::forgetInChild() noexcept {
  if (auto *Fresh = new (std::nothrow) StorageWriteCounts)
    ProcessCounts = Fresh;
}

std::optional<int64_t> StorageWriteCounts::watch(const void *Storage) noexcept {
  Stripe &S = stripeOf(Storage);
  try {
    std::lock_guard<std::mutex> Lock(S.Mutex);
    Entry &E = S.Counts[Storage];
    if (E.Watchers++ == 0) {
      Slots[slotOf(Storage)].fetch_add(1, std::memory_order_relaxed);
      Watching.fetch_add(1, std::memory_order_relaxed);
    }
    return E.Writes;
  } catch (...) {
    return std::nullopt; // out of memory: unwatched
  }
}

void StorageWriteCounts::unwatch(const void *Storage) noexcept {
  Stripe &S = stripeOf(Storage);
  std::lock_guard<std::mutex> Lock(S.Mutex);
  auto It = S.Counts.find(Storage);
  if (It == S.Counts.end() || --It->second.Watchers > 0)
    return;
  S.Counts.erase(It);
  Slots[slotOf(Storage)].fetch_sub(1, std::memory_order_relaxed);
  Watching.fetch_sub(1, std::memory_order_relaxed);
}

void StorageWriteCounts::countWrite(const void *Storage) noexcept {
  Stripe &S = stripeOf(Storage);
  std::lock_guard<std::mutex> Lock(S.Mutex);
  auto It = S.Counts.find(Storage);
  if (It != S.Counts.end())
    ++It->second.Writes;
}

int64_t StorageWriteCounts::writes(const void *Storage) const noexcept {
  const Stripe &S = stripeOf(Storage);
  std::lock_guard<std::mutex> Lock(S.Mutex);
  auto It = S.Counts.find(Storage);
  return It == S.Counts.end() ? 0 : It->second.Writes;
}

} // namespace ekka
