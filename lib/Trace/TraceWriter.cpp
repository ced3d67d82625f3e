//===- TraceWriter.cpp ----------------------------------------------------===//
#include "ekka/Trace/TraceWriter.h"
#include "ekka/Support/Error.h"
#include "ekka/Support/QuietThread.h"
#include "ekka/Support/SQLite.h"
#include "ekka/Trace/SafeTensors.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cassert>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstring>
#include <pthread.h>
#include <thread>

using namespace llvm;

namespace ekka {

namespace {

/// `[1,4,32]`, as llvm::json writes an array of integers, into \p Out
/// without building one (twice for every tensor row the writer inserts;
/// \p Out keeps its capacity from row to row).
void jsonInts(ArrayRef<int64_t> V, std::string &Out) {
  Out.assign(1, '[');
  char Digits[24];
  for (size_t I = 0; I < V.size(); ++I) {
    if (I)
      Out += ',';
    auto [End, Ec] = std::to_chars(Digits, Digits + sizeof(Digits), V[I]);
    (void)Ec; // 24 characters hold any int64
    Out.append(Digits, End);
  }
  Out += ']';
}

void dim3(const uint32_t D[3], std::string &Out) {
  jsonInts({int64_t(D[0]), int64_t(D[1]), int64_t(D[2])}, Out);
}

/// One table's rows, inserted up to MaxRows by one statement. What SQLite
/// does once a statement (starting its program, opening the table, halting,
/// growing the record's buffer again) is about a fifth of a row's cost when
/// each row has its own; many rows share it. A row's values wait here until
/// flush(), which the writer calls before it commits: a text is referenced,
/// and must stay valid until then (the writer's interned names, the batch's
/// records), unless it is the row's own (own()).
class TableRows {
public:
  static constexpr unsigned MaxRows = 32;
  /// In row(): the column's own text, filled through own() before.
  struct Owned {};

  explicit TableRows(unsigned Width)
      : Width(Width), Cells(MaxRows * Width), OwnTexts(MaxRows * Width) {}

  /// Prepares its statements: \p Insert is `INSERT INTO t(a, b, ...)`,
  /// naming Width columns.
  Error prepare(SQLiteDatabase &Db, StringRef Insert) {
    std::string Row = "(?";
    for (unsigned I = 1; I < Width; ++I)
      Row += ",?";
    Row += ')';
    for (unsigned Log = 0; (1u << Log) <= MaxRows; ++Log) {
      std::string SQL = Insert.str() + " VALUES" + Row;
      for (unsigned R = 1; R < (1u << Log); ++R)
        SQL += "," + Row;
      auto S = Db.prepare(SQL);
      if (!S)
        return S.takeError();
      Statements[Log] = std::move(*S);
      Bound[Log].assign((1u << Log) * Width, Cell::unbound());
    }
    return Error::success();
  }

  /// The values of the row being filled, by column (1-based, as SQLite's
  /// parameters).
  void set(unsigned Column, int64_t V) { cell(Column) = Cell::integer(V); }
  void set(unsigned Column, std::optional<int64_t> V) {
    cell(Column) = V ? Cell::integer(*V) : Cell();
  }
  void setReal(unsigned Column, double V) {
    Cell &C = cell(Column);
    C.Kind = Cell::Real;
    C.AsReal = V;
  }
  void setNull(unsigned Column) { cell(Column) = Cell(); }
  /// \p Text, valid until flush().
  void setText(unsigned Column, StringRef Text) { cell(Column) = Cell::text(Text); }
  /// The row's own text for \p Column, to fill; it keeps its capacity.
  std::string &own(unsigned Column) {
    std::string &T = OwnTexts[Rows * Width + Column - 1];
    Cell &C = cell(Column);
    C.Kind = Cell::OwnText;
    C.AsOwn = &T;
    return T;
  }

  /// A row of these values, by column in order: numbers, NULL where an
  /// optional has none, texts (valid until flush()), and Owned{} for a
  /// column whose own text own() gave.
  template <typename... Values> Error row(const Values &...V) {
    static_assert(sizeof...(Values) > 0);
    if (sizeof...(Values) != Width) // else an earlier row's cells would stay
      return makeError("internal error: a row of " + Twine(sizeof...(Values)) +
                       " values for a table of " + Twine(Width) + " columns");
    unsigned Column = 0;
    (put(++Column, V), ...);
    return add();
  }

  /// The row is filled: the next is another. Inserts them all once
  /// MaxRows wait.
  Error add() {
    if (++Rows < MaxRows)
      return Error::success();
    return flush();
  }

  /// Inserts the rows that wait, in statements of 32, 16, ... 1 rows. They
  /// are gone afterwards, inserted or not. A parameter is bound only where
  /// it does not hold the value already: SQLite keeps a statement's
  /// bindings from one run to the next, and a binding costs about as much
  /// as a column's share of the insert. A text is bound without a copy
  /// (SQLite reads its bytes when the statement runs), so one at the
  /// address and of the length that a parameter holds is bound already.
  Error flush() {
    unsigned Done = 0;
    for (int Log = std::size(Statements) - 1; Log >= 0 && Done < Rows; --Log) {
      unsigned Size = 1u << Log;
      if (Rows - Done < Size)
        continue;
      SQLiteStatement &S = Statements[Log];
      std::vector<Cell> &Holds = Bound[Log];
      for (unsigned I = 0; I < Size * Width; ++I) {
        Cell C = Cells[Done * Width + I];
        if (C.Kind == Cell::OwnText)
          C = Cell::text(*C.AsOwn);
        if (C.sameAs(Holds[I]))
          continue;
        Holds[I] = C;
        int Parameter = int(I + 1);
        switch (C.Kind) {
        case Cell::Unbound:
        case Cell::OwnText:
          break;
        case Cell::Null:
          S.bindNull(Parameter);
          break;
        case Cell::Integer:
          S.bind(Parameter, C.AsInteger);
          break;
        case Cell::Real:
          S.bindDouble(Parameter, C.AsReal);
          break;
        case Cell::Text:
          S.bindKept(Parameter, StringRef(C.AsText, C.Size));
          break;
        }
      }
      if (Error E = S.runRebound()) {
        Rows = 0;
        return E;
      }
      Done += Size;
    }
    Rows = 0;
    return Error::success();
  }

  /// Drops the rows that wait.
  void clear() { Rows = 0; }

private:
  void put(unsigned Column, int64_t V) { set(Column, V); }
  void put(unsigned Column, const std::optional<int64_t> &V) { set(Column, V); }
  void put(unsigned Column, StringRef V) { setText(Column, V); }
  void put(unsigned, Owned) {}

  struct Cell {
    enum Kind : uint8_t { Null, Integer, Real, Text, OwnText, Unbound };
    Kind Kind = Null;
    size_t Size = 0; ///< Text's.
    union {
      int64_t AsInteger = 0;
      double AsReal;
      const char *AsText;
      const std::string *AsOwn;
    };
    static Cell integer(int64_t V) {
      Cell C;
      C.Kind = Cell::Integer;
      C.AsInteger = V;
      return C;
    }
    static Cell text(StringRef Text) {
      Cell C;
      C.Kind = Cell::Text;
      C.AsText = Text.data();
      C.Size = Text.size();
      return C;
    }
    static Cell unbound() {
      Cell C;
      C.Kind = Unbound;
      return C;
    }
    /// Whether binding this where \p Bound was bound leaves the parameter
    /// as it is (never where nothing was bound).
    bool sameAs(const Cell &Bound) const {
      if (Kind != Bound.Kind)
        return false;
      switch (Kind) {
      case Null:
        return true;
      case Integer:
        return AsInteger == Bound.AsInteger;
      case Real: // bit for bit: 0.0 is not -0.0 (a NaN is never bound)
        return std::memcmp(&AsReal, &Bound.AsReal, sizeof AsReal) == 0;
      case Text:
        return AsText == Bound.AsText && Size == Bound.Size;
      default:
        return false;
      }
    }
  };
  Cell &cell(unsigned Column) { return Cells[Rows * Width + Column - 1]; }

  const unsigned Width;
  std::vector<Cell> Cells;         ///< MaxRows rows of Width.
  std::vector<std::string> OwnTexts; ///< The cells' own texts, where they have one.
  unsigned Rows = 0;               ///< Filled so far.
  SQLiteStatement Statements[6];   ///< Of 1, 2, 4, ..., MaxRows rows.
  std::vector<Cell> Bound[6];      ///< What each one's parameters hold.
};
static_assert(TableRows::MaxRows == 1u << 5, "a statement for each power of two up to it");

/// A chunk's bytes: a few hundred ops with their outputs.
constexpr size_t ChunkBytes = 64 << 10;
/// Written chunks kept for reuse, beyond those in use.
constexpr size_t PooledChunks = 64;

/// The small records a chunk holds, each a header (its first byte the
/// kind) and, for a tensor, its statistics if it has them, then its shape
/// and strides.
enum class SmallKind : uint8_t { Op, Tensor, ModuleCall, Kernel };
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
              std::is_trivially_copyable_v<TensorStats>);

/// The small record of type \p T at \p P (any alignment), and P past it.
template <typename T> T takeSmall(const char *&P) {
  T Record;
  std::memcpy(&Record, P, sizeof Record);
  P += sizeof Record;
  return Record;
}

/// A small record's optional id: its value where its flag says it has one.
std::optional<int64_t> presentIf(bool Present, int64_t Id) {
  return Present ? std::optional<int64_t>(Id) : std::nullopt;
}

/// The roles a small record names by number.
constexpr StringLiteral SmallRoles[] = {"input", "output", "mutated", "argument"};
std::optional<uint8_t> smallRole(StringRef Role) {
  for (uint8_t I = 0; I < std::size(SmallRoles); ++I)
    if (Role == SmallRoles[I])
      return I;
  return std::nullopt;
}

/// Counts forks: a forked child's copy of a thread's buffer is the
/// parent's, which the child must neither write nor lock.
std::atomic<uint64_t> ForkGeneration{0};
std::atomic<uint64_t> NextWriterSerial{0};

} // namespace

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
void TraceWriter::ChunkDeleter::operator()(Chunk *C) const {
  C->~Chunk();
  ::operator delete(C);
}

namespace {
/// A thread buffer's lock. Its usual holder, the buffer's own thread, takes
/// and leaves it at every record (twice an op), with one atomic instruction
/// each way where a std::mutex's pair runs about 90 instructions. The others
/// seldom want it: the writer's thread only tries it; close(), a flush and
/// the thread's end wait for it. A wait may be long: the owner holds the
/// lock while it waits for room in the queue, and a flush holds another
/// thread's while it does; a waiter yields the processor, then sleeps.
class BufferLock {
public:
  bool try_lock() { return !Held.exchange(true, std::memory_order_acquire); }
  void lock() {
    if (!try_lock())
      wait();
  }
  void unlock() { Held.store(false, std::memory_order_release); }

private:
  [[gnu::noinline]] void wait() {
    for (int Tries = 1;; ++Tries) {
      if (!Held.load(std::memory_order_relaxed) && try_lock())
        return;
      if (Tries < 64)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(Tries < 256 ? 50 : 500));
    }
  }
  std::atomic<bool> Held{false};
};
} // namespace

/// A thread's open chunk for one writer. The thread fills it; close(), a
/// later meta value, the writer's thread and the thread's end take what it
/// holds, under Mutex.
class TraceWriter::ThreadBuffer {
public:
  explicit ThreadBuffer(TraceWriter &Owner)
      : Owner(&Owner), WriterSerial(Owner.Serial), Fork(ForkGeneration.load()) {}
  BufferLock Mutex;
  TraceWriter *const Owner; ///< Alive while the buffer is not Closed.
  const uint64_t WriterSerial;
  const uint64_t Fork;      ///< The process's ForkGeneration when it was made.
  ChunkPtr Open;
  const std::string *Device = nullptr; ///< The device named last, interned.
  bool Closed = false;                 ///< The writer closed, or the thread ended.
};

/// What the background thread owns: the database, the open shard and the
/// tensor rows waiting for it.
class TraceWriter::Backend {
public:
  Backend(TraceWriter &Owner, std::string Dir, std::unique_ptr<SQLiteDatabase> Db,
          uint64_t ShardBytes)
      : Db(std::move(Db)), Owner(Owner), Dir(std::move(Dir)), ShardBytes(ShardBytes) {}

  Error prepare() {
    auto P = Db->prepare("INSERT OR REPLACE INTO meta(key, value) VALUES(?1, ?2)");
    if (!P)
      return P.takeError();
    Meta = std::move(*P);
    if (Error E = Calls.prepare(*Db, "INSERT INTO module_calls(id, parent_id, seq, step, path, "
                                     "class_name, class_qualname, source_file, source_line)"))
      return E;
    if (Error E = Ops.prepare(*Db, "INSERT INTO ops(id, module_call_id, seq, name, schema)"))
      return E;
    if (Error E = Kernels.prepare(*Db, "INSERT INTO kernels(id, op_id, module_call_id, seq, "
                                       "name, grid, block, shared_mem, stream, correlation_id)"))
      return E;
    return Tensors.prepare(*Db, "INSERT INTO tensors(id, owner, owner_id, role, idx, dtype, "
                                "shape, strides, device, sum, sumsq, min, max, nan_count, "
                                "inf_count, shard, key, source_id, layout)");
  }

  /// Writes one batch of queued items in one transaction.
  Error write(std::vector<Item> &Items, TraceCounts &Counts) {
    if (Error E = Db->exec("BEGIN"))
      return E;
    auto AddAll = [&]() -> Error {
      for (Item &I : Items)
        if (Error E = std::visit([&](auto &R) { return add(R, Counts); }, I))
          return E;
      return flushRows(); // their texts are the batch's: before it goes
    };
    if (Error E = AddAll()) {
      clearRows();
      consumeError(Db->exec("ROLLBACK"));
      return E;
    }
    if (Error E = Db->exec("COMMIT"))
      return E;
    if (Shard.dataBytes() >= ShardBytes)
      return flushShard(Counts);
    return Error::success();
  }

  /// Writes the open shard, then the rows of the tensors it holds. Where
  /// the shard cannot be written (a full disk, a file size limit), capture
  /// stops: its tensors' rows, and every later captured tensor's, are
  /// written with their statistics and no bytes, meta lost_records says
  /// how many and why, and the error is kept (captureError()).
  Error flushShard(TraceCounts &Counts) {
    if (Shard.empty())
      return Error::success();
    std::string Name = shardFileName(NextShard);
    SmallString<256> Path(Dir);
    sys::path::append(Path, Name);
    if (Error E = Shard.writeTo(Path, {{"format", "ekka-trace"}})) {
      CaptureError = toString(std::move(E));
      return writeUncaptured(Counts);
    }
    ++NextShard;
    ++Counts.Shards;
    Counts.CapturedBytes += Shard.dataBytes();
    Counts.CapturedTensors += Pending.size();
    for (std::string &Buffer : Shard.takeBuffers())
      Owner.recycle(std::move(Buffer));
    if (Error E = Db->exec("BEGIN"))
      return E;
    auto AddAll = [&]() -> Error {
      for (TensorRecord &R : Pending) {
        R.Shard = Name;
        if (Error E = insertTensor(R, R.Role, R.Device))
          return E;
      }
      return Tensors.flush(); // before the records their texts are in go
    };
    if (Error E = AddAll()) {
      Tensors.clear();
      consumeError(Db->exec("ROLLBACK")); // the shard stays, unnamed by any row
      return E;
    }
    Pending.clear();
    return Db->exec("COMMIT");
  }

  /// Creates the indexes (traceIndexes). Where that fails (a full disk, or
  /// a temporary directory too small for the sort) the trace is whole
  /// without them: meta `indexes` says why, as far as it can be written.
  void createIndexes() {
    Error E = Db->exec(traceIndexes());
    if (!E)
      return;
    std::string Why = "not created: " + toString(std::move(E));
    consumeError(Db->exec("ROLLBACK")); // what a failed statement may leave open
    consumeError(Meta.bind(1, "indexes").bind(2, Why).run());
  }

  /// The first shard that could not be written, and why; empty if none.
  const std::string &captureError() const { return CaptureError; }

  /// Drops what a failed writer still holds, counting the lost captures.
  void abandon(TraceCounts &Counts) {
    clearRows();
    Counts.DroppedCaptures += Pending.size();
    Pending.clear();
    Shard.clear();
  }

  std::unique_ptr<SQLiteDatabase> Db;

  /// Meta dtype, written as the trace closes: the floating-point dtype of
  /// most module outputs (`BF16`), then the others' counts (`BF16 (also
  /// F32: 3 of 120 module outputs)`).
  Error writeDTypeMeta() { return Meta.bind(1, "dtype").bind(2, moduleOutputTypes()).run(); }

  std::string moduleOutputTypes() const {
    std::vector<std::pair<uint64_t, DType>> Floating;
    uint64_t All = 0;
    for (size_t I = 0; I <= size_t(DType::F4); ++I) {
      DType T = DType(I);
      bool Real = T == DType::F16 || T == DType::BF16 || T == DType::F32 || T == DType::F64 ||
                  T == DType::F4 || dtypeName(T).starts_with("F8");
      if (OutputTypes[I] && (Real || partType(T) != T))
        Floating.emplace_back(OutputTypes[I], T);
      All += OutputTypes[I];
    }
    if (Floating.empty())
      return "none: no floating-point module outputs";
    llvm::sort(Floating, [](auto &A, auto &B) { // ties: by DType, not by chance
      return A.first > B.first || (A.first == B.first && A.second > B.second);
    });
    std::string Out = dtypeName(Floating[0].second).str();
    for (size_t I = 1; I < Floating.size(); ++I)
      Out += (I == 1 ? " (also " : ", ") + dtypeName(Floating[I].second).str() + ": " +
             std::to_string(Floating[I].first);
    if (Floating.size() > 1)
      Out += " of " + std::to_string(All) + " module outputs)";
    return Out;
  }

private:
  Error add(MetaItem &M, TraceCounts &Counts) {
    if (M.Later)
      M.Value = M.Later();
    if (M.Key == LostRecordsKey) {
      LostRecords = M.Value;
      return writeLostRecords(Counts);
    }
    return Meta.bind(1, M.Key).bind(2, M.Value).run();
  }

  /// Meta lost_records as last set, with the captures lost since a shard
  /// could not be written.
  Error writeLostRecords(const TraceCounts &Counts) {
    if (!LostRecords)
      return Error::success(); // not set yet: it will be, with them
    std::string Value = *LostRecords;
    if (!CaptureError.empty()) {
      std::string Dropped = std::to_string(Counts.DroppedCaptures) +
                            " captured tensors were recorded without their bytes, their "
                            "statistics kept (capture stopped at a shard that could not be "
                            "written: " +
                            CaptureError + ")";
      Value = Value == "0" || Value.empty() ? Dropped : Value + "; " + Dropped;
    }
    return Meta.bind(1, LostRecordsKey).bind(2, Value).run();
  }

  /// The open shard's tensors, whose shard could not be written: their
  /// rows without it.
  Error writeUncaptured(TraceCounts &Counts) {
    for (std::string &Buffer : Shard.takeBuffers())
      Owner.recycle(std::move(Buffer));
    Shard.clear();
    // Counted once: on a failure below, abandon() counts what Pending holds.
    Counts.DroppedCaptures += Pending.size();
    auto Uncount = [&] { Counts.DroppedCaptures -= Pending.size(); };
    if (Error E = Db->exec("BEGIN")) {
      Uncount();
      return E;
    }
    auto AddAll = [&]() -> Error {
      for (TensorRecord &R : Pending) {
        R.Key.clear();
        if (Error E = insertTensor(R, R.Role, R.Device))
          return E;
      }
      if (Error E = Tensors.flush())
        return E;
      return writeLostRecords(Counts);
    };
    if (Error E = AddAll()) {
      Tensors.clear();
      consumeError(Db->exec("ROLLBACK"));
      Uncount();
      return E;
    }
    Pending.clear();
    return Db->exec("COMMIT");
  }

  // The rows' texts are referenced, not copied (TableRows): those of the
  // batch's records and the writer's interned names outlive flushRows().

  Error add(ModuleCallRecord &R, TraceCounts &Counts) {
    return insertModuleCall(R.Id, R.ParentId, R.Seq, R.Step, R.Path, R.ClassName,
                            R.ClassQualname, R.SourceFile, R.SourceLine, Counts);
  }
  Error insertModuleCall(int64_t Id, std::optional<int64_t> ParentId, int64_t Seq, int64_t Step,
                         StringRef Path, StringRef ClassName, StringRef ClassQualname,
                         StringRef SourceFile, int64_t SourceLine, TraceCounts &Counts) {
    ++Counts.ModuleCalls;
    return Calls.row(Id, ParentId, Seq, Step, Path, ClassName, ClassQualname, SourceFile,
                     SourceLine);
  }

  Error add(OpRecord &R, TraceCounts &Counts) {
    return insertOp(R.Id, R.ModuleCallId, R.Seq, R.Name, R.Schema, Counts);
  }

  Error add(ChunkPtr &C, TraceCounts &Counts) {
    const char *P = C->data(), *End = C->data() + C->Used;
    while (P < End) {
      SmallKind Kind;
      std::memcpy(&Kind, P, sizeof Kind);
      if (Kind == SmallKind::Op) {
        auto O = takeSmall<SmallOp>(P);
        if (Error E = insertOp(O.Id, presentIf(O.HasCall, O.ModuleCallId), O.Seq,
                               O.Text->Name, O.Text->Schema, Counts))
          return E;
        continue;
      }
      if (Kind == SmallKind::ModuleCall) {
        auto M = takeSmall<SmallModuleCall>(P);
        const TraceWriter::ModuleText &T = *M.Text;
        if (Error E = insertModuleCall(M.Id, presentIf(M.HasParent, M.ParentId), M.Seq, M.Step,
                                       T.Path, T.ClassName, T.ClassQualname, T.SourceFile,
                                       T.SourceLine, Counts))
          return E;
        continue;
      }
      if (Kind == SmallKind::Kernel) {
        auto K = takeSmall<SmallKernel>(P);
        if (Error E = insertKernel(K.Id, presentIf(K.HasOp, K.OpId),
                                   presentIf(K.HasCall, K.ModuleCallId), K.Seq, *K.Name, K.Grid,
                                   K.Block, K.SharedMem, K.Stream, K.CorrelationId, Counts))
          return E;
        continue;
      }
      auto H = takeSmall<SmallTensor>(P);
      // Scratch holds what the row copies; its role and device are the
      // small record's, which outlive the row (a name, an interned text).
      TensorRecord &R = Scratch;
      R.Id = H.Id;
      R.Owner = TensorOwner(H.Owner);
      R.OwnerId = H.OwnerId;
      R.Index = H.Index;
      R.Type = DType(H.Type);
      R.Stats.reset();
      if (H.HasStats) {
        R.Stats.emplace();
        std::memcpy(&*R.Stats, P, sizeof(TensorStats));
        P += sizeof(TensorStats);
      }
      auto Dims = [&](TensorDims &D, unsigned Rank) {
        D.resize(Rank);
        std::memcpy(D.data(), P, Rank * sizeof(int64_t));
        P += Rank * sizeof(int64_t);
      };
      Dims(R.Shape, H.Rank);
      Dims(R.Strides, H.StrideRank);
      R.SourceId = presentIf(H.HasSource, H.SourceId);
      ++Counts.Tensors;
      assert(R.Shard.empty() && R.Key.empty() && R.Layout.empty() &&
             "a small record's row binds NULL there, not Scratch's texts");
      if (Error E = insertTensor(R, SmallRoles[H.Role], *H.Device))
        return E;
    }
    Owner.recycleChunk(std::move(C));
    return Error::success();
  }
  Error insertOp(int64_t Id, std::optional<int64_t> ModuleCallId, int64_t Seq, StringRef Name,
                 StringRef Schema, TraceCounts &Counts) {
    ++Counts.Ops;
    return Ops.row(Id, ModuleCallId, Seq, Name, Schema);
  }

  Error add(KernelRecord &R, TraceCounts &Counts) {
    return insertKernel(R.Id, R.OpId, R.ModuleCallId, R.Seq, R.Name, R.Grid, R.Block,
                        R.SharedMem, R.Stream, R.CorrelationId, Counts);
  }
  Error insertKernel(int64_t Id, std::optional<int64_t> OpId,
                     std::optional<int64_t> ModuleCallId, int64_t Seq, StringRef Name,
                     const uint32_t Grid[3], const uint32_t Block[3], uint64_t SharedMem,
                     uint64_t Stream, uint64_t CorrelationId, TraceCounts &Counts) {
    ++Counts.Kernels;
    dim3(Grid, Kernels.own(6));
    dim3(Block, Kernels.own(7));
    return Kernels.row(Id, OpId, ModuleCallId, Seq, Name, TableRows::Owned{}, TableRows::Owned{},
                       int64_t(SharedMem), int64_t(Stream), int64_t(CorrelationId));
  }

  Error add(TensorItem &T, TraceCounts &Counts) {
    ++Counts.Tensors;
    if (T.Complete) {
      T.Complete(T.Record, T.Data);
      T.Complete = nullptr; // what it held (device copies) is released now
    }
    if (T.Data && !T.Record.Stats)
      T.Record.Stats = statsOfBytes(T.Record.Type, *T.Data);
    if (!T.Data || T.Use == BytesUse::StatsOnly || !CaptureError.empty()) {
      if (T.Data) {
        Counts.DroppedCaptures += T.Use == BytesUse::Capture; // capture has stopped
        Owner.recycle(std::move(*T.Data));
      }
      return insertTensor(T.Record, T.Record.Role, T.Record.Device);
    }
    // Captured: the row waits for its shard to be on disk; the shard keeps
    // the buffer itself until then.
    T.Record.Key.assign(1, 't').append(std::to_string(T.Record.Id));
    Shard.add(T.Record.Key, T.Record.Type, T.Record.Shape, std::move(*T.Data));
    Pending.push_back(std::move(T.Record));
    return Error::success();
  }

  /// \p R's row, with \p Role and \p Device, which like R's shard, key
  /// and layout must outlive flushRows() (R itself need not).
  Error insertTensor(const TensorRecord &R, StringRef Role, StringRef Device) {
    Tensors.set(1, R.Id);
    Tensors.setText(2, ownerName(R.Owner));
    Tensors.set(3, R.OwnerId);
    Tensors.setText(4, Role);
    Tensors.set(5, R.Index);
    Tensors.setText(6, dtypeName(R.Type));
    if (R.Owner == TensorOwner::ModuleCall && Role == "output")
      ++OutputTypes[size_t(R.Type)];
    jsonInts(R.Shape, Tensors.own(7));
    jsonInts(R.Strides, Tensors.own(8));
    Tensors.setText(9, Device);
    if (R.Stats) {
      const TensorStats &S = *R.Stats;
      auto Real = [&](unsigned I, double V) {
        // SQLite has no NaN; a NaN statistic is stored as NULL (the counts say why).
        if (V != V)
          Tensors.setNull(I);
        else
          Tensors.setReal(I, V);
      };
      Real(10, S.Sum);
      Real(11, S.SumSq);
      Real(12, S.Min);
      Real(13, S.Max);
      Tensors.set(14, S.NanCount);
      Tensors.set(15, S.InfCount);
    } else {
      for (unsigned I = 10; I <= 15; ++I)
        Tensors.setNull(I);
    }
    if (R.Shard.empty()) {
      Tensors.setNull(16);
      Tensors.setNull(17);
    } else {
      Tensors.setText(16, R.Shard);
      Tensors.setText(17, R.Key);
    }
    Tensors.set(18, R.SourceId);
    if (R.Layout.empty())
      Tensors.setNull(19);
    else
      Tensors.setText(19, R.Layout);
    return Tensors.add();
  }

  Error flushRows() {
    for (TableRows *T : {&Calls, &Ops, &Kernels, &Tensors})
      if (Error E = T->flush())
        return E;
    return Error::success();
  }
  void clearRows() {
    for (TableRows *T : {&Calls, &Ops, &Kernels, &Tensors})
      T->clear();
  }

  TraceWriter &Owner;
  std::string Dir;
  uint64_t ShardBytes;
  SQLiteStatement Meta;
  TableRows Calls{9}, Ops{5}, Kernels{10}, Tensors{19};
  SafeTensorsWriter Shard;
  std::vector<TensorRecord> Pending;
  std::string CaptureError; ///< Why capture stopped (a shard not written).
  std::optional<std::string> LostRecords; ///< Meta lost_records as last set.
  /// Module outputs written, by dtype (meta dtype).
  uint64_t OutputTypes[size_t(DType::F4) + 1] = {};
  TensorRecord Scratch; ///< A small record's, as it is written.
  unsigned NextShard = 0;
};

void removeTrace(StringRef Dir) {
  std::error_code EC;
  for (sys::fs::directory_iterator It(Dir, EC), End; It != End && !EC; It.increment(EC)) {
    StringRef Name = sys::path::filename(It->path());
    // Only the files a trace is made of: not a user's trace.db.bak.
    bool Database = Name == TraceDatabaseName || Name == (TraceDatabaseName + "-wal").str() ||
                    Name == (TraceDatabaseName + "-shm").str() ||
                    Name == (TraceDatabaseName + "-journal").str();
    bool Shard = Name.starts_with("tensors-") &&
                 (Name.ends_with(".safetensors") || Name.ends_with(".safetensors.tmp"));
    if (Database || Shard)
      sys::fs::remove(It->path());
    else if ((Name.starts_with("rank-") || Name.starts_with("process-")) &&
             sys::fs::is_directory(It->path()))
      sys::fs::remove_directories(It->path());
  }
}

TraceWriter::TraceWriter(std::string Dir, TraceWriterOptions Options)
    : Dir(std::move(Dir)), Options(Options), Serial(++NextWriterSerial) {
  installForkHandler();
}

void TraceWriter::installForkHandler() {
  static std::once_flag AtFork;
  std::call_once(AtFork, [] {
    pthread_atfork(nullptr, nullptr, [] { ForkGeneration.fetch_add(1); });
  });
}

Expected<std::unique_ptr<TraceWriter>> TraceWriter::create(StringRef Dir,
                                                           TraceWriterOptions Options) {
  SmallString<256> DbPath(Dir);
  sys::path::append(DbPath, TraceDatabaseName);
  if (sys::fs::exists(DbPath)) {
    if (!Options.Force)
      return makeError("'" + Dir + "' already holds a trace (use --force to replace it)");
    removeTrace(Dir);
  }
  if (std::error_code EC = sys::fs::create_directories(Dir))
    return makeError("cannot create trace directory '" + Dir + "': " + EC.message());
  // Claimed by creating the file, which only one of several processes
  // starting at once can do: the others are told the directory holds a
  // trace (and trace into one of their own), as if they had come later.
  int Claim = -1;
  if (std::error_code EC = sys::fs::openFileForWrite(DbPath, Claim, sys::fs::CD_CreateNew)) {
    if (EC == std::errc::file_exists)
      return makeError("'" + Dir + "' already holds a trace (use --force to replace it)");
    return makeError("cannot create '" + DbPath + "': " + EC.message());
  }
  ::close(Claim);
  auto Db = SQLiteDatabase::open(DbPath, SQLiteDatabase::Mode::ReadWriteCreate);
  if (!Db)
    return Db.takeError();
  // WAL: a reader (ekka-trace show) can look while the program still runs,
  // and a killed program leaves every committed batch intact.
  if (Error E = (*Db)->exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL"))
    return E;
  if (Error E = (*Db)->exec(traceSchema()))
    return E;
  // The format now, not with the first batch: a program that dies before
  // that (within milliseconds) leaves a trace that opens, empty.
  if (Error E = (*Db)->exec("INSERT INTO meta(key, value) VALUES('format', 'ekka-trace " +
                            std::to_string(TraceFormatMajor) + "." +
                            std::to_string(TraceFormatMinor) + "')"))
    return E;
  std::unique_ptr<TraceWriter> W(new TraceWriter(Dir.str(), Options));
  W->Storage = std::make_unique<Backend>(*W, Dir.str(), std::move(*Db), Options.ShardBytes);
  if (Error E = W->Storage->prepare())
    return E;
  W->Worker = startQuietThread([Raw = W.get()] {
    // Named, so that top and perf tell the writer from the program.
    pthread_setname_np(pthread_self(), "ekka-writer");
    Raw->run();
  });
  return W;
}

TraceWriter::~TraceWriter() {
  if (Worker.joinable())
    consumeError(close());
}

namespace {
/// The writer's thread, once a first record is queued, collects records
/// for WriterPeriod, or until this many are queued or captured bytes come:
/// the program's thread does not pay a wake-up (a system call, and a
/// thread switch on a busy machine) for every op.
constexpr size_t WakeRecords = 4096;
constexpr std::chrono::milliseconds WriterPeriod(20);
/// With nothing queued, the writer's thread looks at the threads' open
/// chunks this often.
constexpr std::chrono::milliseconds IdlePeriod(100);
/// A program that records faster than SQLite takes rows (a loop of tiny
/// ops) waits once this many records are queued, as it does for bytes.
constexpr size_t MaxQueuedRecords = 1 << 18;
} // namespace

template <typename EmplaceFn>
void TraceWriter::push(ChunkPtr Open, uint64_t Bytes, size_t Records, EmplaceFn Emplace,
                       bool Wait) {
  std::unique_lock<std::mutex> Lock(Mutex);
  if (Closing)
    return; // closed: late records (a callback still running) are dropped
  // Back-pressure: a program that captures faster than the disk takes waits
  // here rather than growing the queue without bound.
  auto Room = [&] {
    return Closing || NoWaiting || !Wait ||
           ((QueuedBytes == 0 || QueuedBytes + Bytes <= 2 * Options.ShardBytes) &&
            QueuedRecords < MaxQueuedRecords);
  };
  if (!Room()) {
    Wake.notify_one();
    auto Start = std::chrono::steady_clock::now();
    Drained.wait(Lock, Room);
    RoomWaits.fetch_add(1, std::memory_order_relaxed);
    RoomWaitNanos.fetch_add(uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::steady_clock::now() - Start)
                                         .count()),
                            std::memory_order_relaxed);
    if (Closing)
      return; // closed while it waited: dropped like any late record
  }
  size_t Before = QueuedRecords;
  if (Open) {
    QueuedRecords += Open->Records;
    Queue.emplace_back(std::move(Open));
  }
  Emplace();
  QueuedRecords += Records;
  QueuedBytes += Bytes;
  if (Bytes || (Before < WakeRecords && QueuedRecords >= WakeRecords) ||
      (WriterIdle && Before == 0))
    Wake.notify_one();
}

void TraceWriter::push(ChunkPtr Open, bool Wait) {
  if (Open && Open->Records)
    push(std::move(Open), 0, 0, [] {}, Wait);
}

template <typename T, typename... Args>
void TraceWriter::enqueue(uint64_t Bytes, Args &&...A) {
  auto Emplace = [&] { Queue.emplace_back(std::in_place_type<T>, std::forward<Args>(A)...); };
  // The thread's small records so far go first, and its chunk stays
  // locked until this record is queued after them.
  ThreadBuffer *B = threadBuffer(/*Make=*/false);
  if (!B)
    return push(nullptr, Bytes, 1, Emplace);
  std::lock_guard<BufferLock> Lock(B->Mutex);
  if (B->Closed)
    return; // close() took its chunk: late, like its small records now
  push(takeRecords(*B), Bytes, 1, Emplace);
}

TraceWriter::ChunkPtr TraceWriter::takeRecords(ThreadBuffer &B) {
  if (!B.Open || !B.Open->Records)
    return nullptr;
  if (B.Open->Used >= ChunkBytes / 2)
    return std::move(B.Open);
  // A few records before a module call, a kernel, a capture: copied out,
  // and the thread keeps its chunk, so that a chunk queued holds no more
  // memory than it uses.
  ChunkPtr Copy = Chunk::make(B.Open->Used);
  std::memcpy(Copy->data(), B.Open->data(), B.Open->Used);
  Copy->Used = B.Open->Used;
  Copy->Records = B.Open->Records;
  B.Open->Used = B.Open->Records = 0;
  return Copy;
}

TraceWriter::ThreadBuffer *TraceWriter::threadBuffer(bool Make) {
  using BufferList = std::vector<std::shared_ptr<ThreadBuffer>>;
  /// What every record asks, in one thread_local that needs no code to
  /// build (one call of __tls_get_addr in a library loaded with dlopen):
  /// the thread's buffers while they live, and whether they are gone (a
  /// record added later by a thread_local's or a static's destructor takes
  /// the queue).
  struct Lookup {
    BufferList *List = nullptr;
    bool Gone = false;
  };
  thread_local Lookup Mine;
  /// The calling thread's buffers, the one used last at the end. When the
  /// thread ends, their chunks are handed over.
  struct ThreadBuffers {
    BufferList List;
    ThreadBuffers() { Mine.List = &List; }
    ~ThreadBuffers() {
      Mine.List = nullptr;
      Mine.Gone = true;
      for (std::shared_ptr<ThreadBuffer> &B : List) {
        if (B->Fork != ForkGeneration.load())
          continue; // the parent's, in a forked child: not ours to touch
        std::lock_guard<BufferLock> Lock(B->Mutex);
        if (B->Closed)
          continue;
        B->Closed = true;
        TraceWriter &W = *B->Owner;
        W.push(std::move(B->Open));
        std::lock_guard<std::mutex> ThreadsLock(W.ThreadsMutex);
        llvm::erase(W.Threads, B);
      }
    }
  };
  if (Mine.List) {
    BufferList &List = *Mine.List;
    if (!List.empty() && List.back()->WriterSerial == Serial &&
        List.back()->Fork == ForkGeneration.load(std::memory_order_relaxed))
      return List.back().get();
  } else if (Mine.Gone) {
    return nullptr;
  }
  thread_local ThreadBuffers Buffers; // built here at the thread's first record
  BufferList &List = Buffers.List;
  // Another writer's was used last (two traces at once), or none yet.
  for (size_t I = 0; I < List.size(); ++I)
    if (List[I]->WriterSerial == Serial && List[I]->Fork == ForkGeneration.load()) {
      std::rotate(List.begin() + I, List.begin() + I + 1, List.end());
      return List.back().get();
    }
  if (!Make)
    return nullptr;
  // Forget buffers of closed writers, and a forked child's parent's.
  llvm::erase_if(List, [](const std::shared_ptr<ThreadBuffer> &B) {
    if (B->Fork != ForkGeneration.load())
      return true;
    std::lock_guard<BufferLock> Lock(B->Mutex);
    return B->Closed;
  });
  auto B = std::make_shared<ThreadBuffer>(*this);
  {
    std::lock_guard<std::mutex> Lock(ThreadsMutex);
    if (ThreadsClosed)
      B->Closed = true; // a first record while the writer closes: late
    else
      Threads.push_back(B);
  }
  List.push_back(std::move(B));
  return List.back().get();
}

template <typename FillFn> bool TraceWriter::appendSmall(size_t Bytes, FillFn Fill) {
  ThreadBuffer *B = threadBuffer(/*Make=*/true);
  if (!B || Bytes > ChunkBytes)
    return false;
  std::lock_guard<BufferLock> Lock(B->Mutex);
  if (B->Closed)
    return true; // closed: dropped like any late record
  if (B->Open && ChunkBytes - B->Open->Used < Bytes)
    push(std::move(B->Open)); // full
  if (!B->Open)
    B->Open = takeChunk();
  Fill(*B, B->Open->data() + B->Open->Used);
  B->Open->Used += Bytes;
  ++B->Open->Records;
  return true;
}

void TraceWriter::collectThreadChunks(bool Close, bool Wait) {
  std::vector<std::shared_ptr<ThreadBuffer>> All;
  {
    std::lock_guard<std::mutex> Lock(ThreadsMutex);
    All = Threads;
    ThreadsClosed |= Close;
  }
  for (std::shared_ptr<ThreadBuffer> &B : All) {
    // The writer's thread does not wait for a buffer: its thread may hold
    // it while it waits for room in the queue, which only the writer's
    // thread makes. A held buffer's thread is adding records anyway.
    std::unique_lock<BufferLock> Lock(B->Mutex, std::defer_lock);
    if (Wait)
      Lock.lock();
    else if (!Lock.try_lock())
      continue;
    if (B->Closed)
      continue;
    push(takeRecords(*B), Wait);
    B->Closed = Close;
  }
}

TraceWriter::ChunkPtr TraceWriter::takeChunk() {
  {
    std::lock_guard<std::mutex> Lock(ChunkPoolMutex);
    if (!ChunkPool.empty()) {
      ChunkPtr C = std::move(ChunkPool.back());
      ChunkPool.pop_back();
      C->Used = C->Records = 0;
      return C;
    }
  }
  return Chunk::make(ChunkBytes);
}

void TraceWriter::recycleChunk(ChunkPtr C) {
  if (C->Capacity != ChunkBytes)
    return; // a copy
  std::lock_guard<std::mutex> Lock(ChunkPoolMutex);
  if (ChunkPool.size() < PooledChunks)
    ChunkPool.push_back(std::move(C));
}

const std::string *TraceWriter::internText(StringRef Text) {
  std::lock_guard<std::mutex> Lock(TextMutex);
  auto It = Texts.find(Text);
  if (It == Texts.end())
    It = Texts.insert(Text.str()).first;
  return &*It;
}

namespace {
/// Buffers smaller than this are not kept: a fresh one costs little.
constexpr size_t MinPooledBytes = 64 << 10;
} // namespace

std::string TraceWriter::takeBuffer(size_t Bytes) {
  if (Bytes >= MinPooledBytes) {
    std::lock_guard<std::mutex> Lock(PoolMutex);
    // The smallest that holds them, if it is not more than twice as large.
    auto Best = Pool.lower_bound(Bytes);
    if (Best != Pool.end() && Best->first <= 2 * Bytes) {
      std::string Buffer = std::move(Best->second);
      PoolBytes -= Best->first;
      Pool.erase(Best);
      return Buffer;
    }
  }
  std::string Buffer;
  Buffer.reserve(Bytes);
  return Buffer;
}

void TraceWriter::recycle(std::string &&Buffer) {
  size_t Capacity = Buffer.capacity();
  if (Capacity < MinPooledBytes)
    return; // freed
  std::lock_guard<std::mutex> Lock(PoolMutex);
  if (PoolBytes + Capacity > 2 * Options.ShardBytes)
    return; // freed
  PoolBytes += Capacity;
  Buffer.clear();
  Pool.emplace(Capacity, std::move(Buffer));
}

void TraceWriter::setMeta(StringRef Key, StringRef Value) {
  enqueue<MetaItem>(0, Key.str(), Value.str(), nullptr);
}
void TraceWriter::setMeta(StringRef Key, std::function<std::string()> Value) {
  collectThreadChunks(/*Close=*/false); // "after everything enqueued before it"
  enqueue<MetaItem>(0, Key.str(), "", std::move(Value));
}
void TraceWriter::addModuleCall(ModuleCallRecord R) { enqueue<ModuleCallRecord>(0, std::move(R)); }
const TraceWriter::ModuleText *TraceWriter::internModule(StringRef Path, StringRef ClassName,
                                                         StringRef ClassQualname,
                                                         StringRef SourceFile,
                                                         int64_t SourceLine) {
  ModuleText Text{Path.str(), ClassName.str(), ClassQualname.str(), SourceFile.str(), SourceLine};
  std::lock_guard<std::mutex> Lock(TextMutex);
  return &*ModuleTexts.insert(std::move(Text)).first;
}
void TraceWriter::addModuleCall(int64_t Id, std::optional<int64_t> ParentId, int64_t Seq,
                                int64_t Step, const ModuleText *Text) {
  SmallModuleCall M;
  M.HasParent = ParentId.has_value();
  M.Id = Id;
  M.ParentId = ParentId.value_or(0);
  M.Seq = Seq;
  M.Step = Step;
  M.Text = Text;
  if (!appendSmall(sizeof M, [&](ThreadBuffer &, char *To) { std::memcpy(To, &M, sizeof M); }))
    addModuleCall(ModuleCallRecord{Id, ParentId, Seq, Step, Text->Path, Text->ClassName,
                                   Text->ClassQualname, Text->SourceFile, Text->SourceLine});
}
void TraceWriter::addOp(OpRecord R) { enqueue<OpRecord>(0, std::move(R)); }
const TraceWriter::OpText *TraceWriter::internOp(std::string Name, std::string Schema) {
  std::lock_guard<std::mutex> Lock(TextMutex);
  return &*OpTexts.insert(OpText{std::move(Name), std::move(Schema)}).first;
}
void TraceWriter::addOp(int64_t Id, std::optional<int64_t> ModuleCallId, int64_t Seq,
                        const OpText *Text) {
  SmallOp O;
  O.HasCall = ModuleCallId.has_value();
  O.Id = Id;
  O.ModuleCallId = ModuleCallId.value_or(0);
  O.Seq = Seq;
  O.Text = Text;
  if (!appendSmall(sizeof O, [&](ThreadBuffer &, char *To) { std::memcpy(To, &O, sizeof O); }))
    addOp(OpRecord{Id, ModuleCallId, Seq, Text->Name, Text->Schema});
}
void TraceWriter::addKernel(KernelRecord R) { enqueue<KernelRecord>(0, std::move(R)); }
void TraceWriter::addKernel(const KernelRecord &R, const std::string *Name) {
  SmallKernel K;
  K.HasOp = R.OpId.has_value();
  K.HasCall = R.ModuleCallId.has_value();
  std::copy(R.Grid, R.Grid + 3, K.Grid);
  std::copy(R.Block, R.Block + 3, K.Block);
  K.Id = R.Id;
  K.OpId = R.OpId.value_or(0);
  K.ModuleCallId = R.ModuleCallId.value_or(0);
  K.Seq = R.Seq;
  K.SharedMem = R.SharedMem;
  K.Stream = R.Stream;
  K.CorrelationId = R.CorrelationId;
  K.Name = Name;
  if (!appendSmall(sizeof K, [&](ThreadBuffer &, char *To) { std::memcpy(To, &K, sizeof K); })) {
    KernelRecord Whole = R;
    Whole.Name = *Name;
    addKernel(std::move(Whole));
  }
}
bool TraceWriter::packTensor(const TensorMetadata &M, const TensorStats *Stats) {
  std::optional<uint8_t> Role = smallRole(M.Role);
  if (!Role || M.Shape.size() > 255 || M.Strides.size() > 255)
    return false;
  SmallTensor H;
  H.Owner = uint8_t(M.Owner);
  H.Role = *Role;
  H.Type = uint8_t(M.Type);
  H.Rank = uint8_t(M.Shape.size());
  H.StrideRank = uint8_t(M.Strides.size());
  H.HasStats = Stats != nullptr;
  H.HasSource = M.SourceId.has_value();
  H.Id = M.Id;
  H.OwnerId = M.OwnerId;
  H.Index = M.Index;
  H.SourceId = M.SourceId.value_or(0);
  size_t Bytes = sizeof H + (Stats ? sizeof(TensorStats) : 0) +
                 (M.Shape.size() + M.Strides.size()) * sizeof(int64_t);
  return appendSmall(Bytes, [&](ThreadBuffer &B, char *To) {
    if (!B.Device || *B.Device != M.Device)
      B.Device = internText(M.Device);
    H.Device = B.Device;
    std::memcpy(To, &H, sizeof H);
    To += sizeof H;
    if (Stats) {
      std::memcpy(To, Stats, sizeof(TensorStats));
      To += sizeof(TensorStats);
    }
    std::memcpy(To, M.Shape.data(), M.Shape.size() * sizeof(int64_t));
    To += M.Shape.size() * sizeof(int64_t);
    std::memcpy(To, M.Strides.data(), M.Strides.size() * sizeof(int64_t));
  });
}

void TraceWriter::addTensor(TensorRecord &&R, std::optional<std::string> Data, BytesUse Use) {
  if (!Data && R.Shard.empty() && R.Key.empty() && R.Layout.empty() &&
      packTensor({R.Id, R.Owner, R.OwnerId, R.Role, R.Index, R.Type, R.Shape, R.Strides,
                  R.Device, R.SourceId},
                 R.Stats ? &*R.Stats : nullptr))
    return;
  uint64_t Bytes = Data ? Data->size() : 0;
  enqueue<TensorItem>(Bytes, std::move(R), std::move(Data), Use, nullptr);
}

void TraceWriter::addTensorMetadata(const TensorMetadata &M) {
  if (packTensor(M, nullptr))
    return;
  TensorRecord R;
  R.Id = M.Id;
  R.Owner = M.Owner;
  R.OwnerId = M.OwnerId;
  R.Role = M.Role.str();
  R.Index = M.Index;
  R.Type = M.Type;
  R.Shape.assign(M.Shape.begin(), M.Shape.end());
  R.Strides.assign(M.Strides.begin(), M.Strides.end());
  R.Device = M.Device.str();
  R.SourceId = M.SourceId;
  enqueue<TensorItem>(0, std::move(R), std::nullopt, BytesUse::Capture, nullptr);
}

void TraceWriter::addTensor(TensorRecord R, Completion Complete, uint64_t Bytes, BytesUse Use) {
  enqueue<TensorItem>(Bytes, std::move(R), std::nullopt, Use, std::move(Complete));
}

void TraceWriter::run() {
  std::vector<Item> Batch;
  bool Failed = false;
  while (true) {
    bool Last;
    uint64_t Flush;
    // Records that threads hold in their open chunks go too. Under
    // CountsMutex, as the writing: at a fork the thread is in neither.
    if (Options.CollectThreadChunks) {
      std::lock_guard<std::mutex> CountsLock(CountsMutex);
      collectThreadChunks(/*Close=*/false, /*Wait=*/false);
    }
    {
      std::unique_lock<std::mutex> Lock(Mutex);
      // Nothing queued: sleep until the first record, looking at the
      // threads' chunks now and then. Then collect for up to a period.
      WriterIdle = true;
      auto Asked = [&] { return FlushesAsked > FlushesDone; };
      if (!Wake.wait_for(Lock, IdlePeriod,
                         [&] { return Closing || !Queue.empty() || Asked(); }))
        continue;
      WriterIdle = false;
      Wake.wait_for(Lock, WriterPeriod, [&] {
        return Closing || QueuedBytes || QueuedRecords >= WakeRecords || Asked();
      });
      Batch.swap(Queue);
      QueuedBytes = 0;
      QueuedRecords = 0;
      Last = Closing;
      Flush = FlushesAsked;
    }
    Drained.notify_all();
    std::lock_guard<std::mutex> CountsLock(CountsMutex);
    if (!Failed) {
      Error E = Storage->write(Batch, Counts);
      if (!E && Last)
        E = Storage->flushShard(Counts);
      if (E) {
        Failed = true;
        // The first error is the one to report; the trace keeps what was
        // committed before it.
        FailureMessage = toString(std::move(E));
        Storage->abandon(Counts);
      }
    } else {
      // After a failure nothing more is written; captures are counted lost.
      for (Item &I : Batch)
        if (auto *T = std::get_if<TensorItem>(&I);
            T && (T->Data || T->Complete) && T->Use == BytesUse::Capture)
          ++Counts.DroppedCaptures;
    }
    Batch.clear();
    if (Flush > FlushesDone) {
      // What was queued when flush() asked is written: the shard under way
      // too, so that the captured bytes are in a file.
      if (!Failed && !Last) {
        if (Error E = Storage->flushShard(Counts)) {
          Failed = true;
          FailureMessage = toString(std::move(E));
          Storage->abandon(Counts);
        } else {
          // Indexed, as at the end (the trace may end here, at an exec),
          // and into trace.db: whole without its -wal file, if the process
          // leaves it there.
          Storage->createIndexes();
          consumeError(Storage->Db->exec("PRAGMA wal_checkpoint(TRUNCATE)"));
        }
      }
      {
        std::lock_guard<std::mutex> Lock(Mutex);
        FlushesDone = Flush;
      }
      Flushed.notify_all();
    }
    if (Last)
      break;
  }
  // Whatever flush() still waits for, close() has written.
  {
    std::lock_guard<std::mutex> Lock(Mutex);
    WriterExited = true;
    FlushesDone = FlushesAsked;
  }
  Flushed.notify_all();
}

// The writer thread holds CountsMutex across each batch's SQLite and file
// work.
void TraceWriter::pauseForFork() { CountsMutex.lock(); }
void TraceWriter::resumeAfterFork() { CountsMutex.unlock(); }

Error TraceWriter::flush() {
  {
    // Closing, or closed, or a forked child's copy (whose thread is the
    // parent's): close() writes everything, or nothing is this process's.
    std::lock_guard<std::mutex> Lock(Mutex);
    if (Closing || WriterExited || ::getpid() != OwnerProcess)
      return Error::success();
  }
  collectThreadChunks(/*Close=*/false);
  {
    std::unique_lock<std::mutex> Lock(Mutex);
    if (Closing || WriterExited)
      return Error::success(); // close() began meanwhile: it writes everything
    uint64_t Ticket = ++FlushesAsked;
    Wake.notify_one();
    Flushed.wait(Lock, [&] { return FlushesDone >= Ticket || WriterExited; });
  }
  std::lock_guard<std::mutex> Lock(CountsMutex);
  if (FailureMessage.empty())
    return Error::success();
  return makeError(FailureMessage);
}

Error TraceWriter::close() {
  if (!Worker.joinable())
    return Error::success();
  {
    // Nothing waits for room from now on: a thread that waits holding its
    // chunk would keep the collection below waiting.
    std::lock_guard<std::mutex> Lock(Mutex);
    NoWaiting = true;
  }
  Drained.notify_all();
  collectThreadChunks(/*Close=*/true);
  {
    std::lock_guard<std::mutex> Lock(Mutex);
    Closing = true;
  }
  Wake.notify_one();
  Drained.notify_all();
  Worker.join();
  // Checkpoint the WAL into trace.db and leave WAL mode, which removes the
  // -wal and -shm files: the trace is one database file plus shards, which
  // opens read-only anywhere (a WAL database on a read-only file system or
  // copied without its -shm file does not) and can be copied alone.
  if (Storage && Storage->Db) {
    // Indexed now, in one pass over each table (see traceIndexes); not
    // after a failure (a full disk, a transaction it left open).
    if (FailureMessage.empty()) {
      consumeError(Storage->writeDTypeMeta());
      Storage->createIndexes();
    }
    consumeError(Storage->Db->exec("PRAGMA wal_checkpoint(TRUNCATE)"));
    consumeError(Storage->Db->exec("PRAGMA journal_mode=DELETE"));
  }
  std::lock_guard<std::mutex> Lock(CountsMutex);
  TraceCounts C = Counts;
  if (FailureMessage.empty() && Storage && !Storage->captureError().empty())
    return makeError(Storage->captureError() + "; capture stopped there: " +
                     Twine(C.DroppedCaptures) +
                     " captured tensors were recorded without their bytes (their statistics "
                     "kept, meta lost_records says so); the trace keeps the rest");
  if (FailureMessage.empty())
    return Error::success();
  return makeError(FailureMessage + "; the trace keeps what was written before (" +
                   Twine(C.Shards) + " shards), " + Twine(C.DroppedCaptures) +
                   " captured tensors were lost");
}

TraceCounts TraceWriter::counts() const {
  std::lock_guard<std::mutex> Lock(CountsMutex);
  TraceCounts C = Counts;
  C.RoomWaits = RoomWaits.load(std::memory_order_relaxed);
  C.RoomWaitNanos = RoomWaitNanos.load(std::memory_order_relaxed);
  return C;
}

} // namespace ekka
