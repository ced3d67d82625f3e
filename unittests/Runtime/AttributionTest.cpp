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

#include <ATen/record_function.h>
#include <gtest/gtest.h>

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

} // namespace
