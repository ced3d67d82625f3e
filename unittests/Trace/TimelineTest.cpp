//===- TimelineTest.cpp - A trace's timeline as trace events --------------===//
#include "ekka/Trace/Timeline.h"
#include "ekka/Trace/TraceReader.h"
#include "ekka/Trace/TraceWriter.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"

#include <gtest/gtest.h>

#include <optional>

using namespace ekka;
using namespace llvm;

namespace {

class TimelineTest : public ::testing::Test {
protected:
  void SetUp() override {
    ASSERT_FALSE(sys::fs::createUniqueDirectory("ekka-timeline", Root));
    Dir = (Root + "/trace").str();
  }
  void TearDown() override { sys::fs::remove_directories(Root); }

  /// A module call running one op on thread 11, 1000-2000 ns and
  /// 1200-1800 ns; the op launched two kernels on stream 7. With
  /// \p Nested, a child op (1400-1500 ns) launched a kernel between them,
  /// a kernel outside any op ran in the module call, and one outside any
  /// module call.
  void writeTrace(bool Nested = false) {
    auto W = TraceWriter::create(Dir);
    ASSERT_TRUE(bool(W)) << toString(W.takeError());
    ModuleCallRecord Call;
    Call.Id = (*W)->nextModuleCallId();
    Call.Path = "model.layers.0.mlp";
    Call.ClassName = "LlamaMLP";
    Call.ClassQualname = "transformers.models.llama.modeling_llama.LlamaMLP";
    (*W)->addModuleCall(Call);
    OpRecord Op;
    Op.Id = (*W)->nextOpId();
    Op.ModuleCallId = Call.Id;
    Op.Seq = 0;
    Op.Name = "aten::mm";
    (*W)->addOp(Op);
    for (int I = 0; I < 2; ++I) {
      KernelRecord K;
      K.Id = (*W)->nextKernelId();
      K.OpId = Op.Id;
      K.ModuleCallId = Call.Id;
      K.Seq = 2 * I;
      K.Name = I ? "_Z7epiloguev" : "_Z4gemmv";
      K.Stream = 7;
      K.Grid[0] = 4;
      (*W)->addKernel(K);
    }
    (*W)->addSpan(SpanRecord{TensorOwner::ModuleCall, Call.Id, 11, 1000, 2000});
    (*W)->addSpan(SpanRecord{TensorOwner::Op, Op.Id, 11, 1200, 1800});
    if (Nested) {
      OpRecord Child;
      Child.Id = (*W)->nextOpId();
      Child.ModuleCallId = Call.Id;
      Child.Seq = 1;
      Child.Name = "aten::copy_";
      (*W)->addOp(Child);
      (*W)->addSpan(SpanRecord{TensorOwner::Op, Child.Id, 11, 1400, 1500});
      auto Launch = [&](std::optional<int64_t> OpId, std::optional<int64_t> CallId, int64_t Seq,
                        const char *Name) {
        KernelRecord K;
        K.Id = (*W)->nextKernelId();
        K.OpId = OpId;
        K.ModuleCallId = CallId;
        K.Seq = Seq;
        K.Name = Name;
        K.Stream = 7;
        (*W)->addKernel(K);
      };
      // Launched between the parent's two kernels, in the child op.
      Launch(Child.Id, Call.Id, 1, "_Z4copyv");
      Launch(std::nullopt, Call.Id, 3, "triton_poi_fused_0");
      Launch(std::nullopt, std::nullopt, 4, "_Z8orphanedv");
    }
    ASSERT_FALSE(bool((*W)->close()));
  }

  json::Array events(const TimelineMarks &Marks = {}) {
    auto R = TraceReader::open(Dir);
    EXPECT_TRUE(bool(R)) << toString(R.takeError());
    std::string Text;
    raw_string_ostream OS(Text);
    TraceReader *Ranks[] = {R->get()};
    auto Summary = writeTimeline(OS, Ranks, Marks);
    EXPECT_TRUE(bool(Summary)) << toString(Summary.takeError());
    if (Summary)
      Last = *Summary;
    auto Doc = json::parse(Text);
    EXPECT_TRUE(bool(Doc)) << toString(Doc.takeError());
    return *Doc->getAsObject()->getArray("traceEvents");
  }

  SmallString<128> Root;
  std::string Dir;
  TimelineSummary Last;
};

std::vector<const json::Object *> withCat(const json::Array &Events, StringRef Cat) {
  std::vector<const json::Object *> Out;
  for (const json::Value &E : Events)
    if (E.getAsObject()->getString("cat") == Cat)
      Out.push_back(E.getAsObject());
  return Out;
}

TEST_F(TimelineTest, KernelsGoOnTheirStreamWithinTheirOpsSpan) {
  writeTrace();
  json::Array Events = events();
  auto Calls = withCat(Events, "module"), Ops = withCat(Events, "op"),
       Kernels = withCat(Events, "kernel");
  ASSERT_EQ(Calls.size(), 1u);
  ASSERT_EQ(Ops.size(), 1u);
  ASSERT_EQ(Kernels.size(), 2u);
  // Times from the first span, in microseconds.
  EXPECT_EQ(*Calls[0]->getNumber("ts"), 0);
  EXPECT_EQ(*Calls[0]->getNumber("dur"), 1);
  EXPECT_EQ(*Ops[0]->getNumber("ts"), 0.2);
  EXPECT_EQ(*Ops[0]->getInteger("tid"), 11);
  // The op's 0.6 us shared by its two kernels, in launch order, on the GPU
  // process's stream-7 track.
  EXPECT_EQ(*Kernels[0]->getString("name"), "_Z4gemmv");
  EXPECT_EQ(*Kernels[0]->getNumber("ts"), 0.2);
  EXPECT_NEAR(*Kernels[1]->getNumber("ts"), 0.5, 1e-9);
  EXPECT_NEAR(*Kernels[1]->getNumber("dur"), 0.3, 1e-9);
  EXPECT_EQ(*Kernels[1]->getInteger("pid"), 2);
  EXPECT_EQ(*Kernels[1]->getInteger("tid"), 7);
  const json::Object *Args = Kernels[1]->getObject("args");
  EXPECT_EQ(*Args->getInteger("op_id"), *Ops[0]->getObject("args")->getInteger("op_id"));
  EXPECT_EQ((*Args->getArray("grid"))[0].getAsInteger(), 4);
  // The GPU process and its stream are named.
  bool StreamNamed = false;
  for (const json::Value &E : Events) {
    const json::Object &O = *E.getAsObject();
    if (O.getString("ph") == "M" && O.getString("name") == "thread_name" &&
        O.getInteger("pid") == 2 && O.getInteger("tid") == 7)
      StreamNamed = O.getObject("args")->getString("name") == "stream 7";
  }
  EXPECT_TRUE(StreamNamed);
}

TEST_F(TimelineTest, MarksLabelTheirEventsAndShowAsInstants) {
  writeTrace();
  TimelineMarks Marks;
  Marks.Calls[{0, 1}] = "suspect 1: model.layers.0.mlp, R = 60";
  Marks.Ops[{0, 0}] = "first divergent op: aten::mm";
  Marks.Calls[{1, 1}] = "on another rank: not this trace's";
  json::Array Events = events(Marks);
  EXPECT_EQ(withCat(Events, "module")[0]->getObject("args")->getString("ekka"),
            "suspect 1: model.layers.0.mlp, R = 60");
  auto Instants = withCat(Events, "ekka");
  ASSERT_EQ(Instants.size(), 2u);
  EXPECT_EQ(*Instants[1]->getString("name"), "first divergent op: aten::mm");
  EXPECT_EQ(*Instants[1]->getNumber("ts"), 0.2);
  EXPECT_EQ(*Instants[1]->getString("s"), "t");
  EXPECT_EQ(Last.Marks, 2u);
}

// A parent op's kernels and its child op's share a stream without
// overlapping, in launch order; a kernel outside any op is placed in its
// module call; one outside any module call is left out, and counted.
TEST_F(TimelineTest, KernelsOfNestedOpsFollowOneAnotherOnTheirStream) {
  writeTrace(/*Nested=*/true);
  json::Array Events = events();
  auto Kernels = withCat(Events, "kernel");
  ASSERT_EQ(Kernels.size(), 4u);
  EXPECT_EQ(Last.KernelsWithoutSpan, 1u);
  std::vector<std::string> Order;
  double End = 0;
  for (const json::Object *K : Kernels) {
    Order.push_back(K->getString("name")->str());
    double Ts = *K->getNumber("ts"), Dur = *K->getNumber("dur");
    EXPECT_GE(Ts + 1e-9, End) << Order.back() << " overlaps the kernel before it";
    EXPECT_GE(Dur, 0);
    End = Ts + Dur;
  }
  EXPECT_EQ(Order, (std::vector<std::string>{"_Z4gemmv", "_Z4copyv", "_Z7epiloguev",
                                             "triton_poi_fused_0"}));
  // The Triton kernel, launched outside any op, lies in its module call.
  EXPECT_NE(Kernels[3]->getObject("args")->getString("placement")->find("module call"),
            StringRef::npos);
}

// An op that ends after the op around it on its thread (an async
// record_function, as gloo's send) cannot be a complete event there: it is
// an async pair, begin and end, under its op's id.
TEST_F(TimelineTest, ASpanThatDoesNotNestIsAnAsyncPair) {
  {
    auto W = TraceWriter::create(Dir);
    ASSERT_TRUE(bool(W)) << toString(W.takeError());
    for (int I = 0; I < 2; ++I) {
      OpRecord Op;
      Op.Id = (*W)->nextOpId();
      Op.Seq = I;
      Op.Name = I ? "gloo:send" : "c10d::send";
      (*W)->addOp(Op);
    }
    (*W)->addSpan(SpanRecord{TensorOwner::Op, 1, 5, 0, 100});
    (*W)->addSpan(SpanRecord{TensorOwner::Op, 2, 5, 50, 300});
    ASSERT_FALSE(bool((*W)->close()));
  }
  json::Array Events = events();
  std::vector<std::string> Phases;
  for (const json::Value &E : Events) {
    const json::Object &O = *E.getAsObject();
    if (O.getString("cat") == "op")
      Phases.push_back(O.getString("ph")->str() + " " + O.getString("name")->str());
  }
  EXPECT_EQ(Phases, (std::vector<std::string>{"X c10d::send", "b gloo:send", "e gloo:send"}));
  EXPECT_EQ(Last.Async, 1u);
  EXPECT_EQ(Last.Ops, 2u);
}

} // namespace
