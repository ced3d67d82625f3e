//===- StorageWrites.h - Writes to module outputs' storages -----*- C++ -*-===//
//
// A module input that is an earlier module's output, unchanged, is recorded
// as that output (the dataflow record). A version counter cannot tell
// whether it is unchanged: an inference tensor has none, and a write through
// `.data` or `detach()` bumps the counter of another TensorImpl over the same
// storage. So the op observer counts, on every thread, the ops that begin to
// write to each storage that holds a recorded output, and a module input is
// the output it was only while that count is the same.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_LIB_RUNTIME_STORAGEWRITES_H
#define EKKA_LIB_RUNTIME_STORAGEWRITES_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace ekka {

/// Counts of the writes to watched storages, by the storage's address, from
/// every thread. A write to a storage nobody watches costs one relaxed atomic
/// load (a slot of watchers by the address's hash), takes no lock and counts
/// nothing; one to a watched storage, or to another that shares its slot,
/// takes the lock of a stripe of the table. Never throws.
class StorageWriteCounts {
public:
  /// Starts watching \p Storage (once more, if it is watched already) and
  /// returns the writes counted so far (since it was first watched); none
  /// if it could not (out of memory), and then it is not watched.
  std::optional<int64_t> watch(const void *Storage) noexcept;
  /// Undoes one watch(); the count is dropped with the last.
  void unwatch(const void *Storage) noexcept;
  /// An op is about to write to \p Storage.
  void noteWrite(const void *Storage) noexcept {
    if (Watching.load(std::memory_order_relaxed) &&
        Slots[slotOf(Storage)].load(std::memory_order_relaxed))
      countWrite(Storage);
  }
  /// The writes to \p Storage counted since it was first watched; 0 if it
  /// is not watched.
  int64_t writes(const void *Storage) const noexcept;
  /// Whether any storage is watched: else the observer need not look.
  bool watching() const noexcept { return Watching.load(std::memory_order_relaxed) != 0; }
  /// How many storages are watched.
  int64_t watched() const noexcept { return Watching.load(std::memory_order_relaxed); }

  /// The table every thread of the process counts in. Never destroyed: a
  /// thread's state may let go of its watches after static destructors ran.
  static StorageWriteCounts &process() noexcept;
  /// In a forked child: a table of its own (the parent's stripes may be
  /// locked by threads the child does not have); the old one is leaked.
  static void forgetInChild() noexcept;

private:
  static constexpr size_t NumSlots = 1 << 14, NumStripes = 32;
  static size_t hashOf(const void *Storage) noexcept {
    uint64_t H = reinterpret_cast<uintptr_t>(Storage);
    H ^= H >> 33;
    H *= 0xff51afd7ed558ccdULL; // MurmurHash3's finaliser: allocations are aligned
    H ^= H >> 33;
    return size_t(H);
  }
  static size_t slotOf(const void *Storage) noexcept { return hashOf(Storage) % NumSlots; }
  void countWrite(const void *Storage) noexcept;

  struct Entry {
    int64_t Watchers = 0;
    int64_t Writes = 0;
  };
  struct Stripe {
    mutable std::mutex Mutex;
    std::unordered_map<const void *, Entry> Counts;
  };
  Stripe &stripeOf(const void *Storage) noexcept {
    return Stripes[(hashOf(Storage) / NumSlots) % NumStripes];
  }
  const Stripe &stripeOf(const void *Storage) const noexcept {
    return Stripes[(hashOf(Storage) / NumSlots) % NumStripes];
  }

  std::atomic<int64_t> Watching{0}; ///< Storages watched.
  std::atomic<uint32_t> Slots[NumSlots] = {}; ///< Storages watched, by slot.
  Stripe Stripes[NumStripes];
};

} // namespace ekka

#endif // EKKA_LIB_RUNTIME_STORAGEWRITES_H
