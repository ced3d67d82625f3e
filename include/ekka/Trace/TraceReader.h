//===- TraceReader.h - Open a trace for analysis ---------------*- C++ -*-===//
#ifndef EKKA_TRACE_TRACEREADER_H
#define EKKA_TRACE_TRACEREADER_H

#include "ekka/Support/SQLite.h"
#include "ekka/Trace/SafeTensors.h"
#include "ekka/Trace/TraceFormat.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ekka {

/// A module call's own ops and captured tensors.
struct CallTally {
  uint64_t Ops = 0, Captured = 0;
};

/// One rank's trace: its database and its shards, mapped on demand so that
/// memory holds only the tensors being compared, not the trace.
class TraceReader {
public:
  /// Opens a rank directory (one holding trace.db). A trace of a newer major
  /// format, a file that is not a trace database, or a missing directory is
  /// an error naming the path.
  static llvm::Expected<std::unique_ptr<TraceReader>> open(llvm::StringRef Dir);

  /// Opens every rank of a trace: \p Dir itself, or its rank-N/ directories
  /// in rank order for a multi-rank run.
  static llvm::Expected<std::vector<std::unique_ptr<TraceReader>>>
  openRanks(llvm::StringRef Dir);

  /// The ranks of a multi-rank trace in \p Dir that began under Ekka (their
  /// rank-N/ holds the start marker) but left no trace.db: they ran no
  /// module, or were killed before their first. In rank order.
  static std::vector<unsigned> startedRanks(llvm::StringRef Dir);

  const std::map<std::string, std::string> &meta() const { return Meta; }
  /// Whether the trace's format is \p Major.\p Minor or newer (what a
  /// feature that came with that version needs, such as the start markers
  /// of 1.7).
  bool formatAtLeast(unsigned Major, unsigned Minor) const {
    return FormatMajor != Major ? FormatMajor > Major : FormatMinor >= Minor;
  }
  llvm::StringRef directory() const { return Dir; }

  llvm::Expected<std::vector<ModuleCallRecord>> moduleCalls();
  llvm::Expected<std::vector<OpRecord>> ops();
  llvm::Expected<std::vector<KernelRecord>> kernels();
  llvm::Expected<std::vector<TensorRecord>> tensors();
  /// When each module call and op ran, by start time; none in a trace
  /// before format 1.8.
  llvm::Expected<std::vector<SpanRecord>> spans();

  /// The rows of each table and the captured bytes, read with SQL's count()
  /// and from the captured tensors' rows only: a long run's trace (millions
  /// of ops) is summarised without holding it in memory.
  llvm::Expected<TraceCounts> counts();
  /// The rows of one table (module_calls, ops, kernels, tensors), by count().
  llvm::Expected<uint64_t> rowCount(llvm::StringRef Table);

  /// For each module call with ops or captured tensors of its own: how
  /// many (GROUP BY in the database, not the rows read back).
  llvm::Expected<std::map<int64_t, CallTally>> tallyPerModuleCall();

  /// The shards that captured tensors' rows name but that are not in the
  /// directory (deleted, never copied), each with how many rows name it; an
  /// error if a row names one that is not a file name in the directory
  /// (../x, an absolute path), which is not looked for.
  llvm::Expected<std::map<std::string, uint64_t>> missingShards();

  /// Whether the trace was closed with nothing lost (meta lost_records is
  /// 0): every row it names is in it. A trace not closed (its program
  /// killed) or one that lost records may name rows it never wrote.
  bool whole() const;

  /// Refuses a whole() trace whose tables disagree: an op, kernel or tensor
  /// that names a module call, op or kernel the trace does not hold, or a
  /// tensor whose source is not an earlier tensor. The rows are this
  /// trace's, \p Tensors by id as tensors() returns them.
  llvm::Error checkReferences(llvm::ArrayRef<ModuleCallRecord> Calls,
                              llvm::ArrayRef<OpRecord> Ops,
                              llvm::ArrayRef<KernelRecord> Kernels,
                              llvm::ArrayRef<TensorRecord> Tensors) const;

  /// The captured bytes of \p T; an error if it was not captured or its
  /// shard is missing or corrupt. The shards are mapped, not read: once
  /// ResidentShardBytes have been handed out, the pages they made resident
  /// are given back to the kernel (the bytes stay valid, read again from
  /// the page cache when touched), so that reading a trace of any size
  /// holds at most about that much of it in memory.
  llvm::Expected<llvm::StringRef> tensorBytes(const TensorRecord &T);

  /// How many bytes of shards tensorBytes() hands out before it gives their
  /// resident pages back.
  static constexpr uint64_t ResidentShardBytes = uint64_t(128) << 20;

private:
  TraceReader(std::string Dir, std::unique_ptr<SQLiteDatabase> Db)
      : Dir(std::move(Dir)), Db(std::move(Db)) {}
  llvm::Error readMeta();
  /// Reserves room for the rows of \p Table (a hint: none if it cannot
  /// count them).
  template <typename Record>
  void reserveRows(std::vector<Record> &Out, llvm::StringRef Table);

  std::string Dir;
  std::unique_ptr<SQLiteDatabase> Db;
  std::map<std::string, std::string> Meta;
  unsigned FormatMajor = 0, FormatMinor = 0; // validated by readMeta
  std::mutex ShardsMutex;
  llvm::StringMap<std::unique_ptr<SafeTensorsFile>> Shards;
  uint64_t HandedOutBytes = 0; ///< Since the shards' pages were last dropped.
};

} // namespace ekka

#endif
