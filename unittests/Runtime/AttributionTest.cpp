//===- AttributionTest.cpp - Kernels land under their op and module -------===//
//
// Synthetic launches fed to the runtime as CUPTI would, around a module call
// and an op: each kernel is attributed to the op and module call open on the
// thread when it was launched.
//
//===----------------------------------------------------------------------===//
#include "../../lib/Runtime/SessionInternal.h"
#include "ekka/Runtime/TraceSession.h"
#include "ekka/Trace/TraceReader.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"

#include <ATen/ops/full.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <cstring>

using namespace ekka;
using namespace llvm;

namespace {

KernelLaunch launch(const char *Name) {
  KernelLaunch L;
  L.Name = Name;
  L.Grid[0] = 1;
  L.Block[0] = 32;
  return L;
}

TEST(Attribution, KernelsGoToTheOpenOpAndModuleCall) {
  SmallString<128> Dir;
  ASSERT_FALSE(sys::fs::createUniqueDirectory("ekka-attr", Dir));
  std::string Trace = (Dir + "/trace").str();
  ASSERT_EQ(startTrace(Trace, "gpu=synthetic test;", "test"), "");
  int64_t Call = enterModule("model.mlp", "MLP", "m.MLP", "m.py", 3, true, {});
  {
    RECORD_USER_SCOPE("zoo::gemm");
    recordKernelLaunch(launch("_Z4gemmPf"));
  }
  recordKernelLaunch(launch("_Z7elementPf"));
  exitModule(Call, {});
  recordKernelLaunch(launch("_Z8orphanedPf"));
  std::string Summary = stopTrace();
  EXPECT_NE(Summary.find("3 kernels"), std::string::npos) << Summary;

  auto R = TraceReader::open(Trace);
  ASSERT_TRUE(bool(R)) << toString(R.takeError());
  EXPECT_EQ((*R)->meta().at("gpu_kernels"), "not traced: synthetic test");
  auto Ops = (*R)->ops();
  ASSERT_TRUE(bool(Ops));
  std::optional<int64_t> Gemm;
  for (const OpRecord &O : *Ops)
    if (O.Name == "zoo::gemm")
      Gemm = O.Id;
  ASSERT_TRUE(Gemm.has_value());
  auto Kernels = (*R)->kernels();
  ASSERT_TRUE(Kernels && Kernels->size() == 3u);
  EXPECT_EQ((*Kernels)[0].Name, "_Z4gemmPf");
  EXPECT_EQ((*Kernels)[0].OpId, Gemm);
  EXPECT_EQ((*Kernels)[0].ModuleCallId, Call);
  EXPECT_FALSE((*Kernels)[1].OpId.has_value());
  EXPECT_EQ((*Kernels)[1].ModuleCallId, Call);
  EXPECT_FALSE((*Kernels)[2].OpId.has_value());
  EXPECT_FALSE((*Kernels)[2].ModuleCallId.has_value());
  EXPECT_EQ((*Kernels)[0].Block[0], 32u);
  sys::fs::remove_directories(Dir);
}

// A kernel's name is interned once per thread and address (CUPTI reports
// a kernel's symbol at the same address at every launch); a name at that
// address later that reads otherwise (a module unloaded, another loaded
// there) is another kernel's, and a second trace interns its names anew.
TEST(Attribution, KernelNamesAreInternedByAddressAndChecked) {
  SmallString<128> Dir;
  ASSERT_FALSE(sys::fs::createUniqueDirectory("ekka-names", Dir));
  char Symbol[32];
  for (int Trace = 0; Trace < 2; ++Trace) {
    std::string Path = (Dir + "/trace" + Twine(Trace)).str();
    ASSERT_EQ(startTrace(Path, "gpu=synthetic test;", "test"), "");
    for (const char *Name : {"_Z5firstPf", "_Z5firstPf", "_Z6secondPf", "_Z5firstPf"}) {
      std::strcpy(Symbol, Name);
      recordKernelLaunch(launch(Symbol));
    }
    recordKernelLaunch(launch("_Z7literalPf")); // another address
    // Names at ever new addresses: the cache starts over past a few
    // thousand, and every name is still its own.
    std::vector<std::string> Many;
    for (int I = 0; I < 5000; ++I)
      Many.push_back("_Z4manyILi" + std::to_string(I) + "EEvv");
    for (const std::string &Name : Many)
      recordKernelLaunch(launch(Name.c_str()));
    recordKernelLaunch(launch(Many[7].c_str()));
    stopTrace();
    auto R = TraceReader::open(Path);
    ASSERT_TRUE(bool(R)) << toString(R.takeError());
    auto Kernels = (*R)->kernels();
    ASSERT_TRUE(bool(Kernels));
    std::vector<std::string> Names;
    for (const KernelRecord &K : *Kernels)
      Names.push_back(K.Name);
    std::vector<std::string> Expected = {"_Z5firstPf", "_Z5firstPf", "_Z6secondPf",
                                         "_Z5firstPf", "_Z7literalPf"};
    Expected.insert(Expected.end(), Many.begin(), Many.end());
    Expected.push_back(Many[7]);
    EXPECT_TRUE(Names == Expected) << "trace " << Trace;
  }
  sys::fs::remove_directories(Dir);
}

// A captured op's kernels: each pointer parameter that points into a tensor
// the op was given has that tensor copied when the launch returns, so the
// trace holds the buffer as each kernel left it. Host tensors stand in for
// device buffers; the launch is synthetic.
TEST(Attribution, KernelBuffersAreSnapshottedAfterEachKernel) {
  SmallString<128> Dir;
  ASSERT_FALSE(sys::fs::createUniqueDirectory("ekka-snap", Dir));
  std::string Trace = (Dir + "/trace").str();
  ASSERT_EQ(startTrace(Trace, "gpu=synthetic test;capture=none;ops=^zoo::two_pass$;", "test"), "");
  at::Tensor Out = at::full({4, 8}, 0.0f);
  at::Tensor Other = at::full({3}, 7.0f);
  auto Ptr = [](const at::Tensor &T, size_t Offset) {
    return reinterpret_cast<uint64_t>(T.data_ptr()) + Offset;
  };
  int64_t First = 0, Second = 0, Unrelated = 0;
  {
    RECORD_FUNCTION("zoo::two_pass", std::vector<c10::IValue>{Out});
    Out.fill_(1.0f); // what the first kernel writes
    First = recordKernelLaunch(launch("_Z5firstPf"), {{0, 0x10}, {2, Ptr(Out, 0)}});
    snapshotKernelBuffers();
    Out.fill_(2.0f); // the second kernel, given a pointer inside the tensor
    Second = recordKernelLaunch(launch("_Z6secondPf"), {{1, Ptr(Out, 16)}});
    snapshotKernelBuffers();
  }
  {
    RECORD_FUNCTION("zoo::other", std::vector<c10::IValue>{Other});
    Unrelated = recordKernelLaunch(launch("_Z5otherPf"), {{0, Ptr(Other, 0)}});
    snapshotKernelBuffers(); // not a captured op: nothing copied
  }
  stopTrace();
  ASSERT_GT(First, 0);

  auto R = TraceReader::open(Trace);
  ASSERT_TRUE(bool(R)) << toString(R.takeError());
  auto Tensors = (*R)->tensors();
  ASSERT_TRUE(bool(Tensors));
  std::map<int64_t, std::vector<TensorRecord>> ByKernel;
  for (const TensorRecord &T : *Tensors)
    if (T.Owner == TensorOwner::Kernel)
      ByKernel[T.OwnerId].push_back(T);
  ASSERT_EQ(ByKernel.size(), 2u);
  ASSERT_EQ(ByKernel[First].size(), 1u);
  ASSERT_EQ(ByKernel[Second].size(), 1u);
  EXPECT_EQ(ByKernel.count(Unrelated), 0u);
  for (auto [Id, Expected, Param] : {std::tuple{First, 1.0f, 2}, std::tuple{Second, 2.0f, 1}}) {
    const TensorRecord &T = ByKernel[Id][0];
    EXPECT_EQ(T.Role, "argument");
    EXPECT_EQ(T.Index, Param);
    EXPECT_EQ(T.Shape, (TensorDims{4, 8}));
    auto Bytes = (*R)->tensorBytes(T);
    ASSERT_TRUE(bool(Bytes)) << toString(Bytes.takeError());
    ASSERT_EQ(Bytes->size(), 32 * sizeof(float));
    for (size_t I = 0; I < 32; ++I) {
      float V;
      std::memcpy(&V, Bytes->data() + I * sizeof(float), sizeof(float));
      ASSERT_EQ(V, Expected) << "kernel " << Id << " element " << I;
    }
  }
  sys::fs::remove_directories(Dir);
}

// A module call's texts are interned once per path and trace: a path that
// names another module later in the trace gets that module's texts, and the
// next trace on this thread records the path's call in full.
TEST(Attribution, AModulePathsTextsAreInternedPerTraceAndModule) {
  SmallString<128> Dir;
  ASSERT_FALSE(sys::fs::createUniqueDirectory("ekka-texts", Dir));
  std::string First = (Dir + "/first").str(), Second = (Dir + "/second").str();
  ASSERT_EQ(startTrace(First, "gpu=synthetic test;capture=none;", "test"), "");
  exitModule(enterModule("model.mlp", "MLP", "m.MLP", "m.py", 3, true, {}), {});
  exitModule(enterModule("model.mlp", "MLP", "m.MLP", "m.py", 3, true, {}), {});
  exitModule(enterModule("model.mlp", "GatedMLP", "g.GatedMLP", "g.py", 9, true, {}), {});
  stopTrace();
  ASSERT_EQ(startTrace(Second, "gpu=synthetic test;capture=none;", "test"), "");
  exitModule(enterModule("model.mlp", "MLP", "m.MLP", "m.py", 3, true, {}), {});
  stopTrace();

  auto Calls = [](const std::string &Trace) {
    std::vector<std::string> Seen;
    auto R = TraceReader::open(Trace);
    EXPECT_TRUE(bool(R)) << toString(R.takeError());
    if (!R)
      return Seen;
    auto Read = (*R)->moduleCalls();
    EXPECT_TRUE(bool(Read)) << toString(Read.takeError());
    if (!Read)
      return Seen;
    for (const ModuleCallRecord &C : *Read)
      Seen.push_back(C.Path + " " + C.ClassName + " " + C.ClassQualname + " " + C.SourceFile +
                     ":" + std::to_string(C.SourceLine));
    return Seen;
  };
  EXPECT_EQ(Calls(First), (std::vector<std::string>{"model.mlp MLP m.MLP m.py:3",
                                                    "model.mlp MLP m.MLP m.py:3",
                                                    "model.mlp GatedMLP g.GatedMLP g.py:9"}));
  EXPECT_EQ(Calls(Second), (std::vector<std::string>{"model.mlp MLP m.MLP m.py:3"}));
  sys::fs::remove_directories(Dir);
}

} // namespace
