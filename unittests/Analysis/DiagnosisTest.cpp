//===- DiagnosisTest.cpp - Error ratio, change point and dataflow rules ---===//
//
// Synthetic traces written with the Trace library: each test lays out a few
// module calls with chosen outputs and dataflow and checks who is blamed.
//
//===----------------------------------------------------------------------===//
#include "ekka/Analysis/Diagnosis.h"
#include "ekka/Trace/TraceWriter.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"

#include <gtest/gtest.h>
#include <cmath>
#include <map>

using namespace ekka;
using namespace llvm;

namespace {

/// Lays out one trace: calls in execution order, each with one output and
/// inputs that are either an earlier call's output or root data.
class TraceBuilder {
public:
  explicit TraceBuilder(std::string Dir) {
    auto W = TraceWriter::create(Dir);
    EXPECT_TRUE(bool(W));
    Writer = std::move(*W);
  }

  /// Adds call Path (child of Parent, "" for a root) with output Out, fed by
  /// the outputs of \p From (paths) or, for a root, by integer token ids.
  void call(const std::string &Path, const std::string &Parent, std::vector<float> Out,
            std::vector<std::string> From = {}, std::vector<int64_t> Tokens = {}) {
    ModuleCallRecord C;
    C.Id = Writer->nextModuleCallId();
    if (!Parent.empty() || Path != "")
      if (Calls.count(Parent) && Path != Parent)
        C.ParentId = Calls[Parent];
    C.Seq = Seq++;
    C.Step = 1;
    C.Path = Path;
    C.ClassName = "C_" + Path;
    C.ClassQualname = "m.C_" + Path;
    Writer->addModuleCall(C);
    Calls[Path] = C.Id;
    int64_t Index = 0;
    if (!Tokens.empty()) {
      TensorRecord T = record(C.Id, "input", Index++, DType::I64, int64_t(Tokens.size()));
      Writer->addTensor(T, std::string(reinterpret_cast<char *>(Tokens.data()), Tokens.size() * 8));
    }
    for (const std::string &F : From) {
      TensorRecord T = record(C.Id, "input", Index++, DType::F32, 0);
      T.SourceId = Outputs.at(F);
      Writer->addTensor(T);
    }
    TensorRecord O = record(C.Id, "output", 0, DType::F32, int64_t(Out.size()));
    Outputs[Path] = O.Id;
    Writer->addTensor(O, std::string(reinterpret_cast<char *>(Out.data()), Out.size() * 4));
  }

  void close() { EXPECT_FALSE(bool(Writer->close())); }

private:
  TensorRecord record(int64_t Call, const char *Role, int64_t Index, DType Type, int64_t N) {
    TensorRecord T;
    T.Id = Writer->nextTensorId();
    T.Owner = TensorOwner::ModuleCall;
    T.OwnerId = Call;
    T.Role = Role;
    T.Index = Index;
    T.Type = Type;
    T.Shape = {N};
    T.Device = "cpu";
    return T;
  }

  std::unique_ptr<TraceWriter> Writer;
  std::map<std::string, int64_t> Calls, Outputs;
  int64_t Seq = 0;
};

class DiagnosisTest : public ::testing::Test {
protected:
  void SetUp() override { ASSERT_FALSE(sys::fs::createUniqueDirectory("ekka-diag", Root)); }
  void TearDown() override { sys::fs::remove_directories(Root); }
  std::string dir(StringRef Name) { return (Root + "/" + Name).str(); }

  /// root -> a (from root) -> b (from a); c (from root) after a; root's
  /// output from b. \p A, \p B, \p C are the outputs.
  void mlpLike(StringRef Name, std::vector<float> A, std::vector<float> B, std::vector<float> C,
               std::vector<int64_t> Tokens = {1, 2, 3}) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, Tokens);
    T.call("a", "", A, {});
    T.call("c", "", C, {});
    T.call("b", "", B, {"a"});
    T.close();
  }

  Diagnosis run(StringRef Target, StringRef Reference, StringRef FP32 = "") {
    auto T = TraceReader::open(dir(Target));
    auto R = TraceReader::open(dir(Reference));
    EXPECT_TRUE(T && R);
    std::unique_ptr<TraceReader> F;
    if (!FP32.empty()) {
      auto X = TraceReader::open(dir(FP32));
      EXPECT_TRUE(bool(X));
      F = std::move(*X);
    }
    auto D = diagnose(**T, **R, F.get(), DiagnoseOptions());
    EXPECT_TRUE(bool(D)) << (D ? "" : toString(D.takeError()));
    return std::move(*D);
  }

  SmallString<128> Root;
};

TEST_F(DiagnosisTest, IdenticalTracesDoNotDiverge) {
  mlpLike("ref", {1, 2}, {3, 4}, {5, 6});
  Diagnosis D = run("ref", "ref");
  EXPECT_EQ(D.Result, Diagnosis::Verdict::NoDivergence);
  EXPECT_EQ(D.MaxRatio, 0);
}

TEST_F(DiagnosisTest, RoundoffLevelDifferencesAreNoise) {
  mlpLike("ref", {1, 2}, {3, 4}, {5, 6});
  float Tiny = 4 + 4 * std::ldexp(1.0f, -23); // one ulp of 4
  mlpLike("tgt", {1, 2}, {3, Tiny}, {5, 6});
  Diagnosis D = run("tgt", "ref");
  EXPECT_EQ(D.Result, Diagnosis::Verdict::NoDivergence) << D.MaxRatio;
  EXPECT_GT(D.MaxRatio, 0);
  EXPECT_LT(D.MaxRatio, 1.5);
}

TEST_F(DiagnosisTest, TheProducerIsBlamedNotItsConsumerNorABystander) {
  // a is broken; b consumes a (diverges, but its input does too); c runs
  // after a without consuming it and stays clean.
  mlpLike("ref", {1, 2}, {3, 4}, {5, 6});
  mlpLike("tgt", {1, 9}, {3, 40}, {5, 6});
  Diagnosis D = run("tgt", "ref");
  ASSERT_EQ(D.Result, Diagnosis::Verdict::Divergence);
  ASSERT_EQ(D.Suspects.size(), 1u);
  EXPECT_EQ(D.Suspects[0].Component.Path, "a");
  for (const ComponentRatio &C : D.Curve)
    if (C.Path == "b") {
      EXPECT_GT(*C.Ratio, 1.5);
      EXPECT_GT(*C.InputRatio, 1.5);
    }
}

TEST_F(DiagnosisTest, TheInnermostLocalDivergenceComesFirst) {
  auto Layout = [&](StringRef Name, std::vector<float> Inner, std::vector<float> Outer) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.call("outer", "", Outer, {});
    T.call("outer.inner", "outer", Inner, {});
    T.close();
  };
  Layout("ref", {1, 1}, {2, 2});
  Layout("tgt", {1, 5}, {2, 9});
  Diagnosis D = run("tgt", "ref");
  ASSERT_EQ(D.Result, Diagnosis::Verdict::Divergence);
  ASSERT_EQ(D.Suspects.size(), 2u);
  EXPECT_EQ(D.Suspects[0].Component.Path, "outer.inner");
  EXPECT_EQ(D.Suspects[1].Component.Path, "outer");
}

TEST_F(DiagnosisTest, DifferentTokenIdsAreInputsDiffer) {
  mlpLike("ref", {1, 2}, {3, 4}, {5, 6}, {1, 2, 3});
  mlpLike("tgt", {1, 2}, {3, 4}, {5, 6}, {2, 3});
  Diagnosis D = run("tgt", "ref");
  EXPECT_EQ(D.Result, Diagnosis::Verdict::InputsDiffer);
  EXPECT_NE(D.InputsDifference.find("first difference at flat position 0: target 2, reference 1"),
            std::string::npos)
      << D.InputsDifference;
}

TEST_F(DiagnosisTest, ANaNTheReferenceDoesNotHaveIsADivergence) {
  mlpLike("ref", {1, 2}, {3, 4}, {5, 6});
  mlpLike("tgt", {1, std::nanf("")}, {3, std::nanf("")}, {5, 6});
  Diagnosis D = run("tgt", "ref");
  ASSERT_EQ(D.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(D.Suspects[0].Component.Path, "a");
  EXPECT_TRUE(std::isinf(*D.Suspects[0].Component.Ratio));
  // The same NaN on both sides agrees.
  mlpLike("ref2", {1, std::nanf("")}, {3, 4}, {5, 6});
  EXPECT_EQ(run("ref2", "ref2").Result, Diagnosis::Verdict::NoDivergence);
}

TEST_F(DiagnosisTest, TheFP32ReferenceSetsTheScale) {
  // X_R misses Y_R by 1 (the reference's own rounding); a target that misses
  // by 1.2 is within noise, one that misses by 3 is not: R = 3.
  mlpLike("fp32", {10, 10}, {1, 1}, {1, 1});
  mlpLike("ref", {11, 10}, {1, 1}, {1, 1});
  mlpLike("ok", {11.2f, 10}, {1, 1}, {1, 1});
  mlpLike("bad", {13, 10}, {1, 1}, {1, 1});
  Diagnosis Ok = run("ok", "ref", "fp32");
  EXPECT_EQ(Ok.Result, Diagnosis::Verdict::NoDivergence) << Ok.MaxRatio;
  Diagnosis Bad = run("bad", "ref", "fp32");
  ASSERT_EQ(Bad.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(Bad.Suspects[0].Component.Path, "a");
  EXPECT_NEAR(*Bad.Suspects[0].Component.Ratio, 3.0, 1e-5);
}

} // namespace
