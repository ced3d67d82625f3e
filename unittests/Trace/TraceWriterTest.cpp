//===- TraceWriterTest.cpp - Writer and reader together -------------------===//
#include "ekka/Trace/TraceReader.h"
#include "ekka/Trace/TraceWriter.h"
#include "ekka/Support/SQLite.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

using namespace ekka;
using namespace llvm;

namespace {

class TraceTest : public ::testing::Test {
protected:
  void SetUp() override {
    ASSERT_FALSE(sys::fs::createUniqueDirectory("ekka-trace", Root));
    Dir = (Root + "/trace").str();
  }
  void TearDown() override { sys::fs::remove_directories(Root); }

  static std::string floats(std::initializer_list<float> V) {
    return std::string(reinterpret_cast<const char *>(V.begin()), V.size() * sizeof(float));
  }

  /// A module call with one captured output and one op with stats only.
  void writeSmallTrace(TraceWriter &W, float First) {
    ModuleCallRecord Call;
    Call.Id = W.nextModuleCallId();
    Call.Seq = 0;
    Call.Path = "model.layers.0.mlp";
    Call.ClassName = "LlamaMLP";
    Call.ClassQualname = "transformers.models.llama.modeling_llama.LlamaMLP";
    W.addModuleCall(Call);
    OpRecord Op;
    Op.Id = W.nextOpId();
    Op.ModuleCallId = Call.Id;
    Op.Name = "aten::mm";
    W.addOp(Op);
    TensorRecord Out;
    Out.Id = W.nextTensorId();
    Out.Owner = TensorOwner::ModuleCall;
    Out.OwnerId = Call.Id;
    Out.Role = "output";
    Out.Shape = {2, 2};
    Out.Strides = {2, 1};
    Out.Device = "cpu";
    Out.Stats = TensorStats{First + 9, 0, First, 4, 0, 0};
    W.addTensor(Out, floats({First, 2, 3, 4}));
    TensorRecord OpOut = Out;
    OpOut.Id = W.nextTensorId();
    OpOut.Owner = TensorOwner::Op;
    OpOut.OwnerId = Op.Id;
    W.addTensor(OpOut);
  }

  SmallString<128> Root;
  std::string Dir;
};

TEST_F(TraceTest, WriteThenRead) {
  auto W = TraceWriter::create(Dir);
  ASSERT_TRUE(bool(W)) << toString(W.takeError());
  (*W)->setMeta("framework", "hf");
  writeSmallTrace(**W, 1);
  ASSERT_FALSE(bool((*W)->close()));
  TraceCounts C = (*W)->counts();
  EXPECT_EQ(C.ModuleCalls, 1u);
  EXPECT_EQ(C.Tensors, 2u);
  EXPECT_EQ(C.CapturedTensors, 1u);
  EXPECT_EQ(C.CapturedBytes, 16u);
  EXPECT_EQ(C.Shards, 1u);

  auto R = TraceReader::open(Dir);
  ASSERT_TRUE(bool(R)) << toString(R.takeError());
  EXPECT_EQ((*R)->meta().at("framework"), "hf");
  EXPECT_EQ((*R)->meta().at("format"), "ekka-trace " + std::to_string(TraceFormatMajor) + "." +
                                             std::to_string(TraceFormatMinor));
  auto Calls = (*R)->moduleCalls();
  ASSERT_TRUE(Calls && Calls->size() == 1u);
  EXPECT_EQ((*Calls)[0].Path, "model.layers.0.mlp");
  EXPECT_FALSE((*Calls)[0].ParentId.has_value());
  auto Tensors = (*R)->tensors();
  ASSERT_TRUE(Tensors && Tensors->size() == 2u);
  const TensorRecord &T = (*Tensors)[0];
  EXPECT_EQ(T.Shard, "tensors-0000.safetensors");
  ASSERT_TRUE(T.Stats.has_value());
  EXPECT_DOUBLE_EQ(T.Stats->Sum, 10);
  auto Bytes = (*R)->tensorBytes(T);
  ASSERT_TRUE(bool(Bytes));
  EXPECT_EQ(*Bytes, floats({1, 2, 3, 4}));
  // Statistics only: no bytes, and asking for them says why.
  EXPECT_TRUE((*Tensors)[1].Shard.empty());
  auto None = (*R)->tensorBytes((*Tensors)[1]);
  ASSERT_FALSE(bool(None));
  EXPECT_NE(toString(None.takeError()).find("was not captured"), std::string::npos);
}

// The summary's counts come from SQL (count(*), GROUP BY), not from the
// rows read back: they agree with what the writer counted and with the
// rows, for two module calls of which one has a captured output.
TEST_F(TraceTest, CountsAndTalliesAgreeWithTheRows) {
  auto W = TraceWriter::create(Dir);
  ASSERT_TRUE(bool(W)) << toString(W.takeError());
  writeSmallTrace(**W, 1);
  ModuleCallRecord Bare;
  Bare.Id = (*W)->nextModuleCallId();
  Bare.Seq = 1;
  Bare.Path = "model.norm";
  (*W)->addModuleCall(Bare);
  for (int I = 0; I < 3; ++I) {
    OpRecord Op;
    Op.Id = (*W)->nextOpId();
    Op.ModuleCallId = Bare.Id;
    Op.Name = "aten::add";
    (*W)->addOp(Op);
  }
  OpRecord Outside; // an op of no module call
  Outside.Id = (*W)->nextOpId();
  Outside.Name = "aten::empty";
  (*W)->addOp(Outside);
  ASSERT_FALSE(bool((*W)->close()));
  TraceCounts Written = (*W)->counts();

  auto R = TraceReader::open(Dir);
  ASSERT_TRUE(bool(R)) << toString(R.takeError());
  auto C = (*R)->counts();
  ASSERT_TRUE(bool(C)) << toString(C.takeError());
  EXPECT_EQ(C->ModuleCalls, 2u);
  EXPECT_EQ(C->Ops, 5u);
  EXPECT_EQ(C->Kernels, 0u);
  EXPECT_EQ(C->Tensors, (*R)->tensors()->size());
  EXPECT_EQ(C->Tensors, Written.Tensors);
  EXPECT_EQ(C->CapturedTensors, Written.CapturedTensors);
  EXPECT_EQ(C->CapturedBytes, 16u);
  EXPECT_EQ(C->Shards, 1u);

  auto Tally = (*R)->tallyPerModuleCall();
  ASSERT_TRUE(bool(Tally)) << toString(Tally.takeError());
  ASSERT_EQ(Tally->size(), 2u);
  auto &First = (*Tally)[(*(*R)->moduleCalls())[0].Id];
  EXPECT_EQ(First.Ops, 1u);
  EXPECT_EQ(First.Captured, 1u);
  EXPECT_EQ((*Tally)[Bare.Id].Ops, 3u);
  EXPECT_EQ((*Tally)[Bare.Id].Captured, 0u);
}

// The program's hot path hands over ops by an interned text (internOp),
// from any thread, and shapes inline up to six dimensions: a trace reads
// the same as one written from whole records, past six dimensions too.
TEST_F(TraceTest, InternedOpsAndInlineShapesReadBackWhole) {
  auto W = TraceWriter::create(Dir);
  ASSERT_TRUE(bool(W)) << toString(W.takeError());
  const TraceWriter::OpText *Mm =
      (*W)->internOp("aten::mm", "aten::mm(Tensor self, Tensor mat2) -> Tensor");
  std::vector<std::thread> Threads;
  for (int T = 0; T < 2; ++T)
    Threads.emplace_back([&, T] {
      const TraceWriter::OpText *Add = (*W)->internOp(
          "aten::add", "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor");
      for (int I = 0; I < 500; ++I) {
        int64_t Id = (*W)->nextOpId();
        std::optional<int64_t> Call;
        if (I % 3 == 0)
          Call = 10 * Id;
        (*W)->addOp(Id, Call, 100000 + Id, I % 2 ? Add : Mm);
      }
    });
  for (std::thread &T : Threads)
    T.join();
  // Asked again, the same text: interned texts are bounded by the operators.
  EXPECT_EQ((*W)->internOp("aten::mm", "aten::mm(Tensor self, Tensor mat2) -> Tensor"), Mm);
  OpRecord Scope;
  Scope.Id = (*W)->nextOpId();
  Scope.ModuleCallId = 7;
  Scope.Seq = 100000 + Scope.Id;
  Scope.Name = "my_scope";
  (*W)->addOp(Scope);
  TensorRecord Deep;
  Deep.Id = (*W)->nextTensorId();
  Deep.Role = "output";
  Deep.Shape = {1, 2, 1, 2, 1, 2, 1, 2};
  Deep.Strides = {16, 8, 8, 4, 4, 2, 2, 1};
  Deep.Device = "cpu";
  (*W)->addTensor(Deep);
  ASSERT_FALSE(bool((*W)->close()));
  EXPECT_EQ((*W)->counts().Ops, 1001u);

  auto R = TraceReader::open(Dir);
  ASSERT_TRUE(bool(R)) << toString(R.takeError());
  auto Ops = (*R)->ops();
  ASSERT_TRUE(Ops && Ops->size() == 1001u);
  std::map<std::string, int> Count;
  for (const OpRecord &Op : *Ops) {
    ++Count[Op.Name];
    EXPECT_EQ(Op.Seq, 100000 + Op.Id);
    if (Op.Name != "my_scope" && Op.ModuleCallId) {
      EXPECT_EQ(*Op.ModuleCallId, 10 * Op.Id);
      ++Count["in a module call"];
    }
    if (Op.Name == "aten::mm")
      EXPECT_EQ(Op.Schema, "aten::mm(Tensor self, Tensor mat2) -> Tensor");
    else if (Op.Name == "aten::add")
      EXPECT_EQ(Op.Schema,
                "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor");
  }
  EXPECT_EQ(Count["aten::mm"], 500);
  EXPECT_EQ(Count["aten::add"], 500);
  EXPECT_EQ(Count["in a module call"], 2 * 167);
  ASSERT_EQ(Count["my_scope"], 1);
  EXPECT_EQ(Ops->back().Name, "my_scope");
  EXPECT_EQ(Ops->back().ModuleCallId, std::optional<int64_t>(7));
  auto Tensors = (*R)->tensors();
  ASSERT_TRUE(Tensors && Tensors->size() == 1u);
  EXPECT_EQ((*Tensors)[0].Shape, (TensorDims{1, 2, 1, 2, 1, 2, 1, 2}));
  EXPECT_EQ((*Tensors)[0].Strides, (TensorDims{16, 8, 8, 4, 4, 2, 2, 1}));
}

/// A tensor record with no bytes: one the writer packs into the calling
/// thread's chunk.
TensorRecord smallTensor(TraceWriter &W, int64_t OwnerId, const char *Role, const char *Device) {
  TensorRecord R;
  R.Id = W.nextTensorId();
  R.Owner = TensorOwner::Op;
  R.OwnerId = OwnerId;
  R.Role = Role;
  R.Index = R.Id % 3;
  R.Type = DType::BF16;
  R.Shape = {R.Id % 7, 3};
  R.Strides = {3, 1};
  R.Device = Device;
  if (R.Id % 2)
    R.Stats = TensorStats{double(R.Id), 2, -1, 1, 0, R.Id % 5};
  if (R.Id % 4 == 0)
    R.SourceId = R.Id - 1;
  if (R.Id % 5 == 0)
    R.Layout = "sparse_csr"; // not packed: the queue's own item
  return R;
}

/// What smallTensor made, read back.
void expectSmallTensor(const TensorRecord &T) {
  SCOPED_TRACE("tensor " + std::to_string(T.Id));
  EXPECT_EQ(T.Owner, TensorOwner::Op);
  EXPECT_EQ(T.Index, T.Id % 3);
  EXPECT_EQ(T.Type, DType::BF16);
  EXPECT_EQ(T.Shape, (TensorDims{T.Id % 7, 3}));
  EXPECT_EQ(T.Strides, (TensorDims{3, 1}));
  ASSERT_EQ(T.Stats.has_value(), T.Id % 2 == 1);
  if (T.Stats) {
    EXPECT_EQ(T.Stats->Sum, double(T.Id));
    EXPECT_EQ(T.Stats->Min, -1);
    EXPECT_EQ(T.Stats->InfCount, T.Id % 5);
  }
  EXPECT_EQ(T.SourceId, T.Id % 4 == 0 ? std::optional<int64_t>(T.Id - 1) : std::nullopt);
  EXPECT_EQ(T.Layout, T.Id % 5 == 0 ? "sparse_csr" : "");
  EXPECT_TRUE(T.Shard.empty());
}

/// The count that \p Query (a SELECT count) gives in \p Dir's trace.db,
/// polled every 10 ms until it is \p Expected or \p Tries polls have
/// passed (the writer's thread commits rows in batches); -1 on an error.
int64_t countWritten(const std::string &Dir, int64_t Expected,
                     const char *Query = "SELECT count(*) FROM ops", int Tries = 500) {
  auto Db = SQLiteDatabase::open(Dir + "/trace.db", SQLiteDatabase::Mode::ReadOnly);
  if (!Db) {
    consumeError(Db.takeError());
    return -1;
  }
  int64_t Written = 0;
  for (int Try = 0; Try < Tries && Written < Expected; ++Try) {
    auto S = (*Db)->prepare(Query);
    if (!S || !S->step())
      return -1;
    Written = S->columnInt(0);
    if (Written < Expected)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Written;
}

// Ops and tensors with nothing to capture go into the adding thread's chunk,
// handed over whole. Every record arrives: from threads that end before the
// writer closes (their last, partly filled chunk), from one that waits (the
// writer's thread takes its chunk), from one still running when it closes
// (close() takes its chunk; what it adds later is dropped),
// past a chunk's end, mixed with records that take the queue (a capture, an
// unknown role, a named scope), on two devices.
TEST_F(TraceTest, SmallRecordsFromEveryThreadAreWritten) {
  auto W = TraceWriter::create(Dir);
  ASSERT_TRUE(bool(W)) << toString(W.takeError());
  const TraceWriter::OpText *Mm =
      (*W)->internOp("aten::mm", "aten::mm(Tensor self, Tensor mat2) -> Tensor");
  const char *Roles[] = {"input", "output", "mutated", "argument"};
  auto Work = [&](int Thread, int Ops) {
    for (int I = 0; I < Ops; ++I) {
      int64_t Op = (*W)->nextOpId();
      (*W)->addOp(Op, std::optional<int64_t>(Thread), Op, Mm);
      (*W)->addTensor(smallTensor(**W, Op, Roles[I % 4], I % 2 ? "cuda:1" : "cpu"));
    }
  };
  std::vector<std::thread> Ended;
  for (int T = 1; T <= 3; ++T)
    Ended.emplace_back(Work, T, 1500); // about 150 KB each: past two chunks
  for (std::thread &T : Ended)
    T.join();
  std::mutex M;
  std::condition_variable CV;
  int Phase = 0;
  std::thread Running([&] {
    Work(4, 10);
    std::unique_lock<std::mutex> Lock(M);
    Phase = 1;
    CV.notify_all();
    CV.wait(Lock, [&] { return Phase == 2; });
    Work(4, 10); // after close: dropped, no harm
  });
  {
    std::unique_lock<std::mutex> Lock(M);
    CV.wait(Lock, [&] { return Phase == 1; });
  }
  // A thread that adds nothing more (a program that hangs) has its open
  // chunk taken by the writer's thread: its records are written meanwhile.
  EXPECT_EQ(countWritten(Dir, 10, "SELECT count(*) FROM ops WHERE module_call_id = 4"), 10);
  Work(5, 5);
  TensorRecord Odd = smallTensor(**W, 1, "weight", "cpu"); // a role a chunk has no number for
  (*W)->addTensor(Odd);
  TensorRecord Captured = smallTensor(**W, 2, "output", "cpu");
  Captured.Stats.reset();
  Captured.Shape = {2};
  Captured.Strides = {1};
  Captured.Type = DType::F32;
  (*W)->addTensor(Captured, floats({1, 2}));
  Work(5, 5);
  OpRecord Scope;
  Scope.Id = (*W)->nextOpId();
  Scope.Name = "my_scope";
  (*W)->addOp(Scope);
  ASSERT_FALSE(bool((*W)->close()));
  {
    std::lock_guard<std::mutex> Lock(M);
    Phase = 2;
    CV.notify_all();
  }
  Running.join();
  TraceCounts C = (*W)->counts();
  EXPECT_EQ(C.Ops, 3u * 1500 + 10 + 10 + 1);
  EXPECT_EQ(C.Tensors, 3u * 1500 + 10 + 10 + 2);

  auto R = TraceReader::open(Dir);
  ASSERT_TRUE(bool(R)) << toString(R.takeError());
  auto Ops = (*R)->ops();
  ASSERT_TRUE(Ops && Ops->size() == C.Ops);
  std::map<int64_t, int> PerThread;
  for (const OpRecord &Op : *Ops) {
    if (Op.Name == "my_scope") {
      EXPECT_FALSE(Op.ModuleCallId.has_value());
      continue;
    }
    EXPECT_EQ(Op.Name, "aten::mm");
    EXPECT_EQ(Op.Seq, Op.Id);
    ASSERT_TRUE(Op.ModuleCallId.has_value());
    ++PerThread[*Op.ModuleCallId];
  }
  EXPECT_EQ(PerThread, (std::map<int64_t, int>{{1, 1500}, {2, 1500}, {3, 1500}, {4, 10}, {5, 10}}));
  auto Tensors = (*R)->tensors();
  ASSERT_TRUE(Tensors && Tensors->size() == C.Tensors);
  std::map<std::string, int> Seen;
  for (const TensorRecord &T : *Tensors) {
    if (T.Id == Odd.Id) {
      EXPECT_EQ(T.Role, "weight");
      expectSmallTensor(T);
    } else if (T.Id == Captured.Id) {
      EXPECT_FALSE(T.Shard.empty());
    } else {
      expectSmallTensor(T);
      ++Seen[T.Role];
      ++Seen[T.Device];
    }
  }
  int Small = 3 * 1500 + 10 + 10;
  EXPECT_EQ(Seen["input"] + Seen["output"] + Seen["mutated"] + Seen["argument"], Small);
  EXPECT_GT(Seen["argument"], 0);
  EXPECT_EQ(Seen["cpu"] + Seen["cuda:1"], Small);
  EXPECT_GT(Seen["cuda:1"], 0);
}

// A tensor's metadata given from the caller's arrays (addTensorMetadata, as
// the op observer gives an op's outputs) reads back as the same record
// given whole: packed into the thread's chunk, and where it cannot be (a
// role without a number, more than 255 dimensions) through the queue.
TEST_F(TraceTest, MetadataReadsBackAsTheRecord) {
  auto W = TraceWriter::create(Dir);
  ASSERT_TRUE(bool(W)) << toString(W.takeError());
  std::vector<TensorRecord> Given;
  auto Add = [&](const char *Role, TensorDims Shape, TensorDims Strides, const char *Device,
                 std::optional<int64_t> Source) {
    for (bool Whole : {true, false}) {
      TensorRecord R;
      R.Id = (*W)->nextTensorId();
      R.Owner = Whole ? TensorOwner::Op : TensorOwner::ModuleCall;
      R.OwnerId = 7;
      R.Role = Role;
      R.Index = 2;
      R.Type = DType::F16;
      R.Shape = Shape;
      R.Strides = Strides;
      R.Device = Device;
      R.SourceId = Source;
      Given.push_back(R);
      if (Whole)
        (*W)->addTensor(std::move(R));
      else
        (*W)->addTensorMetadata({R.Id, R.Owner, R.OwnerId, R.Role, R.Index, R.Type, R.Shape,
                                 R.Strides, R.Device, R.SourceId});
    }
  };
  Add("output", {4, 3}, {3, 1}, "cpu", std::nullopt);
  Add("input", {}, {}, "cuda:1", 5);
  Add("weight", {2}, {1}, "cpu", std::nullopt);
  Add("mutated", TensorDims(300, 1), TensorDims(300, 1), "cpu", 1);
  ASSERT_FALSE(bool((*W)->close()));
  auto R = TraceReader::open(Dir);
  ASSERT_TRUE(bool(R)) << toString(R.takeError());
  auto Read = (*R)->tensors();
  ASSERT_TRUE(bool(Read)) << toString(Read.takeError());
  ASSERT_EQ(Read->size(), Given.size());
  std::map<int64_t, const TensorRecord *> ById;
  for (const TensorRecord &T : *Read)
    ById[T.Id] = &T;
  for (const TensorRecord &G : Given) {
    SCOPED_TRACE("tensor " + std::to_string(G.Id));
    ASSERT_TRUE(ById.count(G.Id));
    const TensorRecord &T = *ById[G.Id];
    EXPECT_EQ(T.Owner, G.Owner);
    EXPECT_EQ(T.OwnerId, G.OwnerId);
    EXPECT_EQ(T.Role, G.Role);
    EXPECT_EQ(T.Index, G.Index);
    EXPECT_EQ(T.Type, G.Type);
    EXPECT_EQ(T.Shape, G.Shape);
    EXPECT_EQ(T.Strides, G.Strides);
    EXPECT_EQ(T.Device, G.Device);
    EXPECT_EQ(T.SourceId, G.SourceId);
    EXPECT_FALSE(T.Stats.has_value());
    EXPECT_TRUE(T.Shard.empty());
  }
}

// A module call handed over as a small record with interned texts reads
// back as the same call given whole; two calls of one path share the texts.
TEST_F(TraceTest, InternedModuleCallReadsBackAsTheRecord) {
  auto W = TraceWriter::create(Dir);
  ASSERT_TRUE(bool(W)) << toString(W.takeError());
  std::vector<ModuleCallRecord> Given;
  auto Add = [&](bool Whole, std::optional<int64_t> Parent, int64_t Step, const char *Path,
                 const char *Class, const char *File, int64_t Line) {
    ModuleCallRecord C;
    C.Id = (*W)->nextModuleCallId();
    C.ParentId = Parent;
    C.Seq = int64_t(Given.size());
    C.Step = Step;
    C.Path = Path;
    C.ClassName = Class;
    C.ClassQualname = std::string("pkg.") + Class;
    C.SourceFile = File;
    C.SourceLine = Line;
    Given.push_back(C);
    if (Whole) {
      (*W)->addModuleCall(C);
      return;
    }
    const TraceWriter::ModuleText *Text =
        (*W)->internModule(C.Path, C.ClassName, C.ClassQualname, C.SourceFile, C.SourceLine);
    (*W)->addModuleCall(C.Id, C.ParentId, C.Seq, C.Step, Text);
  };
  Add(true, std::nullopt, 1, "", "Model", "/m.py", 3);
  Add(false, 1, 1, "layers.0", "Layer", "/m.py", 10);
  Add(false, std::nullopt, 2, "", "Model", "/m.py", 3);
  Add(false, 3, 2, "layers.0", "Layer", "/m.py", 10);
  Add(false, 3, 2, "layers.0", "Other", "", 0); // the same path, another module
  EXPECT_EQ((*W)->internModule("a", "B", "pkg.B", "/f.py", 1),
            (*W)->internModule("a", "B", "pkg.B", "/f.py", 1));
  EXPECT_NE((*W)->internModule("a", "B", "pkg.B", "/f.py", 1),
            (*W)->internModule("a", "B", "pkg.B", "/f.py", 2));
  ASSERT_FALSE(bool((*W)->close()));
  auto R = TraceReader::open(Dir);
  ASSERT_TRUE(bool(R)) << toString(R.takeError());
  auto Read = (*R)->moduleCalls();
  ASSERT_TRUE(bool(Read)) << toString(Read.takeError());
  ASSERT_EQ(Read->size(), Given.size());
  std::map<int64_t, const ModuleCallRecord *> ById;
  for (const ModuleCallRecord &C : *Read)
    ById[C.Id] = &C;
  for (const ModuleCallRecord &G : Given) {
    SCOPED_TRACE("call " + std::to_string(G.Id));
    ASSERT_TRUE(ById.count(G.Id));
    const ModuleCallRecord &C = *ById[G.Id];
    EXPECT_EQ(C.ParentId, G.ParentId);
    EXPECT_EQ(C.Seq, G.Seq);
    EXPECT_EQ(C.Step, G.Step);
    EXPECT_EQ(C.Path, G.Path);
    EXPECT_EQ(C.ClassName, G.ClassName);
    EXPECT_EQ(C.ClassQualname, G.ClassQualname);
    EXPECT_EQ(C.SourceFile, G.SourceFile);
    EXPECT_EQ(C.SourceLine, G.SourceLine);
  }
}

// What a thread hands over by itself (the writer's thread taking no
// chunks): a full chunk, a few records before a record that takes the queue
// (copied out: the thread keeps its chunk), and its last records at its end.
TEST_F(TraceTest, AThreadHandsOverItsSmallRecords) {
  TraceWriterOptions O;
  O.CollectThreadChunks = false;
  auto W = TraceWriter::create(Dir, O);
  ASSERT_TRUE(bool(W));
  const TraceWriter::OpText *Mm = (*W)->internOp("aten::mm", "");
  auto Ops = [&](int N) {
    for (int I = 0; I < N; ++I) {
      int64_t Id = (*W)->nextOpId();
      (*W)->addOp(Id, std::nullopt, Id, Mm);
    }
  };
  std::mutex M;
  std::condition_variable CV;
  int Phase = 0;
  auto Step = [&](int To) {
    std::unique_lock<std::mutex> Lock(M);
    Phase = To;
    CV.notify_all();
    CV.wait(Lock, [&] { return Phase != To; });
  };
  std::thread T([&] {
    Ops(2000); // 40 bytes each: a full chunk and some
    Step(1);
    Ops(3);
    (*W)->setMeta("after", "three"); // the queue: the three go first
    Step(2);
    Ops(5); // at the thread's end
  });
  auto Next = [&](int From) {
    std::unique_lock<std::mutex> Lock(M);
    CV.wait(Lock, [&] { return Phase == From; });
    return Lock;
  };
  {
    auto Lock = Next(1);
    // (A short look for what must not come: 300 ms, three idle periods.)
    int64_t Early = countWritten(Dir, 2000, "SELECT count(*) FROM ops", 30);
    EXPECT_TRUE(Early >= 0 && Early < 2000) << Early << ": an open chunk is not taken";
    EXPECT_GT(countWritten(Dir, 1), 0) << "a full chunk is handed over";
    Phase = 10;
    CV.notify_all();
  }
  {
    auto Lock = Next(2);
    EXPECT_EQ(countWritten(Dir, 2003), 2003);
    Phase = 20;
    CV.notify_all();
  }
  T.join();
  EXPECT_EQ(countWritten(Dir, 2008), 2008);
  ASSERT_FALSE(bool((*W)->close()));
  EXPECT_EQ((*W)->counts().Ops, 2008u);
}

// A record added after the thread's buffers are gone (by a thread_local
// destroyed after them, as a thread's last destructors may run an op) takes
// the queue whole: the small record's fallback, not a lost record.
namespace {
struct LateRecords {
  TraceWriter *W = nullptr;
  const TraceWriter::ModuleText *Text = nullptr;
  const TraceWriter::OpText *Op = nullptr;
  ~LateRecords() {
    if (!W)
      return;
    int64_t Call = W->nextModuleCallId();
    W->addModuleCall(Call, std::nullopt, 0, 1, Text);
    W->addOp(W->nextOpId(), Call, 1, Op);
  }
};
thread_local LateRecords Late;
} // namespace

TEST_F(TraceTest, RecordsAfterTheThreadsBuffersAreGoneTakeTheQueue) {
  auto W = TraceWriter::create(Dir);
  ASSERT_TRUE(bool(W)) << toString(W.takeError());
  const TraceWriter::ModuleText *Text = (*W)->internModule("late", "Late", "pkg.Late", "/l.py", 7);
  const TraceWriter::OpText *Op = (*W)->internOp("aten::add", "");
  std::thread T([&] {
    Late.W = W->get(); // built first: destroyed after the writer's buffers
    Late.Text = Text;
    Late.Op = Op;
    (*W)->addOp((*W)->nextOpId(), std::nullopt, 0, Op); // builds them
  });
  T.join();
  ASSERT_FALSE(bool((*W)->close()));
  auto R = TraceReader::open(Dir);
  ASSERT_TRUE(bool(R)) << toString(R.takeError());
  auto Calls = (*R)->moduleCalls();
  ASSERT_TRUE(bool(Calls)) << toString(Calls.takeError());
  ASSERT_EQ(Calls->size(), 1u);
  EXPECT_EQ((*Calls)[0].Path, "late");
  EXPECT_EQ((*Calls)[0].ClassQualname, "pkg.Late");
  EXPECT_EQ((*Calls)[0].SourceLine, 7);
  EXPECT_EQ((*W)->counts().Ops, 2u);
}

// One thread writing two traces at once: each gets its own records.
TEST_F(TraceTest, OneThreadWritingTwoTraces) {
  std::string Other = (Root + "/other").str();
  auto A = TraceWriter::create(Dir);
  auto B = TraceWriter::create(Other);
  ASSERT_TRUE(A && B);
  for (int I = 0; I < 100; ++I) {
    TraceWriter &W = I % 3 ? **A : **B;
    W.addTensor(smallTensor(W, I, "output", "cpu"));
  }
  ASSERT_FALSE(bool((*A)->close()));
  // A thread that goes on with B after A closed.
  (*B)->addTensor(smallTensor(**B, 100, "output", "cpu"));
  ASSERT_FALSE(bool((*B)->close()));
  auto RA = TraceReader::open(Dir);
  auto RB = TraceReader::open(Other);
  ASSERT_TRUE(RA && RB);
  auto TA = (*RA)->tensors();
  auto TB = (*RB)->tensors();
  ASSERT_TRUE(TA && TB);
  EXPECT_EQ(TA->size(), 66u);
  EXPECT_EQ(TB->size(), 35u);
  for (const TensorRecord &T : *TB)
    expectSmallTensor(T);
}

// A forked child that starts a trace of its own gets only its records, and
// the parent's trace all of its own, across the fork. (The child's copy of
// the parent's open chunk is left alone; touching it would show only as a
// hang where a lock was held at the fork, which this test cannot arrange.)
TEST_F(TraceTest, AForkedChildLeavesTheParentsChunkAlone) {
  auto W = TraceWriter::create(Dir);
  ASSERT_TRUE(bool(W));
  for (int I = 0; I < 10; ++I)
    (*W)->addTensor(smallTensor(**W, I, "output", "cpu"));
  (*W)->pauseForFork();
  std::fflush(nullptr);
  pid_t Child = fork();
  if (Child == 0) {
    (*W)->resumeAfterFork();
    int Failed = 0;
    {
      auto Own = TraceWriter::create((Root + "/child").str());
      if (!Own)
        _exit(3);
      for (int I = 0; I < 5; ++I)
        (*Own)->addTensor(smallTensor(**Own, I, "output", "cpu"));
      if (Error E = (*Own)->close()) {
        consumeError(std::move(E));
        Failed = 4;
      } else if ((*Own)->counts().Tensors != 5) {
        Failed = 5;
      }
    }
    // exit(), not _exit(): the thread's buffers are let go as at any
    // thread's end, the parent's copy among them.
    std::exit(Failed);
  }
  (*W)->resumeAfterFork();
  ASSERT_GT(Child, 0);
  int Status = 0;
  ASSERT_EQ(waitpid(Child, &Status, 0), Child);
  ASSERT_TRUE(WIFEXITED(Status));
  EXPECT_EQ(WEXITSTATUS(Status), 0);
  (*W)->addTensor(smallTensor(**W, 10, "output", "cpu"));
  ASSERT_FALSE(bool((*W)->close()));
  EXPECT_EQ((*W)->counts().Tensors, 11u);
}

// A device's read-back: the record is completed on the writer's thread,
// after the program enqueued it (the completion waits for the copy there).
TEST_F(TraceTest, CompletionsFillInStatisticsAndBytesOnTheWritersThread) {
  auto W = TraceWriter::create(Dir);
  ASSERT_TRUE(bool(W)) << toString(W.takeError());
  std::thread::id Program = std::this_thread::get_id(), StatsThread, BytesThread;
  TensorRecord Stats;
  Stats.Id = (*W)->nextTensorId();
  Stats.Owner = TensorOwner::ModuleCall;
  Stats.OwnerId = 1;
  Stats.Role = "output";
  Stats.Shape = {2};
  Stats.Device = "cuda:0";
  (*W)->addTensor(
      Stats,
      [&](TensorRecord &R, std::optional<std::string> &) {
        StatsThread = std::this_thread::get_id();
        R.Stats = TensorStats{3, 5, 1, 2, 0, 0};
      },
      0, TraceWriter::BytesUse::StatsOnly);
  TensorRecord Captured = Stats;
  Captured.Id = (*W)->nextTensorId();
  (*W)->addTensor(
      Captured,
      [&](TensorRecord &, std::optional<std::string> &Data) {
        BytesThread = std::this_thread::get_id();
        Data = floats({1, -2});
      },
      8, TraceWriter::BytesUse::Capture);
  // One whose device never delivered: recorded, without statistics or bytes.
  TensorRecord Lost = Stats;
  Lost.Id = (*W)->nextTensorId();
  int LostCount = 0;
  (*W)->addTensor(Lost, [&](TensorRecord &, std::optional<std::string> &) { ++LostCount; }, 8,
                  TraceWriter::BytesUse::Capture);
  // A meta value computed after the completions before it ran.
  (*W)->setMeta("lost", [&] { return std::to_string(LostCount); });
  ASSERT_FALSE(bool((*W)->close()));
  EXPECT_NE(StatsThread, Program);
  EXPECT_NE(BytesThread, Program);

  auto R = TraceReader::open(Dir);
  ASSERT_TRUE(bool(R)) << toString(R.takeError());
  EXPECT_EQ((*R)->meta().at("lost"), "1");
  auto Tensors = (*R)->tensors();
  ASSERT_TRUE(Tensors && Tensors->size() == 3u);
  ASSERT_TRUE((*Tensors)[0].Stats.has_value());
  EXPECT_DOUBLE_EQ((*Tensors)[0].Stats->SumSq, 5);
  EXPECT_TRUE((*Tensors)[0].Shard.empty());
  // Captured bytes give the statistics, computed by the writer.
  ASSERT_TRUE((*Tensors)[1].Stats.has_value());
  EXPECT_DOUBLE_EQ((*Tensors)[1].Stats->Sum, -1);
  EXPECT_DOUBLE_EQ((*Tensors)[1].Stats->Min, -2);
  auto Bytes = (*R)->tensorBytes((*Tensors)[1]);
  ASSERT_TRUE(bool(Bytes));
  EXPECT_EQ(*Bytes, floats({1, -2}));
  EXPECT_FALSE((*Tensors)[2].Stats.has_value());
  EXPECT_TRUE((*Tensors)[2].Shard.empty());
}

TEST_F(TraceTest, SmallShardsRollOver) {
  TraceWriterOptions O;
  O.ShardBytes = 8; // every capture fills a shard
  auto W = TraceWriter::create(Dir, O);
  ASSERT_TRUE(bool(W));
  for (int I = 0; I < 3; ++I)
    writeSmallTrace(**W, float(I));
  ASSERT_FALSE(bool((*W)->close()));
  EXPECT_GE((*W)->counts().Shards, 1u);
  auto R = TraceReader::open(Dir);
  ASSERT_TRUE(bool(R));
  auto Tensors = (*R)->tensors();
  ASSERT_TRUE(bool(Tensors));
  unsigned Checked = 0;
  for (const TensorRecord &T : *Tensors) {
    if (T.Shard.empty())
      continue;
    auto Bytes = (*R)->tensorBytes(T);
    ASSERT_TRUE(bool(Bytes)) << toString(Bytes.takeError());
    EXPECT_EQ(*Bytes, floats({float(T.Stats->Min), 2, 3, 4}));
    ++Checked;
  }
  EXPECT_EQ(Checked, 3u);
}

// A program that captures faster than the writer writes waits for room in
// its queue (twice a shard's bytes): the waits are counted, and timed, for
// meta tracer_time. Each capture here is a shard's size: every one after
// the first waits unless the writer took the queue in between, which 50
// shard writes in a row give it no time to do every time.
// Captured bytes queue up to twice a shard's size; a capture beyond that
// waits for the writer's thread to take the queue. That thread is held up
// here inside a meta value it computes, so the third 16-byte capture must
// wait, whatever the machine's speed, until it is let go.
TEST_F(TraceTest, WaitsForRoomAreCounted) {
  TraceWriterOptions O;
  O.ShardBytes = 16;
  auto W = TraceWriter::create(Dir, O);
  ASSERT_TRUE(bool(W));
  EXPECT_EQ((*W)->counts().RoomWaits, 0u);
  std::mutex M;
  std::condition_variable Changed;
  bool Held = false, Go = false;
  (*W)->setMeta("held", [&] {
    std::unique_lock<std::mutex> Lock(M);
    Held = true;
    Changed.notify_all();
    Changed.wait(Lock, [&] { return Go; });
    return std::string("yes");
  });
  {
    std::unique_lock<std::mutex> Lock(M);
    Changed.wait(Lock, [&] { return Held; }); // the writer's thread took the queue
  }
  std::atomic<int> Added{0};
  std::thread Program([&] {
    for (int I = 0; I < 3; ++I) {
      writeSmallTrace(**W, float(I));
      ++Added;
    }
  });
  while (Added.load() < 2)
    std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(Added.load(), 2) << "a third capture found room while the writer was held";
  {
    std::lock_guard<std::mutex> Lock(M);
    Go = true;
  }
  Changed.notify_all();
  Program.join();
  ASSERT_FALSE(bool((*W)->close()));
  TraceCounts C = (*W)->counts();
  EXPECT_EQ(C.RoomWaits, 1u);
  EXPECT_GT(C.RoomWaitNanos, 0u);
  EXPECT_EQ(C.CapturedTensors, 3u);
}

// A captured tensor's buffer, once its shard is written, is handed out
// again for the next capture that it holds (its pages are the process's
// already), and what was written from it stays as it was.
TEST_F(TraceTest, AWrittenBufferIsReusedForTheNextCapture) {
  TraceWriterOptions O;
  O.ShardBytes = 64 << 10; // a capture of 100000 bytes is written at once
  auto W = TraceWriter::create(Dir, O);
  ASSERT_TRUE(bool(W));
  std::vector<float> Ones(25000, 1.0f), Nines(16384, 9.0f);
  auto bytesOf = [](const std::vector<float> &V) {
    return std::string(reinterpret_cast<const char *>(V.data()), V.size() * sizeof(float));
  };
  std::string First = (*W)->takeBuffer(100000);
  First.assign(bytesOf(Ones));
  const char *Memory = First.data();
  size_t Capacity = First.capacity();
  TensorRecord R;
  R.Id = (*W)->nextTensorId();
  R.OwnerId = 1;
  R.Role = "output";
  R.Shape = {25000};
  R.Strides = {1};
  R.Device = "cpu";
  (*W)->addTensor(R, std::move(First));
  // A smaller capture (65536 bytes: a new buffer would have just that
  // capacity) gets the written one once the writer gave it back.
  std::string Again;
  for (int Try = 0; Try < 500; ++Try) {
    Again = (*W)->takeBuffer(65536);
    if (Again.capacity() == Capacity)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(Again.capacity(), Capacity) << "the written buffer never came back";
  EXPECT_EQ(Again.data(), Memory);
  EXPECT_TRUE(Again.empty());
  Again.assign(bytesOf(Nines));
  R.Id = (*W)->nextTensorId();
  R.Shape = {16384};
  (*W)->addTensor(R, std::move(Again));
  // Small buffers and much larger ones are not handed out.
  EXPECT_LT((*W)->takeBuffer(100).capacity(), size_t(1000));
  ASSERT_FALSE(bool((*W)->close()));
  auto Reader = TraceReader::open(Dir);
  ASSERT_TRUE(bool(Reader));
  auto Tensors = (*Reader)->tensors();
  ASSERT_TRUE(bool(Tensors));
  ASSERT_EQ(Tensors->size(), 2u);
  for (const TensorRecord &T : *Tensors) {
    auto Bytes = (*Reader)->tensorBytes(T);
    ASSERT_TRUE(bool(Bytes)) << toString(Bytes.takeError());
    EXPECT_EQ(*Bytes, T.Id == 1 ? bytesOf(Ones) : bytesOf(Nines));
  }
}

TEST_F(TraceTest, ExistingTraceNeedsForce) {
  {
    auto W = TraceWriter::create(Dir);
    ASSERT_TRUE(bool(W));
    writeSmallTrace(**W, 1);
    ASSERT_FALSE(bool((*W)->close()));
  }
  auto Again = TraceWriter::create(Dir);
  ASSERT_FALSE(bool(Again));
  EXPECT_NE(toString(Again.takeError()).find("already holds a trace (use --force"),
            std::string::npos);
  TraceWriterOptions O;
  O.Force = true;
  auto Forced = TraceWriter::create(Dir, O);
  ASSERT_TRUE(bool(Forced));
  ASSERT_FALSE(bool((*Forced)->close()));
  auto R = TraceReader::open(Dir);
  ASSERT_TRUE(bool(R));
  auto Calls = (*R)->moduleCalls();
  ASSERT_TRUE(bool(Calls));
  EXPECT_TRUE(Calls->empty()) << "--force replaces the old trace";
}

TEST_F(TraceTest, NewerMajorFormatIsRefused) {
  {
    auto W = TraceWriter::create(Dir);
    ASSERT_TRUE(bool(W));
    (*W)->setMeta("format", "ekka-trace 2.0");
    ASSERT_FALSE(bool((*W)->close()));
  }
  auto R = TraceReader::open(Dir);
  ASSERT_FALSE(bool(R));
  EXPECT_NE(toString(R.takeError()).find("is a trace of format 2.0; this Ekka reads format 1.x"),
            std::string::npos);
}

TEST_F(TraceTest, FormatAtLeastComparesMajorThenMinor) {
  for (auto [Format, AtLeast17, AtLeast110] :
       {std::tuple("1.6", false, false), std::tuple("1.7", true, false),
        std::tuple("1.12", true, true), std::tuple("1.99999999999999999999", true, true)}) {
    {
      TraceWriterOptions O;
      O.Force = true;
      auto W = TraceWriter::create(Dir, O);
      ASSERT_TRUE(bool(W));
      (*W)->setMeta("format", std::string("ekka-trace ") + Format);
      ASSERT_FALSE(bool((*W)->close()));
    }
    auto R = TraceReader::open(Dir);
    ASSERT_TRUE(bool(R)) << toString(R.takeError());
    EXPECT_EQ((*R)->formatAtLeast(1, 7), AtLeast17) << Format;
    EXPECT_EQ((*R)->formatAtLeast(1, 10), AtLeast110) << Format;
    EXPECT_TRUE((*R)->formatAtLeast(0, 9)) << Format;
  }
  // No Ekka wrote a format before 1.0: such a trace is refused.
  {
    TraceWriterOptions O;
    O.Force = true;
    auto W = TraceWriter::create(Dir, O);
    ASSERT_TRUE(bool(W));
    (*W)->setMeta("format", "ekka-trace 0.9");
    ASSERT_FALSE(bool((*W)->close()));
  }
  auto R = TraceReader::open(Dir);
  ASSERT_FALSE(bool(R));
  EXPECT_NE(toString(R.takeError()).find("older than any Ekka wrote"), std::string::npos);
}

TEST_F(TraceTest, MultiRankDirectoriesOpenInRankOrder) {
  for (int Rank : {0, 1}) {
    auto W = TraceWriter::create(Dir + "/rank-" + std::to_string(Rank));
    ASSERT_TRUE(bool(W));
    (*W)->setMeta("rank", std::to_string(Rank));
    ASSERT_FALSE(bool((*W)->close()));
  }
  auto Ranks = TraceReader::openRanks(Dir);
  ASSERT_TRUE(bool(Ranks)) << toString(Ranks.takeError());
  ASSERT_EQ(Ranks->size(), 2u);
  EXPECT_EQ((*Ranks)[1]->meta().at("rank"), "1");
}

// Spans (format 1.8): from the program's threads, packed small or queued
// whole, read back by start time; one that ends before it starts is a
// corrupt trace; a trace before 1.8 has none.
TEST_F(TraceTest, SpansReadBackByStartTime) {
  {
    auto W = TraceWriter::create(Dir);
    ASSERT_TRUE(bool(W)) << toString(W.takeError());
    writeSmallTrace(**W, 1);
    (*W)->addSpan(SpanRecord{TensorOwner::Op, 1, 42, 150, 180});
    std::thread Other([&] { (*W)->addSpan(SpanRecord{TensorOwner::ModuleCall, 1, 43, 100, 200}); });
    Other.join();
    ASSERT_FALSE(bool((*W)->close()));
  }
  auto R = TraceReader::open(Dir);
  ASSERT_TRUE(bool(R)) << toString(R.takeError());
  auto Spans = (*R)->spans();
  ASSERT_TRUE(bool(Spans)) << toString(Spans.takeError());
  ASSERT_EQ(Spans->size(), 2u);
  EXPECT_EQ((*Spans)[0].Owner, TensorOwner::ModuleCall);
  EXPECT_EQ((*Spans)[0].Thread, 43);
  EXPECT_EQ((*Spans)[0].StartNs, 100);
  EXPECT_EQ((*Spans)[1].Owner, TensorOwner::Op);
  EXPECT_EQ((*Spans)[1].EndNs, 180);

  auto Db = SQLiteDatabase::open(Dir + "/trace.db", SQLiteDatabase::Mode::ReadWriteCreate);
  ASSERT_TRUE(bool(Db)) << toString(Db.takeError());
  ASSERT_FALSE(bool((*Db)->exec("UPDATE spans SET end_ns = 10 WHERE owner = 'op'")));
  auto Bad = TraceReader::open(Dir);
  ASSERT_TRUE(bool(Bad));
  auto Refused = (*Bad)->spans();
  ASSERT_FALSE(bool(Refused));
  EXPECT_NE(toString(Refused.takeError()).find("is corrupt: a span of op 1 ends before it starts"),
            std::string::npos);

  ASSERT_FALSE(bool((*Db)->exec("DROP TABLE spans; UPDATE meta SET value = 'ekka-trace 1.7' "
                                "WHERE key = 'format'")));
  auto Old = TraceReader::open(Dir);
  ASSERT_TRUE(bool(Old)) << toString(Old.takeError());
  auto None = (*Old)->spans();
  ASSERT_TRUE(bool(None)) << toString(None.takeError());
  EXPECT_TRUE(None->empty());
}

TEST_F(TraceTest, CorruptDatabaseIsAClearError) {
  ASSERT_FALSE(sys::fs::create_directories(Dir));
  {
    std::error_code EC;
    raw_fd_ostream OS(Dir + "/trace.db", EC);
    OS << "this is not an SQLite database, but long enough to have a header";
  }
  auto R = TraceReader::open(Dir);
  ASSERT_FALSE(bool(R));
  EXPECT_NE(toString(R.takeError()).find("is not an Ekka trace (file is not a database)"),
            std::string::npos);
}

TEST_F(TraceTest, AShardNotWrittenStopsCaptureAndKeepsEveryRow) {
  // A shard that cannot be written (here: its name is taken by a directory,
  // as a full disk would refuse it) stops capturing; close() says so, every
  // tensor keeps its row and statistics, later captures are written without
  // their bytes, and meta lost_records (set before the failure, and after)
  // says how many.
  TraceWriterOptions O;
  O.ShardBytes = 8; // each batch's captures make a shard
  auto W = TraceWriter::create(Dir, O);
  ASSERT_TRUE(bool(W));
  ASSERT_FALSE(sys::fs::create_directories(Dir + "/tensors-0000.safetensors"));
  writeSmallTrace(**W, 1);
  (*W)->setMeta(LostRecordsKey, "0");
  ASSERT_FALSE(bool((*W)->flush())); // not a failure of the trace's: it goes on
  writeSmallTrace(**W, 5);
  (*W)->setMeta(LostRecordsKey, "3 records lost to errors");
  Error E = (*W)->close();
  ASSERT_TRUE(bool(E));
  std::string Msg = toString(std::move(E));
  EXPECT_NE(Msg.find("tensors-0000.safetensors"), std::string::npos) << Msg;
  EXPECT_NE(Msg.find("capture stopped there: 2 captured tensors were recorded without their "
                     "bytes"),
            std::string::npos)
      << Msg;
  EXPECT_EQ((*W)->counts().DroppedCaptures, 2u);
  EXPECT_EQ((*W)->counts().CapturedTensors, 0u);
  auto R = TraceReader::open(Dir);
  ASSERT_TRUE(bool(R)) << toString(R.takeError());
  auto Calls = (*R)->moduleCalls();
  ASSERT_TRUE(Calls && Calls->size() == 2u);
  auto Tensors = (*R)->tensors();
  ASSERT_TRUE(Tensors && Tensors->size() == 4u);
  for (const TensorRecord &T : *Tensors) {
    EXPECT_TRUE(T.Shard.empty() && T.Key.empty()) << T.Shard << " " << T.Key;
    EXPECT_TRUE(T.Stats.has_value());
  }
  EXPECT_EQ((*R)->meta().at(std::string(LostRecordsKey)),
            "3 records lost to errors; 2 captured tensors were recorded without their bytes, "
            "their statistics kept (capture stopped at a shard that could not be written: "
            "cannot write '" +
                Dir + "/tensors-0000.safetensors': Is a directory)");
}

TEST_F(TraceTest, AKilledWriterLeavesOnlyCompleteShards) {
  // Simulate a writer that died after committing rows but before writing its
  // last shard: captured rows are written only after their shard, so what
  // the database says was captured is on disk.
  TraceWriterOptions O;
  O.ShardBytes = 1 << 20;
  auto W = TraceWriter::create(Dir, O);
  ASSERT_TRUE(bool(W));
  writeSmallTrace(**W, 1);
  // Rows without data are committed by the background thread in batches;
  // wait until the call row is visible, then look without closing.
  auto Db = SQLiteDatabase::open(Dir + "/trace.db", SQLiteDatabase::Mode::ReadOnly);
  ASSERT_TRUE(bool(Db));
  int64_t Calls = 0, Captured = 0;
  for (int Try = 0; Try < 200 && Calls == 0; ++Try) {
    auto S = (*Db)->prepare("SELECT (SELECT count(*) FROM module_calls), "
                            "(SELECT count(*) FROM tensors WHERE shard IS NOT NULL)");
    ASSERT_TRUE(bool(S));
    ASSERT_TRUE(S->step() && true);
    Calls = S->columnInt(0);
    Captured = S->columnInt(1);
    if (Calls == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Calls, 1);
  EXPECT_EQ(Captured, 0) << "no captured row before its shard is on disk";
  // Indexes come when the writer closes (one pass each, not kept up to
  // date at every row): a killed writer's trace has none, and reads.
  auto Indexes = [&] {
    auto Db = SQLiteDatabase::open(Dir + "/trace.db", SQLiteDatabase::Mode::ReadOnly);
    EXPECT_TRUE(bool(Db));
    auto S = (*Db)->prepare("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND "
                            "name IN ('tensors_owner', 'ops_module_call', 'kernels_op')");
    EXPECT_TRUE(S && S->step());
    return S->columnInt(0);
  };
  EXPECT_EQ(Indexes(), 0);
  ASSERT_FALSE(bool((*W)->close()));
  EXPECT_EQ(Indexes(), 3);
  auto R = TraceReader::open(Dir);
  ASSERT_TRUE(bool(R));
  EXPECT_EQ((*R)->moduleCalls()->size(), 1u);
}

// flush(): what was handed over, the shard under way included, is in the
// files when it returns (a process about to exec keeps it), and the writer
// goes on: later records go into the same trace, into a next shard.
TEST_F(TraceTest, AFlushWritesEverythingAndTheWriterGoesOn) {
  TraceWriterOptions O;
  O.ShardBytes = 1 << 20; // a shard written only when full, or flushed
  auto W = TraceWriter::create(Dir, O);
  ASSERT_TRUE(bool(W));
  writeSmallTrace(**W, 1);
  (*W)->setMeta("lost_records", "0");
  ASSERT_FALSE(bool((*W)->flush()));
  {
    auto R = TraceReader::open(Dir);
    ASSERT_TRUE(bool(R)) << toString(R.takeError());
    EXPECT_EQ((*R)->meta().count("lost_records"), 1u);
    auto Tensors = (*R)->tensors();
    ASSERT_TRUE(Tensors && Tensors->size() == 2u);
    EXPECT_EQ((*Tensors)[0].Shard, "tensors-0000.safetensors");
    auto Bytes = (*R)->tensorBytes((*Tensors)[0]);
    ASSERT_TRUE(bool(Bytes)) << toString(Bytes.takeError());
    EXPECT_EQ(*Bytes, floats({1, 2, 3, 4}));
  }
  writeSmallTrace(**W, 5);
  ASSERT_FALSE(bool((*W)->close()));
  auto R = TraceReader::open(Dir);
  ASSERT_TRUE(bool(R));
  auto Calls = (*R)->moduleCalls();
  ASSERT_TRUE(Calls && Calls->size() == 2u);
  auto Tensors = (*R)->tensors();
  ASSERT_TRUE(Tensors && Tensors->size() == 4u);
  EXPECT_EQ((*Tensors)[2].Shard, "tensors-0001.safetensors");
  auto Bytes = (*R)->tensorBytes((*Tensors)[2]);
  ASSERT_TRUE(bool(Bytes));
  EXPECT_EQ(*Bytes, floats({5, 2, 3, 4}));
  EXPECT_EQ((*W)->counts().Shards, 2u);
}

// The writer inserts a table's rows up to 32 by one statement, and what a
// batch leaves over by statements of 16, 8, ... 1 rows; a row's texts are
// bound where they are (its record's, an interned text, a small record's
// device or kernel name) or as its own copy (the JSON of a shape, strides, grid, block),
// and not bound again where a statement's parameter holds it already.
// Groups of every size around those, each written out by a flush, read
// back row by row: no row lost or doubled, no row with another's value.
TEST_F(TraceTest, EveryRowReadsBackWhateverHowManyAStatementTook) {
  auto W = TraceWriter::create(Dir);
  ASSERT_TRUE(bool(W)) << toString(W.takeError());
  TraceWriter &Writer = **W;
  const TraceWriter::OpText *Mm = Writer.internOp("aten::mm", "mm(Tensor a, Tensor b) -> Tensor");
  int64_t Rows = 0;
  for (int64_t Group : {1, 2, 3, 7, 31, 32, 33, 64, 95}) {
    for (int64_t I = 0; I < Group; ++I, ++Rows) {
      std::string N = std::to_string(Rows);
      if (Rows % 2) {
        ModuleCallRecord Call;
        Call.Id = Writer.nextModuleCallId();
        Call.ParentId = Rows % 4 == 1 ? std::optional<int64_t>() : Call.Id - 1;
        Call.Seq = Rows;
        Call.Step = 2 * Rows;
        Call.Path = "model.layers." + N;
        Call.ClassName = "C" + N;
        Call.ClassQualname = "m.C" + N;
        Call.SourceFile = "f" + N + ".py";
        Call.SourceLine = 3 * Rows;
        Writer.addModuleCall(std::move(Call));
      } else {
        const TraceWriter::ModuleText *Text = Writer.internModule(
            "model.layers." + N, "C" + N, "m.C" + N, "f" + N + ".py", 3 * Rows);
        int64_t Id = Writer.nextModuleCallId();
        // The first call is a root: a reader refuses a parent that is no
        // earlier call.
        Writer.addModuleCall(Id, Rows ? std::optional<int64_t>(Id - 1) : std::nullopt, Rows,
                             2 * Rows, Text);
      }
      OpRecord Op;
      Op.Id = Writer.nextOpId();
      Op.Seq = Rows;
      if (Rows % 3) {
        Op.ModuleCallId = Rows;
        Op.Name = "op" + N;
        Op.Schema = "op" + N + "() -> ()";
        Writer.addOp(std::move(Op));
      } else {
        Writer.addOp(Op.Id, std::nullopt, Rows, Mm);
      }
      KernelRecord K;
      K.Id = Writer.nextKernelId();
      if (Rows % 2)
        K.OpId = Op.Id;
      K.ModuleCallId = Rows;
      K.Seq = Rows;
      K.Name = "kernel" + N;
      K.Grid[0] = uint32_t(Rows + 1);
      K.Block[1] = uint32_t(Rows + 2);
      K.SharedMem = uint64_t(Rows);
      K.Stream = 7;
      K.CorrelationId = uint64_t(1000 + Rows);
      if (Rows % 3 == 1) // packed, its name interned
        Writer.addKernel(K, Writer.internKernelName(K.Name));
      else
        Writer.addKernel(std::move(K));
      TensorRecord T;
      T.Id = Writer.nextTensorId();
      T.Owner = TensorOwner::Op;
      T.OwnerId = Rows;
      T.Role = Rows % 2 ? "output" : "input";
      T.Index = Rows;
      T.Shape = {Rows, 2};
      T.Strides = {2, 1};
      T.Device = Rows % 2 ? "cuda:1" : "cpu";
      if (Rows % 3)
        T.Stats = TensorStats{double(Rows), 1, -double(Rows), Rows % 5 ? 1.0 : NAN, 0, 0};
      if (Rows % 4 == 0)
        T.Layout = "nested" + N; // not packed: the queue's own item
      Writer.addTensor(std::move(T));
    }
    ASSERT_FALSE(bool(Writer.flush()));
  }
  ASSERT_FALSE(bool(Writer.close()));

  auto R = TraceReader::open(Dir);
  ASSERT_TRUE(bool(R)) << toString(R.takeError());
  auto Calls = (*R)->moduleCalls();
  auto Ops = (*R)->ops();
  auto Kernels = (*R)->kernels();
  auto Tensors = (*R)->tensors();
  ASSERT_TRUE(bool(Calls)) << toString(Calls.takeError());
  ASSERT_TRUE(Ops && Kernels && Tensors);
  ASSERT_EQ(int64_t(Calls->size()), Rows);
  ASSERT_EQ(int64_t(Ops->size()), Rows);
  ASSERT_EQ(int64_t(Kernels->size()), Rows);
  ASSERT_EQ(int64_t(Tensors->size()), Rows);
  for (int64_t Row = 0; Row < Rows; ++Row) {
    SCOPED_TRACE("row " + std::to_string(Row));
    std::string N = std::to_string(Row);
    const ModuleCallRecord &C = (*Calls)[Row];
    EXPECT_EQ(C.Id, Row + 1);
    EXPECT_EQ(C.ParentId, Row % 4 == 1 || !Row ? std::optional<int64_t>() : Row);
    EXPECT_EQ(C.Seq, Row);
    EXPECT_EQ(C.Step, 2 * Row);
    EXPECT_EQ(C.Path, "model.layers." + N);
    EXPECT_EQ(C.ClassName, "C" + N);
    EXPECT_EQ(C.ClassQualname, "m.C" + N);
    EXPECT_EQ(C.SourceFile, "f" + N + ".py");
    EXPECT_EQ(C.SourceLine, 3 * Row);
    const OpRecord &O = (*Ops)[Row];
    EXPECT_EQ(O.Id, Row + 1);
    EXPECT_EQ(O.Seq, Row);
    EXPECT_EQ(O.ModuleCallId, Row % 3 ? std::optional<int64_t>(Row) : std::nullopt);
    EXPECT_EQ(O.Name, Row % 3 ? "op" + N : "aten::mm");
    EXPECT_EQ(O.Schema, Row % 3 ? "op" + N + "() -> ()" : "mm(Tensor a, Tensor b) -> Tensor");
    const KernelRecord &K = (*Kernels)[Row];
    EXPECT_EQ(K.Id, Row + 1);
    EXPECT_EQ(K.OpId, Row % 2 ? std::optional<int64_t>(Row + 1) : std::nullopt);
    EXPECT_EQ(K.ModuleCallId, std::optional<int64_t>(Row));
    EXPECT_EQ(K.Name, "kernel" + N);
    EXPECT_EQ(K.Grid[0], uint32_t(Row + 1));
    EXPECT_EQ(K.Grid[1], 0u);
    EXPECT_EQ(K.Block[0], 0u);
    EXPECT_EQ(K.Block[1], uint32_t(Row + 2));
    EXPECT_EQ(K.SharedMem, uint64_t(Row));
    EXPECT_EQ(K.Stream, 7u);
    EXPECT_EQ(K.CorrelationId, uint64_t(1000 + Row));
    const TensorRecord &T = (*Tensors)[Row];
    EXPECT_EQ(T.Id, Row + 1);
    EXPECT_EQ(T.OwnerId, Row);
    EXPECT_EQ(T.Role, Row % 2 ? "output" : "input");
    EXPECT_EQ(T.Index, Row);
    EXPECT_EQ(T.Shape, (TensorDims{Row, 2}));
    EXPECT_EQ(T.Strides, (TensorDims{2, 1}));
    EXPECT_EQ(T.Device, Row % 2 ? "cuda:1" : "cpu");
    ASSERT_EQ(T.Stats.has_value(), Row % 3 != 0);
    if (T.Stats) {
      EXPECT_EQ(T.Stats->Sum, double(Row));
      EXPECT_EQ(T.Stats->Min, -double(Row));
      if (Row % 5)
        EXPECT_EQ(T.Stats->Max, 1.0);
      else
        EXPECT_TRUE(std::isnan(T.Stats->Max)); // stored as NULL
    }
    EXPECT_EQ(T.Layout, Row % 4 == 0 ? "nested" + N : "");
  }
}

} // namespace
