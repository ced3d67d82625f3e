//===- TraceWriter.cpp ----------------------------------------------------===//
#include "ekka/Trace/TraceWriter.h"
#include "ekka/Support/Error.h"
#include "ekka/Support/SQLite.h"
#include "ekka/Trace/SafeTensors.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>
#include <pthread.h>

using namespace llvm;

namespace ekka {

namespace {

std::string jsonInts(ArrayRef<int64_t> V) {
  std::string Out;
  raw_string_ostream(Out) << json::Value(json::Array(V));
  return Out;
}

std::string dim3(const uint32_t D[3]) {
  return jsonInts({int64_t(D[0]), int64_t(D[1]), int64_t(D[2])});
}

} // namespace

/// What the background thread owns: the database, the open shard and the
/// tensor rows waiting for it.
class TraceWriter::Backend {
public:
  Backend(TraceWriter &Owner, std::string Dir, std::unique_ptr<SQLiteDatabase> Db,
          uint64_t ShardBytes)
      : Db(std::move(Db)), Owner(Owner), Dir(std::move(Dir)), ShardBytes(ShardBytes) {}

  Error prepare() {
    auto Prep = [&](SQLiteStatement &S, StringRef SQL) -> Error {
      auto P = Db->prepare(SQL);
      if (!P)
        return P.takeError();
      S = std::move(*P);
      return Error::success();
    };
    if (Error E = Prep(Meta, "INSERT OR REPLACE INTO meta(key, value) VALUES(?1, ?2)"))
      return E;
    if (Error E = Prep(Call, "INSERT INTO module_calls(id, parent_id, seq, step, path, "
                             "class_name, class_qualname, source_file, source_line) "
                             "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"))
      return E;
    if (Error E = Prep(Op, "INSERT INTO ops(id, module_call_id, seq, name, schema) "
                           "VALUES(?1, ?2, ?3, ?4, ?5)"))
      return E;
    if (Error E = Prep(Kernel, "INSERT INTO kernels(id, op_id, module_call_id, seq, name, "
                               "grid, block, shared_mem, stream, correlation_id) "
                               "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"))
      return E;
    return Prep(Tensor, "INSERT INTO tensors(id, owner, owner_id, role, idx, dtype, shape, "
                        "strides, device, sum, sumsq, min, max, nan_count, inf_count, "
                        "shard, key, source_id) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, "
                        "?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)");
  }

  /// Writes one batch of queued items in one transaction.
  Error write(std::vector<Item> &Items, TraceCounts &Counts) {
    if (Error E = Db->exec("BEGIN"))
      return E;
    for (Item &I : Items)
      if (Error E = std::visit([&](auto &R) { return add(R, Counts); }, I)) {
        consumeError(Db->exec("ROLLBACK"));
        return E;
      }
    if (Error E = Db->exec("COMMIT"))
      return E;
    if (Shard.dataBytes() >= ShardBytes)
      return flushShard(Counts);
    return Error::success();
  }

  /// Writes the open shard, then the rows of the tensors it holds.
  Error flushShard(TraceCounts &Counts) {
    if (Shard.empty())
      return Error::success();
    std::string Name = shardFileName(NextShard);
    SmallString<256> Path(Dir);
    sys::path::append(Path, Name);
    if (Error E = Shard.writeTo(Path, {{"format", "ekka-trace"}}))
      return E;
    ++NextShard;
    ++Counts.Shards;
    Counts.CapturedBytes += Shard.dataBytes();
    Counts.CapturedTensors += Pending.size();
    for (std::string &Buffer : Shard.takeBuffers())
      Owner.recycle(std::move(Buffer));
    if (Error E = Db->exec("BEGIN"))
      return E;
    for (TensorRecord &R : Pending) {
      R.Shard = Name;
      if (Error E = insertTensor(R))
        return E;
    }
    Pending.clear();
    return Db->exec("COMMIT");
  }

  /// Drops what a failed writer still holds, counting the lost captures.
  void abandon(TraceCounts &Counts) {
    Counts.DroppedCaptures += Pending.size();
    Pending.clear();
    Shard.clear();
  }

  std::unique_ptr<SQLiteDatabase> Db;

private:
  Error add(MetaItem &M, TraceCounts &) {
    if (M.Later)
      M.Value = M.Later();
    return Meta.bind(1, M.Key).bind(2, M.Value).run();
  }

  Error add(ModuleCallRecord &R, TraceCounts &Counts) {
    ++Counts.ModuleCalls;
    Call.bind(1, R.Id);
    Call.bind(2, R.ParentId);
    Call.bind(3, R.Seq).bind(4, R.Step).bind(5, R.Path).bind(6, R.ClassName);
    Call.bind(7, R.ClassQualname).bind(8, R.SourceFile).bind(9, R.SourceLine);
    return Call.run();
  }

  Error add(OpRecord &R, TraceCounts &Counts) {
    return insertOp(R.Id, R.ModuleCallId, R.Seq, R.Name, R.Schema, Counts);
  }
  Error add(OpEvent &R, TraceCounts &Counts) {
    return insertOp(R.Id, R.ModuleCallId, R.Seq, R.Text->Name, R.Text->Schema, Counts);
  }
  Error insertOp(int64_t Id, std::optional<int64_t> ModuleCallId, int64_t Seq, StringRef Name,
                 StringRef Schema, TraceCounts &Counts) {
    ++Counts.Ops;
    Op.bind(1, Id);
    Op.bind(2, ModuleCallId);
    Op.bind(3, Seq).bind(4, Name).bind(5, Schema);
    return Op.run();
  }

  Error add(KernelRecord &R, TraceCounts &Counts) {
    ++Counts.Kernels;
    Kernel.bind(1, R.Id);
    Kernel.bind(2, R.OpId);
    Kernel.bind(3, R.ModuleCallId);
    Kernel.bind(4, R.Seq).bind(5, R.Name).bind(6, dim3(R.Grid)).bind(7, dim3(R.Block));
    Kernel.bind(8, int64_t(R.SharedMem)).bind(9, int64_t(R.Stream));
    Kernel.bind(10, int64_t(R.CorrelationId));
    return Kernel.run();
  }

  Error add(TensorItem &T, TraceCounts &Counts) {
    ++Counts.Tensors;
    if (T.Complete) {
      T.Complete(T.Record, T.Data);
      T.Complete = nullptr; // what it held (device copies) is released now
    }
    if (T.Data && !T.Record.Stats)
      T.Record.Stats = statsOfBytes(T.Record.Type, *T.Data);
    if (!T.Data || T.Use == BytesUse::StatsOnly) {
      if (T.Data)
        Owner.recycle(std::move(*T.Data));
      return insertTensor(T.Record);
    }
    // Captured: the row waits for its shard to be on disk; the shard keeps
    // the buffer itself until then.
    T.Record.Key = "t" + std::to_string(T.Record.Id);
    Shard.add(T.Record.Key, T.Record.Type, T.Record.Shape, std::move(*T.Data));
    Pending.push_back(std::move(T.Record));
    return Error::success();
  }

  Error insertTensor(const TensorRecord &R) {
    Tensor.bind(1, R.Id).bind(2, ownerName(R.Owner)).bind(3, R.OwnerId).bind(4, R.Role);
    Tensor.bind(5, R.Index).bind(6, dtypeName(R.Type)).bind(7, jsonInts(R.Shape));
    Tensor.bind(8, jsonInts(R.Strides)).bind(9, R.Device);
    if (R.Stats) {
      const TensorStats &S = *R.Stats;
      auto Real = [&](int I, double V) {
        // SQLite has no NaN; a NaN statistic is stored as NULL (the counts say why).
        if (V != V)
          Tensor.bindNull(I);
        else
          Tensor.bindDouble(I, V);
      };
      Real(10, S.Sum);
      Real(11, S.SumSq);
      Real(12, S.Min);
      Real(13, S.Max);
      Tensor.bind(14, S.NanCount).bind(15, S.InfCount);
    } else {
      for (int I = 10; I <= 15; ++I)
        Tensor.bindNull(I);
    }
    if (R.Shard.empty()) {
      Tensor.bindNull(16).bindNull(17);
    } else {
      Tensor.bind(16, R.Shard).bind(17, R.Key);
    }
    Tensor.bind(18, R.SourceId);
    return Tensor.run();
  }

  TraceWriter &Owner;
  std::string Dir;
  uint64_t ShardBytes;
  SQLiteStatement Meta, Call, Op, Kernel, Tensor;
  SafeTensorsWriter Shard;
  std::vector<TensorRecord> Pending;
  unsigned NextShard = 0;
};

void removeTrace(StringRef Dir) {
  std::error_code EC;
  for (sys::fs::directory_iterator It(Dir, EC), End; It != End && !EC; It.increment(EC)) {
    StringRef Name = sys::path::filename(It->path());
    if (Name.starts_with(TraceDatabaseName) ||
        (Name.starts_with("tensors-") && Name.contains(".safetensors")))
      sys::fs::remove(It->path());
    else if ((Name.starts_with("rank-") || Name.starts_with("process-")) &&
             sys::fs::is_directory(It->path()))
      sys::fs::remove_directories(It->path());
  }
}

TraceWriter::TraceWriter(std::string Dir, TraceWriterOptions Options)
    : Dir(std::move(Dir)), Options(Options) {}

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
  auto Db = SQLiteDatabase::open(DbPath, SQLiteDatabase::Mode::ReadWriteCreate);
  if (!Db)
    return Db.takeError();
  // WAL: a reader (ekka-trace show) can look while the program still runs,
  // and a killed program leaves every committed batch intact.
  if (Error E = (*Db)->exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL"))
    return E;
  if (Error E = (*Db)->exec(traceSchema()))
    return E;
  std::unique_ptr<TraceWriter> W(new TraceWriter(Dir.str(), Options));
  W->Storage = std::make_unique<Backend>(*W, Dir.str(), std::move(*Db), Options.ShardBytes);
  if (Error E = W->Storage->prepare())
    return E;
  W->setMeta("format", "ekka-trace " + std::to_string(TraceFormatMajor) + "." +
                           std::to_string(TraceFormatMinor));
  W->Worker = std::thread([Raw = W.get()] {
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
/// A program that records faster than SQLite takes rows (a loop of tiny
/// ops) waits once this many records are queued, as it does for bytes.
constexpr size_t MaxQueuedRecords = 1 << 18;
} // namespace

template <typename T, typename... Args>
void TraceWriter::enqueue(uint64_t Bytes, Args &&...A) {
  std::unique_lock<std::mutex> Lock(Mutex);
  if (Closing)
    return; // closed: late records (a callback still running) are dropped
  // Back-pressure: a program that captures faster than the disk takes waits
  // here rather than growing the queue without bound.
  auto Room = [&] {
    return Closing || ((QueuedBytes == 0 || QueuedBytes + Bytes <= 2 * Options.ShardBytes) &&
                       Queue.size() < MaxQueuedRecords);
  };
  if (!Room()) {
    Wake.notify_one();
    Drained.wait(Lock, Room);
    if (Closing)
      return; // closed while it waited: dropped like any late record
  }
  Queue.emplace_back(std::in_place_type<T>, std::forward<Args>(A)...);
  QueuedBytes += Bytes;
  if (Bytes || Queue.size() == WakeRecords || (WriterIdle && Queue.size() == 1))
    Wake.notify_one();
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
  enqueue<MetaItem>(0, Key.str(), "", std::move(Value));
}
void TraceWriter::addModuleCall(ModuleCallRecord R) { enqueue<ModuleCallRecord>(0, std::move(R)); }
void TraceWriter::addOp(OpRecord R) { enqueue<OpRecord>(0, std::move(R)); }
const TraceWriter::OpText *TraceWriter::internOp(std::string Name, std::string Schema) {
  std::lock_guard<std::mutex> Lock(TextMutex);
  return &*OpTexts.insert(OpText{std::move(Name), std::move(Schema)}).first;
}
void TraceWriter::addOp(int64_t Id, std::optional<int64_t> ModuleCallId, int64_t Seq,
                        const OpText *Text) {
  enqueue<OpEvent>(0, Id, ModuleCallId, Seq, Text);
}
void TraceWriter::addKernel(KernelRecord R) { enqueue<KernelRecord>(0, std::move(R)); }
void TraceWriter::addTensor(TensorRecord R, std::optional<std::string> Data, BytesUse Use) {
  uint64_t Bytes = Data ? Data->size() : 0;
  enqueue<TensorItem>(Bytes, std::move(R), std::move(Data), Use, nullptr);
}
void TraceWriter::addTensor(TensorRecord R, Completion Complete, uint64_t Bytes, BytesUse Use) {
  enqueue<TensorItem>(Bytes, std::move(R), std::nullopt, Use, std::move(Complete));
}

void TraceWriter::run() {
  std::vector<Item> Batch;
  bool Failed = false;
  while (true) {
    bool Last;
    {
      std::unique_lock<std::mutex> Lock(Mutex);
      // Nothing queued: sleep until the first record. Then collect for up
      // to a period.
      WriterIdle = true;
      Wake.wait(Lock, [&] { return Closing || !Queue.empty(); });
      WriterIdle = false;
      Wake.wait_for(Lock, WriterPeriod, [&] {
        return Closing || QueuedBytes || Queue.size() >= WakeRecords;
      });
      Batch.swap(Queue);
      QueuedBytes = 0;
      Last = Closing;
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
    if (Last)
      break;
  }
}

// The writer thread holds CountsMutex across each batch's SQLite and file
// work.
void TraceWriter::pauseForFork() { CountsMutex.lock(); }
void TraceWriter::resumeAfterFork() { CountsMutex.unlock(); }

Error TraceWriter::close() {
  if (!Worker.joinable())
    return Error::success();
  {
    std::lock_guard<std::mutex> Lock(Mutex);
    Closing = true;
  }
  Wake.notify_one();
  Drained.notify_all();
  Worker.join();
  // Checkpoint the WAL into trace.db so the trace is one file plus shards.
  if (Storage && Storage->Db)
    consumeError(Storage->Db->exec("PRAGMA wal_checkpoint(TRUNCATE)"));
  std::lock_guard<std::mutex> Lock(CountsMutex);
  if (FailureMessage.empty())
    return Error::success();
  TraceCounts C = Counts;
  return makeError(FailureMessage + "; the trace keeps what was written before (" +
                   Twine(C.Shards) + " shards), " + Twine(C.DroppedCaptures) +
                   " captured tensors were lost");
}

TraceCounts TraceWriter::counts() const {
  std::lock_guard<std::mutex> Lock(CountsMutex);
  return Counts;
}

} // namespace ekka
