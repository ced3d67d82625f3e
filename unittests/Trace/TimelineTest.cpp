//===- TimelineTest.cpp - A trace's timeline as trace events --------------===//
#include "ekka/Trace/Timeline.h"
#include "ekka/Trace/TraceReader.h"
#include "ekka/Trace/TraceWriter.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"

#include <gtest/gtest.h>

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
  /// 1200-1800 ns; the op launched two kernels on stream 7.
  void writeTrace() {
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
      K.Seq = I;
      K.Name = I ? "_Z7epiloguev" : "_Z4gemmv";
      K.Stream = 7;
      K.Grid[0] = 4;
      (*W)->addKernel(K);
    }
    (*W)->addSpan(SpanRecord{TensorOwner::ModuleCall, Call.Id, 11, 1000, 2000});
    (*W)->addSpan(SpanRecord{TensorOwner::Op, Op.Id, 11, 1200, 1800});
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
    auto Doc = json::parse(Text);
    EXPECT_TRUE(bool(Doc)) << toString(Doc.takeError());
    return *Doc->getAsObject()->getArray("traceEvents");
  }

  SmallString<128> Root;
  std::string Dir;
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
  Marks.Calls[1] = "suspect 1: model.layers.0.mlp, R = 60";
  Marks.OpSeq = 0;
  Marks.OpLabel = "first divergent op: aten::mm";
  json::Array Events = events(Marks);
  EXPECT_EQ(withCat(Events, "module")[0]->getObject("args")->getString("ekka"),
            "suspect 1: model.layers.0.mlp, R = 60");
  auto Instants = withCat(Events, "ekka");
  ASSERT_EQ(Instants.size(), 2u);
  EXPECT_EQ(*Instants[1]->getString("name"), "first divergent op: aten::mm");
  EXPECT_EQ(*Instants[1]->getNumber("ts"), 0.2);
  EXPECT_EQ(*Instants[1]->getString("s"), "t");
}

} // namespace
