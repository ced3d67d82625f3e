//===- TraceReader.cpp ----------------------------------------------------===//
#include "ekka/Trace/TraceReader.h"
#include "ekka/Support/Error.h"
#include "ekka/Support/JSON.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

using namespace llvm;

namespace ekka {

namespace {

/// A JSON array of integers (a kernel's grid, a tensor's strides); none
/// for anything else. With \p Sizes, a tensor row's shape: each at least 0,
/// and their product holds in 64 bits.
std::optional<TensorDims> parseInts(StringRef Text, bool Sizes = false) {
  Expected<json::Value> V = parseJSON(Text);
  if (!V) {
    consumeError(V.takeError());
    return std::nullopt;
  }
  const json::Array *A = V->getAsArray();
  if (!A)
    return std::nullopt;
  TensorDims Out;
  int64_t Elements = 1;
  for (const json::Value &E : *A) {
    auto N = E.getAsInteger();
    if (!N || (Sizes && (*N < 0 || __builtin_mul_overflow(Elements, *N, &Elements))))
      return std::nullopt;
    Out.push_back(*N);
  }
  return Out;
}

std::optional<TensorDims> parseShape(StringRef Text) { return parseInts(Text, /*Sizes=*/true); }

std::string dimsText(ArrayRef<int64_t> Dims) {
  std::string Out = "[";
  for (size_t I = 0; I < Dims.size(); ++I)
    Out += (I ? ", " : "") + std::to_string(Dims[I]);
  return Out + "]";
}

std::optional<int64_t> optionalInt(const SQLiteStatement &R, int I) {
  if (R.columnIsNull(I))
    return std::nullopt;
  return R.columnInt(I);
}

/// A shard is a file of the trace directory, never a path out of it: a name
/// with a '/' (../x, /abs/x), "." or ".." is refused, neither opened nor
/// looked for.
bool isShardFileName(StringRef Shard) {
  return !Shard.contains('/') && Shard != "." && Shard != "..";
}

Error shardOutsideTrace(StringRef Dir, int64_t TensorId, StringRef Shard) {
  return makeError("'" + Dir + "' is corrupt: tensor " + Twine(TensorId) + " names shard '" +
                   Shard + "', not a file of the trace");
}

/// A file of a trace read where it lies: a symlink (the file, or a
/// directory on its way) that leads out of \p Dir is refused, never read; one
/// to another file of the trace is followed. One that leads nowhere is left
/// to its reader to say missing.
Error checkInsideTrace(StringRef Dir, StringRef Path) {
  SmallString<256> RealDir, RealPath;
  if (sys::fs::real_path(Dir, RealDir) || sys::fs::real_path(Path, RealPath))
    return Error::success();
  if (sys::path::parent_path(RealPath) == RealDir)
    return Error::success();
  return makeError("'" + Path + "' leads out of the trace, to '" + RealPath +
                   "' (a symlink): refused, not read");
}

// SQLite reads, and may write, files beside the database it opens, named
// from its real path (RealDb): the write-ahead log, that log's index and a
// rollback journal. Each is the trace's only if it is a regular file in
// it: a symlink out of the trace or one that leads nowhere, or anything
// else (a FIFO would be read without end) is refused before SQLite opens
// anything. Decided from what lstat found: a side file the writer removes
// after it (a trace closing as it is read) is no error. Errors name it
// beside DbPath, the trace.db given (one that leads out, by its real path).
Error checkSidecars(StringRef Dir, StringRef DbPath, StringRef RealDb) {
  for (StringRef Suffix : {"-wal", "-shm", "-journal"}) {
    std::string Path = (RealDb + Suffix).str(), Named = (DbPath + Suffix).str();
    sys::fs::file_status St;
    if (sys::fs::status(Path, St, /*Follow=*/false) || !sys::fs::exists(St) ||
        St.type() == sys::fs::file_type::regular_file)
      continue;
    if (St.type() == sys::fs::file_type::symlink_file) {
      SmallString<256> Target;
      if (sys::fs::real_path(Path, Target))
        return makeError("'" + Named + "' is a symlink that leads nowhere: refused, not read");
      if (Error E = checkInsideTrace(Dir, Path))
        return E;
      if (sys::fs::is_regular_file(Target))
        continue;
    }
    return makeError("'" + Named + "' is not a regular file: refused, not read");
  }
  return Error::success();
}

} // namespace

Expected<std::unique_ptr<TraceReader>> TraceReader::open(StringRef Dir) {
  if (!sys::fs::is_directory(Dir))
    return makeError("'" + Dir + "' is not a trace directory (no such directory)");
  SmallString<256> DbPath(Dir);
  sys::path::append(DbPath, TraceDatabaseName);
  if (!sys::fs::exists(DbPath))
    return makeError("'" + Dir + "' is not a trace directory (no trace.db)");
  if (!sys::fs::is_regular_file(DbPath)) // a FIFO would be read without end
    return makeError("'" + DbPath + "' is not a regular file");
  if (Error E = checkInsideTrace(Dir, DbPath))
    return E;
  SmallString<256> RealDb;
  if (sys::fs::real_path(DbPath, RealDb))
    RealDb = DbPath;
  if (Error E = checkSidecars(Dir, DbPath, RealDb))
    return E;
  // A trace not closed keeps its rows in trace.db-wal (WAL mode: byte 18
  // of the header is 2): copied without it, trace.db holds what was
  // checkpointed, possibly no table. Asked before the database is opened,
  // which would make an empty -wal (and -shm) beside it, where a later
  // reader would take it for the trace's: it is then opened immutable,
  // which makes none.
  auto Header = MemoryBuffer::getFileSlice(DbPath, 20, 0);
  bool WalMissing = Header && (*Header)->getBufferSize() == 20 &&
                    (*Header)->getBuffer()[18] == 2 && !sys::fs::exists(RealDb + "-wal");
  auto Db = SQLiteDatabase::open(DbPath, WalMissing ? SQLiteDatabase::Mode::Immutable
                                                    : SQLiteDatabase::Mode::ReadOnly);
  if (!Db)
    return Db.takeError();
  std::unique_ptr<TraceReader> R(new TraceReader(Dir.str(), std::move(*Db)));
  if (Error E = R->readMeta()) {
    if (!WalMissing)
      return E;
    consumeError(std::move(E));
    return makeError("'" + DbPath + "' is not a whole trace: it was not closed, and its rows "
                     "are in trace.db-wal, which is not beside it (copy the two together)");
  }
  return R;
}

Error TraceReader::readMeta() {
  auto NotATrace = [&](StringRef Why) {
    return makeError("'" + Dir + "/trace.db' is not an Ekka trace (" + Why + ")");
  };
  auto S = Db->prepare("SELECT key, value FROM meta");
  if (!S) {
    consumeError(S.takeError());
    return NotATrace(Db->lastMessage());
  }
  if (Error E = S->forEachRow([&](const SQLiteStatement &Row) {
        Meta[Row.columnText(0).str()] = Row.columnText(1).str();
      })) {
    consumeError(std::move(E));
    return NotATrace(Db->lastMessage());
  }
  auto It = Meta.find("format");
  if (It == Meta.end())
    return NotATrace("no format version");
  StringRef Format = It->second;
  auto [Kind, Version] = Format.split(' ');
  auto [MajorText, MinorText] = Version.split('.');
  auto Digits = [](StringRef T) { return !T.empty() && llvm::all_of(T, isDigit); };
  if (Kind != "ekka-trace" || !Digits(MajorText) || !Digits(MinorText))
    return NotATrace(("format '" + Format + "'").str());
  unsigned Major = 0; // digits past any number are a newer major too
  if (MajorText.getAsInteger(10, Major) || Major > TraceFormatMajor)
    return makeError("'" + Dir + "' is a trace of format " + Version +
                     "; this Ekka reads format " + Twine(TraceFormatMajor) +
                     ".x and older (upgrade Ekka)");
  if (Major < 1) // 1.0 was the first
    return makeError("'" + Dir + "' is a trace of format " + Version +
                     ", older than any Ekka wrote (the first was 1.0)");
  FormatMajor = Major;
  if (MinorText.getAsInteger(10, FormatMinor))
    FormatMinor = ~0u; // digits past any number: newer than any minor
  return Error::success();
}

Expected<std::vector<std::unique_ptr<TraceReader>>>
TraceReader::openRanks(StringRef Dir) {
  std::vector<std::unique_ptr<TraceReader>> Ranks;
  SmallString<256> DbPath(Dir);
  sys::path::append(DbPath, TraceDatabaseName);
  // rank-0, rank-1, ... in numeric order: those that traced (a rank that
  // ran no module left none).
  std::vector<std::pair<unsigned, std::string>> RankDirs;
  std::error_code EC;
  for (sys::fs::directory_iterator It(Dir, EC), End; It != End && !EC; It.increment(EC)) {
    StringRef Name = sys::path::filename(It->path());
    unsigned Rank;
    if (Name.consume_front("rank-") && !Name.getAsInteger(10, Rank) &&
        sys::fs::exists(It->path() + "/" + TraceDatabaseName.str()))
      RankDirs.emplace_back(Rank, It->path());
  }
  // A trace.db of its own, unless it is an empty file beside the ranks'
  // (what an SQLite client makes of a path it was asked to open there).
  uint64_t Size = 0;
  if (sys::fs::exists(DbPath) &&
      (RankDirs.empty() || sys::fs::file_size(DbPath, Size) || Size != 0)) {
    auto R = open(Dir);
    if (!R)
      return R.takeError();
    Ranks.push_back(std::move(*R));
    return Ranks;
  }
  llvm::sort(RankDirs);
  for (size_t I = 1; I < RankDirs.size(); ++I)
    if (RankDirs[I].first == RankDirs[I - 1].first)
      return makeError("'" + Dir + "' holds two traces of rank " + Twine(RankDirs[I].first) +
                       ": '" + RankDirs[I - 1].second + "' and '" + RankDirs[I].second + "'");
  for (const auto &[Rank, RankDir] : RankDirs) {
    if (Error E = checkInsideTrace(Dir, RankDir))
      return E;
    auto R = open(RankDir);
    if (!R)
      return R.takeError();
    // The directory's name is the rank it is read as: the trace's own rank
    // (one renamed or copied in would be read as another rank's shards).
    const auto &Meta = (*R)->meta();
    auto Own = Meta.find("rank"), World = Meta.find("world_size");
    int64_t WorldSize = 0, OwnRank = 0;
    if (Own != Meta.end() &&
        (StringRef(Own->second).getAsInteger(10, OwnRank) || OwnRank != int64_t(Rank)))
      return makeError("'" + RankDir + "' holds the trace of rank " + Own->second +
                       " (its meta rank), not rank " + Twine(Rank));
    if (World != Meta.end() && !StringRef(World->second).getAsInteger(10, WorldSize) &&
        int64_t(Rank) >= WorldSize)
      return makeError("'" + RankDir + "' is beyond the run's world_size " + World->second);
    Ranks.push_back(std::move(*R));
  }
  if (Ranks.empty() && !startedRanks(Dir).empty())
    return makeError("'" + Dir + "' holds no trace: its ranks began under ekka-trace, and none "
                     "traced a module (rank-N/ holds only its start marker)");
  if (Ranks.empty())
    return makeError("'" + Dir + "' is not a trace directory (no trace.db, no rank-N/)");
  return Ranks;
}

std::vector<unsigned> TraceReader::startedRanks(StringRef Dir) {
  std::vector<unsigned> Out;
  std::error_code EC;
  for (sys::fs::directory_iterator It(Dir, EC), End; It != End && !EC; It.increment(EC)) {
    StringRef Name = sys::path::filename(It->path());
    unsigned Rank;
    if (Name.consume_front("rank-") && !Name.getAsInteger(10, Rank) &&
        sys::fs::exists(It->path() + "/" + StartedMarkerName.str()) &&
        !sys::fs::exists(It->path() + "/" + TraceDatabaseName.str()))
      Out.push_back(Rank);
  }
  llvm::sort(Out);
  return Out;
}

template <typename Record>
void TraceReader::reserveRows(std::vector<Record> &Out, StringRef Table) {
  // Grown row by row, a vector of a long run's rows would hold up to twice
  // their room, and both copies while it moves them.
  if (Expected<uint64_t> N = rowCount(Table))
    Out.reserve(size_t(*N));
  else
    consumeError(N.takeError());
}

Expected<std::vector<ModuleCallRecord>> TraceReader::moduleCalls() {
  std::vector<ModuleCallRecord> Out;
  reserveRows(Out, "module_calls");
  auto S = Db->prepare("SELECT id, parent_id, seq, step, path, class_name, class_qualname, "
                       "source_file, source_line FROM module_calls ORDER BY seq");
  if (!S)
    return S.takeError();
  // A call's parent was open when it began: an earlier call. Anything
  // else (a parent that is missing, later, or the call itself) is a
  // corrupt trace, whose tree would lose calls or loop.
  DenseSet<int64_t> Seen;
  std::string Problem;
  if (Error E = S->forEachRow([&](const SQLiteStatement &Row) {
        ModuleCallRecord R;
        R.Id = Row.columnInt(0);
        R.ParentId = optionalInt(Row, 1);
        R.Seq = Row.columnInt(2);
        R.Step = Row.columnInt(3);
        if (!Problem.empty())
          return;
        if (R.ParentId && !Seen.count(*R.ParentId)) {
          Problem = "module call " + std::to_string(R.Id) + " has parent " +
                    std::to_string(*R.ParentId) + ", not an earlier call";
          return;
        }
        if (!Seen.insert(R.Id).second) {
          Problem = "two module calls have id " + std::to_string(R.Id);
          return;
        }
        R.Path = Row.columnText(4).str();
        R.ClassName = Row.columnText(5).str();
        R.ClassQualname = Row.columnText(6).str();
        R.SourceFile = Row.columnText(7).str();
        R.SourceLine = Row.columnInt(8);
        Out.push_back(std::move(R));
      }))
    return E;
  if (!Problem.empty())
    return makeError("'" + Dir + "/trace.db' is corrupt: " + Problem);
  return Out;
}

Expected<std::vector<OpRecord>> TraceReader::ops() {
  std::vector<OpRecord> Out;
  reserveRows(Out, "ops");
  auto S = Db->prepare("SELECT id, module_call_id, seq, name, schema FROM ops ORDER BY seq");
  if (!S)
    return S.takeError();
  if (Error E = S->forEachRow([&](const SQLiteStatement &Row) {
        OpRecord R;
        R.Id = Row.columnInt(0);
        R.ModuleCallId = optionalInt(Row, 1);
        R.Seq = Row.columnInt(2);
        R.Name = Row.columnText(3).str();
        R.Schema = Row.columnText(4).str();
        Out.push_back(std::move(R));
      }))
    return E;
  return Out;
}

Expected<std::vector<KernelRecord>> TraceReader::kernels() {
  std::vector<KernelRecord> Out;
  reserveRows(Out, "kernels");
  auto S = Db->prepare("SELECT id, op_id, module_call_id, seq, name, grid, block, shared_mem, "
                       "stream, correlation_id FROM kernels ORDER BY seq");
  if (!S)
    return S.takeError();
  if (Error E = S->forEachRow([&](const SQLiteStatement &Row) {
        KernelRecord R;
        R.Id = Row.columnInt(0);
        R.OpId = optionalInt(Row, 1);
        R.ModuleCallId = optionalInt(Row, 2);
        R.Seq = Row.columnInt(3);
        R.Name = Row.columnText(4).str();
        TensorDims G = parseInts(Row.columnText(5)).value_or(TensorDims()),
                   B = parseInts(Row.columnText(6)).value_or(TensorDims());
        for (unsigned I = 0; I < 3; ++I) {
          R.Grid[I] = I < G.size() ? uint32_t(G[I]) : 0;
          R.Block[I] = I < B.size() ? uint32_t(B[I]) : 0;
        }
        R.SharedMem = uint64_t(Row.columnInt(7));
        R.Stream = uint64_t(Row.columnInt(8));
        R.CorrelationId = uint64_t(Row.columnInt(9));
        Out.push_back(std::move(R));
      }))
    return E;
  return Out;
}

Expected<std::vector<SpanRecord>> TraceReader::spans() {
  std::vector<SpanRecord> Out;
  auto S = Db->prepare("SELECT owner, owner_id, thread, start_ns, end_ns FROM spans "
                       "ORDER BY start_ns, end_ns DESC");
  if (!S) {
    // Format 1.8 added the table; an older trace has no timeline.
    if (!formatAtLeast(1, 8)) {
      consumeError(S.takeError());
      return Out;
    }
    return S.takeError();
  }
  std::string Problem;
  if (Error E = S->forEachRow([&](const SQLiteStatement &Row) {
        SpanRecord R;
        std::optional<TensorOwner> Owner = parseOwner(Row.columnText(0));
        R.OwnerId = Row.columnInt(1);
        R.Thread = Row.columnInt(2);
        R.StartNs = Row.columnInt(3);
        R.EndNs = Row.columnInt(4);
        const char *Wrong = !Owner                        ? " has an unknown owner"
                            : *Owner == TensorOwner::Kernel ? ": spans are module calls' and ops'"
                            : R.EndNs < R.StartNs           ? " ends before it starts"
                                                            : nullptr;
        if (Wrong) {
          if (Problem.empty())
            Problem = "a span of " + Row.columnText(0).str() + " " + std::to_string(R.OwnerId) +
                      Wrong;
          return;
        }
        R.Owner = *Owner;
        Out.push_back(R);
      }))
    return E;
  if (!Problem.empty())
    return makeError("'" + directory() + "' is corrupt: " + Problem);
  return Out;
}

Expected<std::vector<TensorRecord>> TraceReader::tensors() {
  std::vector<TensorRecord> Out;
  reserveRows(Out, "tensors");
  // source_id arrived with format 1.1, layout with 1.4: older traces lack them.
  auto Has = [&](const char *Column) {
    auto Probe = Db->prepare(std::string("SELECT ") + Column + " FROM tensors LIMIT 0");
    if (!Probe)
      consumeError(Probe.takeError());
    return bool(Probe);
  };
  bool HasSource = Has("source_id"), HasLayout = Has("layout");
  auto S = Db->prepare(std::string("SELECT id, owner, owner_id, role, idx, dtype, shape, strides, "
                                   "device, sum, sumsq, min, max, nan_count, inf_count, shard, key, ") +
                       (HasSource ? "source_id" : "NULL") + ", " +
                       (HasLayout ? "layout" : "NULL") + " FROM tensors ORDER BY id");
  if (!S)
    return S.takeError();
  std::string Problem;
  if (Error E = S->forEachRow([&](const SQLiteStatement &Row) {
        TensorRecord R;
        R.Id = Row.columnInt(0);
        auto Owner = parseOwner(Row.columnText(1));
        auto Type = parseDType(Row.columnText(5));
        if (!Owner || !Type) {
          if (Problem.empty())
            Problem = "tensor " + std::to_string(R.Id) + " has owner '" +
                      Row.columnText(1).str() + "' and dtype '" + Row.columnText(5).str() + "'";
          return;
        }
        R.Owner = *Owner;
        R.OwnerId = Row.columnInt(2);
        R.Role = Row.columnText(3).str();
        R.Index = Row.columnInt(4);
        R.Type = *Type;
        auto Shape = parseShape(Row.columnText(6));
        if (!Shape) {
          if (Problem.empty())
            Problem = "tensor " + std::to_string(R.Id) + " has shape '" +
                      Row.columnText(6).str() + "'";
          return;
        }
        R.Shape = std::move(*Shape);
        R.Strides = parseInts(Row.columnText(7)).value_or(TensorDims());
        R.Device = Row.columnText(8).str();
        if (!Row.columnIsNull(13)) {
          TensorStats St;
          auto Real = [&](int I) {
            return Row.columnIsNull(I) ? std::numeric_limits<double>::quiet_NaN()
                                       : Row.columnDouble(I);
          };
          St.Sum = Real(9);
          St.SumSq = Real(10);
          St.Min = Real(11);
          St.Max = Real(12);
          St.NanCount = Row.columnInt(13);
          St.InfCount = Row.columnInt(14);
          R.Stats = St;
        }
        R.Shard = Row.columnText(15).str();
        R.Key = Row.columnText(16).str();
        R.SourceId = optionalInt(Row, 17);
        R.Layout = Row.columnText(18).str();
        Out.push_back(std::move(R));
      }))
    return E;
  if (!Problem.empty())
    return makeError("'" + Dir + "/trace.db' is corrupt: " + Problem);
  return Out;
}

Expected<uint64_t> TraceReader::rowCount(StringRef Table) {
  auto S = Db->prepare(("SELECT count(*) FROM " + Table).str());
  if (!S)
    return S.takeError();
  uint64_t N = 0;
  if (Error E = S->forEachRow([&](const SQLiteStatement &Row) { N = uint64_t(Row.columnInt(0)); }))
    return E;
  return N;
}

Expected<std::map<std::string, uint64_t>> TraceReader::missingShards() {
  std::map<std::string, uint64_t> Missing;
  auto S = Db->prepare("SELECT shard, count(*), min(id) FROM tensors WHERE shard IS NOT NULL "
                       "AND shard != '' GROUP BY shard");
  if (!S)
    return S.takeError();
  std::optional<std::pair<int64_t, std::string>> Outside; // the first, with a tensor naming it
  if (Error E = S->forEachRow([&](const SQLiteStatement &Row) {
        std::string Shard = Row.columnText(0).str();
        if (!isShardFileName(Shard)) {
          if (!Outside)
            Outside.emplace(Row.columnInt(2), Shard);
          return;
        }
        SmallString<256> Path(Dir);
        sys::path::append(Path, Shard);
        if (!sys::fs::exists(Path))
          Missing[Shard] = uint64_t(Row.columnInt(1));
      }))
    return E;
  if (Outside)
    return shardOutsideTrace(Dir, Outside->first, Outside->second);
  return Missing;
}

Expected<TraceCounts> TraceReader::counts() {
  TraceCounts Out;
  for (auto [Table, N] : {std::pair{"module_calls", &Out.ModuleCalls}, std::pair{"ops", &Out.Ops},
                          std::pair{"kernels", &Out.Kernels}, std::pair{"tensors", &Out.Tensors}}) {
    auto Rows = rowCount(Table);
    if (!Rows)
      return Rows.takeError();
    *N = *Rows;
  }
  auto S = Db->prepare("SELECT id, dtype, shape, shard FROM tensors WHERE shard IS NOT NULL "
                       "AND shard != ''");
  if (!S)
    return S.takeError();
  std::string Problem;
  StringSet<> Shards;
  if (Error E = S->forEachRow([&](const SQLiteStatement &Row) {
        auto Type = parseDType(Row.columnText(1));
        if (!Type) {
          if (Problem.empty())
            Problem = "tensor " + std::to_string(Row.columnInt(0)) + " has dtype '" +
                      Row.columnText(1).str() + "'";
          return;
        }
        uint64_t N = 1;
        for (int64_t D : parseShape(Row.columnText(2)).value_or(TensorDims()))
          N *= uint64_t(D);
        ++Out.CapturedTensors;
        Out.CapturedBytes += dtypeBytes(*Type, N).value_or(0);
        Shards.insert(Row.columnText(3));
      }))
    return E;
  if (!Problem.empty())
    return makeError("'" + Dir + "/trace.db' is corrupt: " + Problem);
  Out.Shards = Shards.size();
  return Out;
}

Expected<std::map<int64_t, CallTally>> TraceReader::tallyPerModuleCall() {
  std::map<int64_t, CallTally> Out;
  // (module call, count) rows, each into its field of the call's tally.
  const std::pair<const char *, uint64_t CallTally::*> Counts[] = {
      {"SELECT module_call_id, count(*) FROM ops WHERE module_call_id IS NOT NULL GROUP BY "
       "module_call_id",
       &CallTally::Ops},
      {"SELECT owner_id, count(*) FROM tensors WHERE owner = 'module_call' AND shard IS NOT "
       "NULL AND shard != '' GROUP BY owner_id",
       &CallTally::Captured}};
  for (const auto &[Sql, Field] : Counts) {
    auto S = Db->prepare(Sql);
    if (!S)
      return S.takeError();
    if (Error E = S->forEachRow([&, Field = Field](const SQLiteStatement &Row) {
          Out[Row.columnInt(0)].*Field = uint64_t(Row.columnInt(1));
        }))
      return E;
  }
  return Out;
}

Expected<StringRef> TraceReader::tensorBytes(const TensorRecord &T) {
  if (T.Shard.empty())
    return makeError("tensor " + Twine(T.Id) + " of '" + Dir + "' was not captured");
  if (!isShardFileName(T.Shard))
    return shardOutsideTrace(Dir, T.Id, T.Shard);
  std::lock_guard<std::mutex> Lock(ShardsMutex);
  auto &File = Shards[T.Shard];
  if (!File) {
    SmallString<256> Path(Dir);
    sys::path::append(Path, T.Shard);
    if (Error E = checkInsideTrace(Dir, Path)) {
      Shards.erase(T.Shard);
      return E;
    }
    auto Opened = SafeTensorsFile::open(Path);
    if (!Opened) {
      Shards.erase(T.Shard);
      return Opened.takeError();
    }
    File = std::move(*Opened);
  }
  const SafeTensorInfo *Info = File->find(T.Key);
  if (!Info)
    return makeError("'" + Dir + "/" + T.Shard + "' has no tensor '" + T.Key + "'");
  // The row and the shard were written together: a difference is a
  // corrupt trace, whose bytes would be read as what they are not.
  if (Info->Type != T.Type || ArrayRef<int64_t>(Info->Shape) != ArrayRef<int64_t>(T.Shape))
    return makeError("'" + Dir + "' is corrupt: tensor " + Twine(T.Id) + " is " +
                     dtypeName(T.Type) + " " + dimsText(T.Shape) + " in trace.db but " +
                     dtypeName(Info->Type) + " " + dimsText(Info->Shape) + " in '" + T.Shard +
                     "'");
  StringRef Bytes = File->bytes(*Info);
  HandedOutBytes += Bytes.size();
  if (HandedOutBytes > ResidentShardBytes) {
    // Those of this shard too: the tensor handed out is faulted in as it
    // is read.
    for (const auto &Open : Shards)
      Open.second->dropResidentPages();
    HandedOutBytes = Bytes.size();
  }
  return Bytes;
}

bool TraceReader::whole() const {
  auto Lost = Meta.find(LostRecordsKey.str());
  return Lost != Meta.end() && Lost->second == "0";
}

Error TraceReader::checkReferences(ArrayRef<ModuleCallRecord> Calls, ArrayRef<OpRecord> Ops,
                                   ArrayRef<KernelRecord> Kernels,
                                   ArrayRef<TensorRecord> Tensors) const {
  // A killed program leaves rows of calls it had not ended, a tensor whose
  // source was still queued: not a corrupt trace, and said as its own.
  if (!whole())
    return Error::success();
  auto SortedIds = [](auto Records) {
    std::vector<int64_t> Ids;
    Ids.reserve(Records.size());
    for (const auto &R : Records)
      Ids.push_back(R.Id);
    llvm::sort(Ids);
    return Ids;
  };
  std::vector<int64_t> CallIds = SortedIds(Calls), OpIds = SortedIds(Ops),
                       KernelIds = SortedIds(Kernels);
  auto Holds = [](const std::vector<int64_t> &Ids, int64_t Id) {
    return std::binary_search(Ids.begin(), Ids.end(), Id);
  };
  auto Corrupt = [&](const Twine &What, int64_t Id, StringRef Names, int64_t Other) {
    return makeError("'" + Dir + "' is corrupt: " + What + " " + Twine(Id) + " names " + Names +
                     " " + Twine(Other) + ", which the trace does not hold");
  };
  for (const OpRecord &O : Ops)
    if (O.ModuleCallId && !Holds(CallIds, *O.ModuleCallId))
      return Corrupt("op", O.Id, "module call", *O.ModuleCallId);
  for (const KernelRecord &K : Kernels) {
    if (K.OpId && !Holds(OpIds, *K.OpId))
      return Corrupt("kernel", K.Id, "op", *K.OpId);
    if (K.ModuleCallId && !Holds(CallIds, *K.ModuleCallId))
      return Corrupt("kernel", K.Id, "module call", *K.ModuleCallId);
  }
  // Tensors come by id (tensors()); a source is an earlier tensor, an
  // output recorded before the input that repeats it.
  auto TensorAt = [&](int64_t Id) {
    auto It = llvm::partition_point(Tensors, [&](const TensorRecord &T) { return T.Id < Id; });
    return It != Tensors.end() && It->Id == Id;
  };
  for (const TensorRecord &T : Tensors) {
    const std::vector<int64_t> &Owners = T.Owner == TensorOwner::ModuleCall ? CallIds
                                         : T.Owner == TensorOwner::Op       ? OpIds
                                                                            : KernelIds;
    if (!Holds(Owners, T.OwnerId))
      return Corrupt("tensor", T.Id,
                     T.Owner == TensorOwner::ModuleCall ? "module call" : ownerName(T.Owner),
                     T.OwnerId);
    if (T.SourceId && (*T.SourceId >= T.Id || !TensorAt(*T.SourceId)))
      return makeError("'" + Dir + "' is corrupt: tensor " + Twine(T.Id) + "'s source is tensor " +
                       Twine(*T.SourceId) + ", not an earlier tensor of the trace");
  }
  return Error::success();
}

} // namespace ekka
