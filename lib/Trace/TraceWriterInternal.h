//===- TraceWriterInternal.h - Writer's small records -----------*- C++ -*-===//
//
// The small records that the traced program's threads pack into chunks
// (TraceWriter.cpp) and that the writer's thread reads back into rows
// (TraceWriterStorage.cpp), the chunk that holds them, and the pace at
// which the queue between the two sides is drained. Private to lib/Trace.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_LIB_TRACE_TRACEWRITERINTERNAL_H
#define EKKA_LIB_TRACE_TRACEWRITERINTERNAL_H

#include "ekka/Trace/TraceWriter.h"

#include "llvm/ADT/StringRef.h"

#include <chrono>
#include <cstring>
#include <optional>
#include <type_traits>

namespace ekka {
namespace trace_writer {

using llvm::StringLiteral;
using llvm::StringRef;

/// The small records a chunk holds, each a header (its first byte the
/// kind) and, for a tensor, its statistics if it has them, then its shape
/// and strides.
enum class SmallKind : uint8_t { Op, Tensor, ModuleCall, Kernel, Span };
struct SmallOp {
  SmallKind Kind = SmallKind::Op;
  bool HasCall = false;
  int64_t Id, ModuleCallId, Seq;
  const TraceWriter::OpText *Text;
};
struct SmallModuleCall {
  SmallKind Kind = SmallKind::ModuleCall;
  bool HasParent = false;
  int64_t Id, ParentId, Seq, Step;
  const TraceWriter::ModuleText *Text;
};
struct SmallKernel {
  SmallKind Kind = SmallKind::Kernel;
  bool HasOp = false, HasCall = false;
  uint32_t Grid[3], Block[3];
  int64_t Id, OpId, ModuleCallId, Seq;
  uint64_t SharedMem, Stream, CorrelationId;
  const std::string *Name;
};
struct SmallSpan {
  SmallKind Kind = SmallKind::Span;
  SpanRecord Span;
};
struct SmallTensor {
  SmallKind Kind = SmallKind::Tensor;
  uint8_t Owner, Role, Type, Rank, StrideRank;
  bool HasStats, HasSource;
  int64_t Id, OwnerId, Index, SourceId;
  const std::string *Device;
};
static_assert(std::is_trivially_copyable_v<SmallOp> &&
              std::is_trivially_copyable_v<SmallModuleCall> &&
              std::is_trivially_copyable_v<SmallKernel> &&
              std::is_trivially_copyable_v<SmallTensor> &&
              std::is_trivially_copyable_v<SmallSpan> &&
              std::is_trivially_copyable_v<TensorStats>);

/// The small record of type \p T at \p P (any alignment), and P past it.
template <typename T> T takeSmall(const char *&P) {
  T Record;
  std::memcpy(&Record, P, sizeof Record);
  P += sizeof Record;
  return Record;
}

/// A small record's optional id: its value where its flag says it has one.
inline std::optional<int64_t> presentIf(bool Present, int64_t Id) {
  return Present ? std::optional<int64_t>(Id) : std::nullopt;
}

/// The roles a small record names by number.
constexpr StringLiteral SmallRoles[] = {"input", "output", "mutated", "argument"};
inline std::optional<uint8_t> smallRole(StringRef Role) {
  for (uint8_t I = 0; I < std::size(SmallRoles); ++I)
    if (Role == SmallRoles[I])
      return I;
  return std::nullopt;
}

/// The writer's thread, once a first record is queued, collects records
/// for WriterPeriod, or until this many are queued or captured bytes come:
/// the program's thread does not pay a wake-up (a system call, and a
/// thread switch on a busy machine) for every op.
inline constexpr size_t WakeRecords = 4096;
inline constexpr std::chrono::milliseconds WriterPeriod(20);
/// With nothing queued, the writer's thread looks at the threads' open
/// chunks this often.
inline constexpr std::chrono::milliseconds IdlePeriod(100);
/// A captured tensor's bytes wait in the open shard, its row with them,
/// until the shard is written: at ShardBytes, or once it is this old (so a
/// program killed later loses at most this much of its captures).
inline constexpr std::chrono::seconds ShardAge(2);
/// A program that records faster than SQLite takes rows (a loop of tiny
/// ops) waits once this many records are queued, as it does for bytes.
inline constexpr size_t MaxQueuedRecords = 1 << 18;

} // namespace trace_writer

/// A header and its bytes after it: a thread's chunk holds ChunkBytes; a
/// copy of a partly filled one, what it used.
struct TraceWriter::Chunk {
  const size_t Capacity;
  size_t Used = 0;
  size_t Records = 0;
  explicit Chunk(size_t Capacity) : Capacity(Capacity) {}
  char *data() { return reinterpret_cast<char *>(this + 1); }
  static ChunkPtr make(size_t Capacity) {
    static_assert(sizeof(Chunk) % alignof(int64_t) == 0, "records after it stay aligned");
    return ChunkPtr(new (::operator new(sizeof(Chunk) + Capacity)) Chunk(Capacity));
  }
};

} // namespace ekka

#endif
