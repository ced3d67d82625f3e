//===- TraceWriterStorage.cpp - The writer's thread -----------------------===//
//
// What the writer's own thread does with the records the program's threads
// queued (TraceWriter.cpp): it writes them to the trace's database in one
// transaction a batch, each table's rows many to a statement, and captured
// bytes to safetensors shards; it stops capture where a shard cannot be
// written, and closes the trace. Also where a writer is created, and where
// a trace being replaced (--force) is removed.
//
//===----------------------------------------------------------------------===//
#include "TableRows.h"
#include "TraceWriterInternal.h"

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
#include <chrono>
#include <cstring>
#include <pthread.h>
#include <thread>
#include <unistd.h>

using namespace llvm;

namespace ekka {

using namespace trace_writer;

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
    if (Error E = Spans.prepare(*Db, "INSERT INTO spans(owner, owner_id, thread, start_ns, "
                                     "end_ns)"))
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

  /// Whether the open shard has held captured bytes for \p Age.
  bool shardOlderThan(std::chrono::steady_clock::duration Age) const {
    return !Shard.empty() && std::chrono::steady_clock::now() - ShardBegan >= Age;
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
      if (Kind == SmallKind::Span) {
        if (Error E = add(takeSmall<SmallSpan>(P).Span, Counts))
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

  Error add(const SpanRecord &R, TraceCounts &) {
    return Spans.row(ownerName(R.Owner), R.OwnerId, R.Thread, R.StartNs, R.EndNs);
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
    if (Shard.empty())
      ShardBegan = std::chrono::steady_clock::now();
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
    for (TableRows *T : {&Calls, &Ops, &Kernels, &Tensors, &Spans})
      if (Error E = T->flush())
        return E;
    return Error::success();
  }
  void clearRows() {
    for (TableRows *T : {&Calls, &Ops, &Kernels, &Tensors, &Spans})
      T->clear();
  }

  TraceWriter &Owner;
  std::string Dir;
  uint64_t ShardBytes;
  SQLiteStatement Meta;
  TableRows Calls{9}, Ops{5}, Kernels{10}, Tensors{19}, Spans{5};
  SafeTensorsWriter Shard;
  std::chrono::steady_clock::time_point ShardBegan; ///< Its first tensor's arrival.
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

namespace {
/// Tells writers apart: a thread's buffer for a writer that is gone is not
/// taken for the buffer of a new one made at the same address.
std::atomic<uint64_t> NextWriterSerial{0};
} // namespace

TraceWriter::TraceWriter(std::string Dir, TraceWriterOptions Options)
    : Dir(std::move(Dir)), Options(Options), Serial(++NextWriterSerial) {
  installForkHandler();
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

void TraceWriter::run() {
  {
    std::lock_guard<std::mutex> Lock(Mutex);
    WriterStarted = true;
  }
  Started.notify_all();
  std::vector<Item> Batch;
  bool Failed = false;
  // The first error is the one to report; the trace keeps what was
  // committed before it. Called under CountsMutex.
  auto Fail = [&](Error E) {
    Failed = true;
    FailureMessage = toString(std::move(E));
    Storage->abandon(Counts);
  };
  while (true) {
    bool Last;
    uint64_t Flush;
    // Records that threads hold in their open chunks go too. Under
    // CountsMutex, as the writing: at a fork the thread is in neither.
    {
      std::lock_guard<std::mutex> CountsLock(CountsMutex);
      if (Options.CollectThreadChunks)
        collectThreadChunks(/*Close=*/false, /*Wait=*/false);
      // After each batch and each idle period: a shard ShardAge old is
      // written, busy program or idle.
      if (!Failed && Storage->shardOlderThan(ShardAge))
        if (Error E = Storage->flushShard(Counts))
          Fail(std::move(E));
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
      if (E)
        Fail(std::move(E));
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
          Fail(std::move(E));
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
  std::string CaptureError = Storage ? Storage->captureError() : std::string();
  // All written: the database's connection, its cache and the tables'
  // buffers go now rather than with the writer, which can outlive its close
  // by the rest of the process (the runtime keeps its stopped sessions).
  Storage.reset();
  if (FailureMessage.empty() && !CaptureError.empty())
    return makeError(CaptureError + "; capture stopped there: " +
                     Twine(C.DroppedCaptures) +
                     " captured tensors were recorded without their bytes (their statistics "
                     "kept, meta lost_records says so); the trace keeps the rest");
  if (FailureMessage.empty())
    return Error::success();
  return makeError(FailureMessage + "; the trace keeps what was written before (" +
                   Twine(C.Shards) + " shards), " + Twine(C.DroppedCaptures) +
                   " captured tensors were lost");
}

} // namespace ekka
