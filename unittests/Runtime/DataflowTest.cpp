//===- DataflowTest.cpp - Module outputs coming back as inputs ------------===//
//
// A module output stays known (its storage's writes counted) while it may
// come back as a later call's input: while it lives, within its root's
// forward. One freed meanwhile can never come back (a tensor allocated at
// its address later is not it: the record holds a weak reference); a long
// forward (a loop of steps inside one root) lets go of those as it goes.
//
//===----------------------------------------------------------------------===//
#include "../../lib/Runtime/StorageWrites.h"
#include "ekka/Runtime/TraceSession.h"
#include "ekka/Trace/TraceReader.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"

#include <ATen/ops/full.h>
#include <gtest/gtest.h>

#include <vector>

using namespace ekka;
using namespace llvm;

namespace {

TEST(Dataflow, FreedOutputsOfALongForwardAreLetGo) {
  SmallString<128> Dir;
  ASSERT_FALSE(sys::fs::createUniqueDirectory("ekka-dataflow", Dir));
  std::string Trace = (Dir + "/trace").str();
  ASSERT_EQ(startTrace(Trace, "capture=none;", "test"), "");
  StorageWriteCounts &Counts = StorageWriteCounts::process();
  int64_t Before = Counts.watched();
  int64_t Root = enterModule("", "Loop", "m.Loop", "m.py", 1, true, {});
  // Each step's output is a view, freed at once, of a tensor that lives
  // on: its storage is never another's, whatever the allocator reuses.
  constexpr int Steps = 1000;
  std::vector<at::Tensor> Bases;
  at::Tensor Kept;
  int64_t KeptCall = 0;
  for (int I = 0; I < Steps; ++I) {
    int64_t Step = enterModule("step", "Step", "m.Step", "m.py", 2, false, {});
    Bases.push_back(at::full({4}, double(I)));
    at::Tensor Out = Bases.back().view({2, 2});
    exitModule(Step, {Out});
    if (I == 10) {
      Kept = Out;
      KeptCall = Step;
    }
  }
  // The live output and at most a few dozen freed since the last look.
  EXPECT_LE(Counts.watched() - Before, 100);
  // The one kept still comes back as the output it is.
  int64_t Use = enterModule("use", "Use", "m.Use", "m.py", 3, false, {Kept});
  exitModule(Use, {});
  exitModule(Root, {});
  EXPECT_EQ(Counts.watched(), Before);
  std::string Summary = stopTrace();
  EXPECT_EQ(Summary.find("warning"), std::string::npos) << Summary;

  auto R = TraceReader::open(Trace);
  ASSERT_TRUE(bool(R)) << toString(R.takeError());
  auto Tensors = (*R)->tensors();
  ASSERT_TRUE(bool(Tensors)) << toString(Tensors.takeError());
  std::optional<int64_t> KeptId, Source;
  bool UseInput = false;
  for (const TensorRecord &T : *Tensors) {
    if (T.Owner != TensorOwner::ModuleCall)
      continue;
    if (T.OwnerId == KeptCall && T.Role == "output")
      KeptId = T.Id;
    if (T.OwnerId == Use && T.Role == "input") {
      UseInput = true;
      Source = T.SourceId;
    }
  }
  ASSERT_TRUE(KeptId.has_value());
  ASSERT_TRUE(UseInput);
  EXPECT_EQ(Source, KeptId);
  sys::fs::remove_directories(Dir);
}

// A tensor allocated where a freed output was (its storage at the same
// address, as the allocator hands a freed block out again) is not that
// output, and is recorded with statistics of its own.
TEST(Dataflow, ATensorWhereAFreedOutputWasIsNotIt) {
  SmallString<128> Dir;
  ASSERT_FALSE(sys::fs::createUniqueDirectory("ekka-dataflow", Dir));
  std::string Trace = (Dir + "/trace").str();
  ASSERT_EQ(startTrace(Trace, "capture=none;", "test"), "");
  int64_t Root = enterModule("", "Loop", "m.Loop", "m.py", 1, true, {});
  std::vector<int64_t> Uses;
  for (int I = 0; I < 20; ++I) {
    int64_t Step = enterModule("step", "Step", "m.Step", "m.py", 2, false, {});
    at::Tensor Out = at::full({4}, 1.0);
    exitModule(Step, {Out});
    const void *Storage = Out.storage().unsafeGetStorageImpl();
    Out.reset();
    at::Tensor Next = at::full({4}, 2.0);
    if (Next.storage().unsafeGetStorageImpl() != Storage)
      continue;
    Uses.push_back(enterModule("use", "Use", "m.Use", "m.py", 3, false, {Next}));
    exitModule(Uses.back(), {});
  }
  exitModule(Root, {});
  stopTrace();
  if (Uses.empty())
    GTEST_SKIP() << "the allocator never reused a freed output's storage";

  auto R = TraceReader::open(Trace);
  ASSERT_TRUE(bool(R)) << toString(R.takeError());
  auto Tensors = (*R)->tensors();
  ASSERT_TRUE(bool(Tensors)) << toString(Tensors.takeError());
  size_t Inputs = 0;
  for (const TensorRecord &T : *Tensors)
    if (T.Owner == TensorOwner::ModuleCall && T.Role == "input" &&
        llvm::is_contained(Uses, T.OwnerId)) {
      ++Inputs;
      EXPECT_FALSE(T.SourceId.has_value()) << "call " << T.OwnerId;
      ASSERT_TRUE(T.Stats.has_value()) << "call " << T.OwnerId;
      EXPECT_EQ(T.Stats->Sum, 8.0) << "call " << T.OwnerId;
    }
  EXPECT_EQ(Inputs, Uses.size());
  sys::fs::remove_directories(Dir);
}

} // namespace
