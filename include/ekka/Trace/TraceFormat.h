//===- TraceFormat.h - What an Ekka trace directory holds ------*- C++ -*-===//
//
// A trace is a directory that a Python user can open with the standard
// `sqlite3` and `safetensors` modules — no pickle anywhere:
//   trace.db                    SQLite: meta, module_calls, ops, kernels, tensors,
//                               spans
//   tensors-NNNN.safetensors    captured tensor bytes, in bounded shards
//   rank-N/                     one such directory per rank of a multi-rank run
// docs/TraceFormat.md is the user-facing description of the schema.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_TRACE_TRACEFORMAT_H
#define EKKA_TRACE_TRACEFORMAT_H

#include "ekka/Support/TensorDims.h"

#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ekka {

/// Readers refuse a trace of a newer major version; minor versions only add.
constexpr int TraceFormatMajor = 1;
/// 1.1: tensors.source_id; 1.2: complex dtypes; 1.3: fnuz, e8m0 and fp4
/// dtypes; 1.4: tensors.layout (sparse, nested and quantized tensors); 1.5:
/// layout `jagged` (a jagged nested tensor's packed values); 1.6: meta dtype;
/// 1.7: a rank's rank-N/started marker; 1.8: spans (when each module call
/// and op ran, on which thread)
constexpr int TraceFormatMinor = 8;

constexpr llvm::StringLiteral TraceDatabaseName = "trace.db";
/// The file a rank of a distributed run leaves in its rank-N/ directory as
/// it begins (its trace.db comes at its first module call, if any).
constexpr llvm::StringLiteral StartedMarkerName = "started";
/// The meta key that says what a trace lacks ("0": nothing), written as
/// tracing stops; a trace without it was not closed. The writer adds the
/// captures whose shard it could not write.
constexpr llvm::StringLiteral LostRecordsKey = "lost_records";

/// The SQL that creates an empty trace database.
llvm::StringRef traceSchema();
/// The SQL that indexes a trace's tables (owner lookups, a module call's
/// ops, an op's kernels). A writer runs it when it closes (or flushes
/// before an exec), not at the start: keeping three indexes up to date at
/// every row cost a quarter of its time. A trace whose program was killed
/// has the tables without them, which queries only take longer on.
llvm::StringRef traceIndexes();

/// Element types, named as safetensors names them. The complex ones hold
/// a real and an imaginary part of half, single or double precision; of
/// those safetensors has only C64. The 8-bit floats: e4m3fn and e5m2
/// (OCP), their "fnuz" variants (AMD's: one more in the exponent's bias,
/// NaN where negative zero would be, no infinities), and e8m0 (a power of
/// two, the scales of MX formats). F4 is e2m1, two to a byte, the first
/// in the low four bits (torch.float4_e2m1fn_x2): a tensor's shape counts
/// its 4-bit elements, as safetensors' does (torch's counts bytes).
enum class DType {
  Bool, U8, I8, I16, U16, I32, U32, I64, U64, F16, BF16, F32, F64, F8E4M3, F8E5M2,
  C32, C64, C128, F8E4M3FNUZ, F8E5M2FNUZ, F8E8M0, F4 // new types before F4: parseDType's end
};

/// "F32", "BF16", "F8_E4M3", "C64", "F4", ...
llvm::StringRef dtypeName(DType T);
std::optional<DType> parseDType(llvm::StringRef Name);
/// Bits per element: 4 for F4, else a whole number of bytes.
unsigned dtypeBits(DType T);
/// The bytes that \p Elements elements take (F4: half as many, rounded
/// up); nullopt where that does not fit in 64 bits.
std::optional<uint64_t> dtypeBytes(DType T, uint64_t Elements);

/// How much a trace holds: what a writer has recorded so far, or what a
/// reader counts in a trace.
struct TraceCounts {
  uint64_t ModuleCalls = 0, Ops = 0, Kernels = 0, Tensors = 0;
  uint64_t CapturedTensors = 0, CapturedBytes = 0, Shards = 0;
  uint64_t DroppedCaptures = 0; ///< Lost after a write error (full disk); writer only.
  /// How often, and for how long in all, the program's threads waited for
  /// room in the writer's queue (it writes slower than they record);
  /// writer only.
  uint64_t RoomWaits = 0, RoomWaitNanos = 0;
};
/// Whether a safetensors file can hold it (all but C32 and C128): only such
/// tensors are captured.
bool storableDType(DType T);
/// The type of a complex type's parts (F16, F32, F64); \p T itself if real.
DType partType(DType T);

/// The file name of shard \p Index: tensors-0000.safetensors, ...
std::string shardFileName(unsigned Index);

/// What a tensor belongs to, as the `tensors.owner` column says it.
enum class TensorOwner { ModuleCall, Op, Kernel };
llvm::StringRef ownerName(TensorOwner O);
std::optional<TensorOwner> parseOwner(llvm::StringRef Name);

/// Cheap statistics recorded for every tensor seen, captured or not.
struct TensorStats {
  double Sum = 0, SumSq = 0, Min = 0, Max = 0;
  int64_t NanCount = 0, InfCount = 0;
};

/// Half and bfloat16 bits to double.
double halfToDouble(uint16_t Bits);
double bfloat16ToDouble(uint16_t Bits);
double float8e4m3ToDouble(uint8_t Bits); ///< e4m3fn (no infinities)
double float8e5m2ToDouble(uint8_t Bits);
double float8e4m3fnuzToDouble(uint8_t Bits);
double float8e5m2fnuzToDouble(uint8_t Bits);
double float8e8m0ToDouble(uint8_t Bits);
double float4e2m1ToDouble(uint8_t Bits); ///< the low four bits of \p Bits
/// The values that one byte of \p T holds (two for F4, first the low
/// bits'), into \p Out; how many. 0 if \p T's elements are not bytes.
unsigned valuesOfByte(DType T, uint8_t Byte, double Out[2]);

/// The statistics of a contiguous tensor's bytes, in one pass. A complex
/// tensor's are those of its parts, real and imaginary together, as
/// torch.view_as_real lays them out: the sum of squares is that of the
/// magnitudes; a NaN or infinity is counted per part.
std::optional<TensorStats> statsOfBytes(DType Type, llvm::StringRef Bytes);
/// The statistics of a tensor of a type whose elements are bytes (or F4's
/// pairs) from how many of its bytes hold each value, \p Counts[256] (how
/// statsOfBytes reads F4, two values to a byte). nullopt for other types.
std::optional<TensorStats> statsOfByteCounts(DType Type, const int64_t *Counts);

struct ModuleCallRecord {
  int64_t Id = 0;
  std::optional<int64_t> ParentId;
  int64_t Seq = 0;  ///< Execution order (pre-order) within the rank.
  int64_t Step = 0; ///< Which forward of the root module this call is part of.
  std::string Path; ///< `model.layers.1.mlp`
  std::string ClassName, ClassQualname;
  std::string SourceFile;
  int64_t SourceLine = 0;
};

struct OpRecord {
  int64_t Id = 0;
  std::optional<int64_t> ModuleCallId;
  int64_t Seq = 0;
  std::string Name;   ///< `aten::mm`, `zoo::paged_attention`
  std::string Schema; ///< `aten::mm(Tensor self, Tensor mat2) -> Tensor`
};

struct KernelRecord {
  int64_t Id = 0;
  std::optional<int64_t> OpId, ModuleCallId;
  int64_t Seq = 0;
  std::string Name; ///< As CUPTI reports it (mangled)
  uint32_t Grid[3] = {0, 0, 0}, Block[3] = {0, 0, 0};
  uint64_t SharedMem = 0, Stream = 0, CorrelationId = 0;
};

struct TensorRecord {
  int64_t Id = 0;
  TensorOwner Owner = TensorOwner::ModuleCall;
  int64_t OwnerId = 0;
  std::string Role; ///< input | output | mutated | argument (a kernel's buffer)
  int64_t Index = 0; ///< Position among the owner's tensors of that role.
  DType Type = DType::F32;
  TensorDims Shape, Strides;
  std::string Device; ///< `cpu`, `cuda:0`
  std::optional<TensorStats> Stats;
  /// Set when the bytes were captured: which shard, under which key.
  std::string Shard, Key;
  /// For a module call's input: the tensor (a module call's output) it is,
  /// unchanged since. The dataflow between module calls.
  std::optional<int64_t> SourceId;
  /// Empty for a strided tensor; else `sparse_coo`, `sparse_csr`,
  /// `sparse_csc`, `sparse_bsr`, `sparse_bsc`, `nested` or `quantized`,
  /// whose statistics are those of its values as dense (see TraceFormat.md).
  std::string Layout;
};
/// When a module call or an op ran, and on which thread: the timeline of a
/// trace (`ekka-trace export --perfetto`). Times are nanoseconds of the
/// traced process's monotonic clock (CLOCK_MONOTONIC), from the call's
/// entry, its inputs recorded, to its exit, before its outputs are; an op's
/// likewise. A call that raised has none. Traces before 1.8 have none.
struct SpanRecord {
  TensorOwner Owner = TensorOwner::ModuleCall; ///< module_call or op
  int64_t OwnerId = 0;
  int64_t Thread = 0; ///< The OS thread id (gettid()), as `ps -L` shows it.
  int64_t StartNs = 0, EndNs = 0;
};

/// A queue of records that grows moves them (TensorDims).
static_assert(std::is_nothrow_move_constructible_v<TensorRecord>);

} // namespace ekka

#endif
