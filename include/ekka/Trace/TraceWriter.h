//===- TraceWriter.h - Write a trace off the program's hot path -*- C++ -*-===//
//
// Writes one rank's trace directory (TraceFormat.h) for the recorder inside
// a traced process: the program's threads hand over records cheaply
// (TraceWriter.cpp) and one thread of its own writes the database and the
// safetensors shards (TraceWriterStorage.cpp). It records what it is given
// and decides nothing: what to record and capture is the session's
// (ekka/Runtime/TraceSession.h); reading a trace is TraceReader's.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_TRACE_TRACEWRITER_H
#define EKKA_TRACE_TRACEWRITER_H

#include "ekka/Trace/TraceFormat.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unistd.h>
#include <tuple>
#include <variant>
#include <vector>

namespace ekka {

struct TraceWriterOptions {
  /// A shard is written once it holds this many captured bytes.
  uint64_t ShardBytes = 64ull << 20;
  /// Replace an existing directory (its trace.db and shards) instead of
  /// refusing it.
  bool Force = false;
  /// The writer's thread takes what threads hold in their open chunks of
  /// small records (see TraceWriter). Off only in tests of what a thread
  /// hands over by itself.
  bool CollectThreadChunks = true;
};

/// Removes the trace in \p Dir — trace.db (with its journal), the shards,
/// rank-N/ and process-PID/ — and nothing else the user keeps there.
void removeTrace(llvm::StringRef Dir);

/// Writes one rank's trace directory. The add* calls only enqueue; a
/// background thread writes rows in batched transactions and captured bytes
/// in shards. Rows of captured tensors are written only after their shard is
/// complete on disk, so a trace whose writer died (the program crashed or was
/// killed) is valid up to its last complete shard.
///
/// Small records — an op, a tensor with no bytes to capture and nothing to
/// complete — are packed into a chunk of the calling thread's, handed over
/// whole when it is full, and before anything else that thread adds: the
/// writer sees each thread's records in the order it added them. A thread's
/// partly filled chunk is handed over when the thread ends; the writer's
/// thread takes what every thread's open chunk holds after each batch, and
/// every 100 ms while idle (so a thread that stops adding records has them
/// written), and so do close() and a meta value computed later.
///
/// Thread-safe: add* may be called from any thread. Ids come from the
/// next*Id() counters so callers can link records before they are written.
class TraceWriter {
public:
  /// Creates \p Dir (its parents too). An existing trace there is an error
  /// unless Options.Force.
  static llvm::Expected<std::unique_ptr<TraceWriter>>
  create(llvm::StringRef Dir, TraceWriterOptions Options = {});
  ~TraceWriter();

  int64_t nextModuleCallId() { return ++LastModuleCallId; }
  int64_t nextOpId() { return ++LastOpId; }
  int64_t nextKernelId() { return ++LastKernelId; }
  int64_t nextTensorId() { return ++LastTensorId; }

  void setMeta(llvm::StringRef Key, llvm::StringRef Value);
  /// A meta value computed on the writer's thread when it reaches this
  /// record: after everything enqueued before it, completions included,
  /// was written (what a trace lost on the way is known only then).
  void setMeta(llvm::StringRef Key, std::function<std::string()> Value);
  void addModuleCall(ModuleCallRecord R);
  /// A module call's texts (its path, class and source), kept as long as
  /// the writer, as OpText is an operator's: a module is called again at
  /// every forward, and its four strings copied at each call cost as much
  /// as the rest of its record.
  struct ModuleText {
    std::string Path, ClassName, ClassQualname, SourceFile;
    int64_t SourceLine = 0;
    bool operator<(const ModuleText &O) const {
      return std::tie(Path, ClassName, ClassQualname, SourceFile, SourceLine) <
             std::tie(O.Path, O.ClassName, O.ClassQualname, O.SourceFile, O.SourceLine);
    }
  };
  /// The one ModuleText of these texts.
  const ModuleText *internModule(llvm::StringRef Path, llvm::StringRef ClassName,
                                 llvm::StringRef ClassQualname, llvm::StringRef SourceFile,
                                 int64_t SourceLine);
  /// A module call whose texts are \p Text's (from internModule): the row
  /// addModuleCall writes for the same record.
  void addModuleCall(int64_t Id, std::optional<int64_t> ParentId, int64_t Seq, int64_t Step,
                     const ModuleText *Text);
  void addOp(OpRecord R);
  /// An operator's name and schema, kept as long as the writer. The traced
  /// program's thread interns them once per operator and then hands over
  /// each op without its text: a copy per op, made on that thread and freed
  /// on the writer's, costs more than the rest of the record.
  struct OpText {
    std::string Name, Schema;
    bool operator<(const OpText &O) const {
      return std::tie(Name, Schema) < std::tie(O.Name, O.Schema);
    }
  };
  /// The one OpText of \p Name and \p Schema: every thread, and a thread
  /// that asks again, gets the same, so the texts are bounded by the
  /// operators the program runs.
  const OpText *internOp(std::string Name, std::string Schema);
  /// An op whose name and schema are \p Text's (from internOp).
  void addOp(int64_t Id, std::optional<int64_t> ModuleCallId, int64_t Seq, const OpText *Text);
  void addKernel(KernelRecord R);
  /// A kernel's name, kept as long as the writer, as OpText is an
  /// operator's: a launch then hands over no copy of its (mangled, long)
  /// name, nor waits for the queue.
  const std::string *internKernelName(llvm::StringRef Name) { return internText(Name); }
  /// A kernel launch named \p Name (from internKernelName): the row
  /// addKernel writes for \p R with that name. R's own Name is not read.
  void addKernel(const KernelRecord &R, const std::string *Name);
  /// When a module call or an op ran (the program's thread packs it as a
  /// small record: an op's costs no allocation).
  void addSpan(const SpanRecord &R);
  /// What to do with a tensor's bytes.
  enum class BytesUse {
    Capture,   ///< Store them in a shard (and compute the statistics).
    StatsOnly, ///< Compute the statistics from them, then drop them.
  };
  /// Records a tensor's metadata and statistics; with \p Data (owned bytes,
  /// contiguous, of R.Type and R.Shape) its contents are captured, or used
  /// for the statistics only. Statistics are computed on the writer's
  /// thread, off the program's.
  /// A record packed into the thread's chunk is read, not moved: a move of
  /// its strings and dimensions costs about as much as packing it.
  void addTensor(TensorRecord &&R, std::optional<std::string> Data = std::nullopt,
                 BytesUse Use = BytesUse::Capture);
  void addTensor(const TensorRecord &R, std::optional<std::string> Data = std::nullopt,
                 BytesUse Use = BytesUse::Capture) {
    addTensor(TensorRecord(R), std::move(Data), Use);
  }
  /// A tensor's metadata alone, no statistics or bytes: the most common
  /// record (an op's outputs), read from the caller's arrays with no
  /// TensorRecord made. The row is addTensor's for the same record.
  struct TensorMetadata {
    int64_t Id;
    TensorOwner Owner;
    int64_t OwnerId;
    llvm::StringRef Role;
    int64_t Index;
    DType Type;
    llvm::ArrayRef<int64_t> Shape, Strides;
    llvm::StringRef Device;
    std::optional<int64_t> SourceId;
  };
  void addTensorMetadata(const TensorMetadata &M);
  /// Completes a record on the writer's thread, just before it is written:
  /// fills in its statistics or its bytes (a device's copy, waited for
  /// there rather than on the program's thread). It must not throw.
  using Completion = std::function<void(TensorRecord &, std::optional<std::string> &)>;
  /// A tensor whose statistics or bytes (\p Bytes of them) \p Complete will
  /// provide.
  void addTensor(TensorRecord R, Completion Complete, uint64_t Bytes, BytesUse Use);

  /// A buffer to hold \p Bytes bytes of a tensor to capture (handed back
  /// through addTensor): one whose bytes the writer has already written,
  /// reused, so that its pages are the process's already; or a new one.
  std::string takeBuffer(size_t Bytes);

  /// Writes everything still queued and the last shard, then stops the
  /// background thread. The first write error (a full disk) is returned;
  /// what was written before it is kept.
  llvm::Error close();
  /// Writes everything queued so far (threads' open chunks included) and
  /// the shard under way, and returns once that is in the files; the
  /// writer goes on. For a process about to replace itself (exec), which
  /// may fail and go on. The first write error is returned.
  llvm::Error flush();
  TraceCounts counts() const;
  /// Around fork(): waits until the writer thread has started (a thread
  /// still starting is inside the C library's, or ASan's, set-up of it)
  /// and is between batches (and not taking threads' chunks), and keeps it
  /// there, so that no SQLite, queue or allocator lock is held by it when
  /// the process forks (a child that opens its own trace would wait on it
  /// forever); then lets it go on, in the parent and in the child.
  void pauseForFork();
  void resumeAfterFork();
  /// Registers the writer's own fork handler (once per process; every
  /// writer does at its construction). A program that creates writers
  /// while another thread may fork, holding a lock that its own prepare
  /// handler takes, calls this first: glibc runs the prepare handlers
  /// holding the lock that pthread_atfork takes.
  static void installForkHandler();
  llvm::StringRef directory() const { return Dir; }

private:
  struct MetaItem {
    std::string Key, Value;
    std::function<std::string()> Later; ///< When set, gives Value.
  };
  struct TensorItem {
    TensorRecord Record;
    std::optional<std::string> Data;
    BytesUse Use = BytesUse::Capture;
    Completion Complete;
  };
  /// Small records packed back to back (see the class comment).
  struct Chunk;
  struct ChunkDeleter {
    void operator()(Chunk *C) const;
  };
  using ChunkPtr = std::unique_ptr<Chunk, ChunkDeleter>;
  /// A thread's open chunk.
  class ThreadBuffer;
  using Item = std::variant<MetaItem, ModuleCallRecord, OpRecord, KernelRecord, TensorItem,
                            SpanRecord, ChunkPtr>;

  class Backend;
  TraceWriter(std::string Dir, TraceWriterOptions Options);
  /// Queues a \p T made of \p Args in place (a record is not moved from
  /// temporary to temporary on the program's thread), after the calling
  /// thread's open chunk.
  template <typename T, typename... Args> void enqueue(uint64_t Bytes, Args &&...A);
  /// Queues \p Open (if not null), then what \p Emplace adds to the queue:
  /// \p Records records, with \p Bytes captured bytes. Waits for room
  /// if \p Wait (the writer's own thread must not).
  template <typename EmplaceFn>
  void push(ChunkPtr Open, uint64_t Bytes, size_t Records, EmplaceFn Emplace, bool Wait = true);
  void push(ChunkPtr Open, bool Wait = true);
  /// Appends a small record of \p Bytes bytes, which \p Fill writes (given
  /// the thread's buffer and where to write), to the calling thread's
  /// chunk. False if the thread has no buffer (its thread_locals are gone):
  /// the record is then to be queued whole.
  template <typename FillFn> bool appendSmall(size_t Bytes, FillFn Fill);
  /// Packs a tensor's record into the thread's chunk; false if it is no
  /// small one (a role without a number, more than 255 dimensions).
  bool packTensor(const TensorMetadata &M, const TensorStats *Stats);
  /// What \p B's open chunk holds, to queue (null if nothing): the chunk
  /// itself if it is at least half full, else a copy of its records.
  ChunkPtr takeRecords(ThreadBuffer &B);
  /// The calling thread's buffer for this writer; made on first use unless
  /// \p Make is false (then null). Null too once the thread's buffers are
  /// gone (at its end).
  ThreadBuffer *threadBuffer(bool Make);
  /// Queues every thread's open chunk; with \p Close, the threads' later
  /// small records are dropped, as late records are. The writer's thread
  /// does it too, every period, with \p Wait false (it neither waits for
  /// room nor for a buffer another thread holds): a thread that stops
  /// adding records (a program that hangs) has its last ones written.
  void collectThreadChunks(bool Close, bool Wait = true);
  /// A chunk to fill, reused if one is free.
  ChunkPtr takeChunk();
  /// Keeps a written chunk for takeChunk.
  void recycleChunk(ChunkPtr C);
  void run();
  /// Keeps a written buffer for takeBuffer, up to twice a shard's bytes.
  void recycle(std::string &&Buffer);

  std::string Dir;
  TraceWriterOptions Options;
  std::unique_ptr<Backend> Storage;

  mutable std::mutex Mutex;
  std::condition_variable Wake, Drained;
  std::vector<Item> Queue;
  uint64_t QueuedBytes = 0;
  size_t QueuedRecords = 0; ///< A chunk counts its records.
  bool WriterIdle = false; ///< The writer's thread waits for a first record.
  /// close() has begun: nothing waits for room any more.
  bool NoWaiting = false;
  bool Closing = false;
  /// flush() calls asked for and done, in order; Flushed tells them.
  uint64_t FlushesAsked = 0, FlushesDone = 0;
  std::condition_variable Flushed;
  bool WriterExited = false; ///< The writer's thread has left its loop.
  /// The writer's thread runs its loop: it has left the C library's (and a
  /// sanitizer's) set-up of a new thread, which holds their locks.
  bool WriterStarted = false;
  std::condition_variable Started;
  /// The process whose thread writes: a forked child has a copy of this
  /// writer, without the thread.
  const pid_t OwnerProcess = ::getpid();
  std::thread Worker;
  /// Tells this writer's thread buffers from those of an earlier writer at
  /// the same address.
  const uint64_t Serial;

  std::mutex TextMutex; ///< Guards OpTexts, ModuleTexts and Texts.
  std::set<OpText> OpTexts; ///< Its nodes never move: internOp's pointers hold.
  std::set<ModuleText> ModuleTexts; ///< As OpTexts, for internModule.
  /// Device and kernel names, as small records name them.
  std::set<std::string, std::less<>> Texts;
  /// The one copy of \p Text in Texts.
  const std::string *internText(llvm::StringRef Text);

  std::mutex ThreadsMutex; ///< Guards Threads and ThreadsClosed.
  std::vector<std::shared_ptr<ThreadBuffer>> Threads;
  /// close() has taken the threads' chunks: a buffer made later is closed.
  bool ThreadsClosed = false;
  std::mutex ChunkPoolMutex; ///< Guards ChunkPool.
  std::vector<ChunkPtr> ChunkPool;

  std::mutex PoolMutex; ///< Guards Pool and PoolBytes.
  std::multimap<size_t, std::string> Pool; ///< By capacity.
  uint64_t PoolBytes = 0;

  mutable std::mutex CountsMutex; ///< Guards Counts and FailureMessage.
  TraceCounts Counts;
  std::string FailureMessage;

  std::atomic<int64_t> LastModuleCallId{0}, LastOpId{0}, LastKernelId{0}, LastTensorId{0};
  std::atomic<uint64_t> RoomWaits{0}, RoomWaitNanos{0};
};

} // namespace ekka

#endif
