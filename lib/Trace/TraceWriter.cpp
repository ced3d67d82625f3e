//===- TraceWriter.cpp - The traced program's side of the writer ----------===//
//
// What the traced program's threads do: pack their records into their own
// chunks (small records) or queue them whole, wait for room when the writer
// falls behind, and hand chunks over. The writer's own thread, which writes
// the database and the shards, is in TraceWriterStorage.cpp; the small
// records' layout, which both read, in TraceWriterInternal.h.
//
//===----------------------------------------------------------------------===//
#include "TraceWriterInternal.h"

#include "ekka/Trace/TraceWriter.h"
#include "ekka/Support/Error.h"

#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cassert>
#include <atomic>
#include <chrono>
#include <cstring>
#include <pthread.h>
#include <thread>

using namespace llvm;

namespace ekka {

using namespace trace_writer;

namespace {

/// A chunk's bytes: a few hundred ops with their outputs.
constexpr size_t ChunkBytes = 64 << 10;
/// Written chunks kept for reuse, beyond those in use.
constexpr size_t PooledChunks = 64;

/// Counts forks: a forked child's copy of a thread's buffer is the
/// parent's, which the child must neither write nor lock.
std::atomic<uint64_t> ForkGeneration{0};

} // namespace

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

void TraceWriter::installForkHandler() {
  static std::once_flag AtFork;
  std::call_once(AtFork, [] {
    pthread_atfork(nullptr, nullptr, [] { ForkGeneration.fetch_add(1); });
  });
}


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
void TraceWriter::addSpan(const SpanRecord &R) {
  SmallSpan S;
  S.Span = R;
  if (!appendSmall(sizeof S, [&](ThreadBuffer &, char *To) { std::memcpy(To, &S, sizeof S); }))
    enqueue<SpanRecord>(0, R);
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


// The writer thread holds CountsMutex across each batch's SQLite and file
// work.
void TraceWriter::pauseForFork() {
  // Under GCC's ASan, whose allocator takes no lock around fork, a child
  // forked while the thread was still starting waited for ever on the
  // allocator's lock (TraceTest.AForkedChildLeavesTheParentsChunkAlone,
  // once in the sanitized suite).
  {
    std::unique_lock<std::mutex> Lock(Mutex);
    Started.wait(Lock, [&] { return WriterStarted; });
  }
  CountsMutex.lock();
}
void TraceWriter::resumeAfterFork() { CountsMutex.unlock(); }

TraceCounts TraceWriter::counts() const {
  std::lock_guard<std::mutex> Lock(CountsMutex);
  TraceCounts C = Counts;
  C.RoomWaits = RoomWaits.load(std::memory_order_relaxed);
  C.RoomWaitNanos = RoomWaitNanos.load(std::memory_order_relaxed);
  return C;
}

} // namespace ekka
