//===- DiagnosisTest.cpp - Error ratio, change point and dataflow rules ---===//
//
// Synthetic traces written with the Trace library: each test lays out a few
// module calls with chosen outputs and dataflow and checks who is blamed.
//
//===----------------------------------------------------------------------===//
#include "ekka/Analysis/Diagnosis.h"
#include "ekka/Analysis/ServedRequests.h"
#include "ekka/Trace/TraceWriter.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"

#include <gtest/gtest.h>
#include <cmath>
#include <cstring>
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
    ModuleCallRecord C = addCall(Path, Parent);
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

  /// Adds call Path with several outputs, each of shape \p Shape, fed by
  /// the first output of each call in \p From.
  void callOutputs(const std::string &Path, const std::string &Parent,
                   std::vector<std::vector<float>> Outs, TensorDims Shape,
                   std::vector<std::string> From = {}) {
    ModuleCallRecord C = addCall(Path, Parent);
    int64_t Index = 0;
    for (const std::string &F : From) {
      TensorRecord T = record(C.Id, "input", Index++, DType::F32, 0);
      T.SourceId = Outputs.at(F);
      Writer->addTensor(T);
    }
    for (size_t I = 0; I < Outs.size(); ++I) {
      TensorRecord O = record(C.Id, "output", int64_t(I), DType::F32, 0);
      O.Shape = Shape;
      if (I == 0)
        Outputs[Path] = O.Id;
      Writer->addTensor(O, std::string(reinterpret_cast<char *>(Outs[I].data()),
                                       Outs[I].size() * 4));
    }
  }

  /// A tensor of a call: floats stored as \p Type (F32, BF16 by
  /// truncation, or I64), or the output of call \p From when it is set.
  struct Spec {
    std::vector<float> Values;
    TensorDims Shape;
    DType Type = DType::F32;
    std::string From;
    TensorDims Strides; ///< As recorded (a view's); empty: none
  };

  /// Adds call Path with the given inputs and outputs.
  void callSpecs(const std::string &Path, const std::string &Parent, std::vector<Spec> Inputs,
                 std::vector<Spec> Outs) {
    ModuleCallRecord C = addCall(Path, Parent);
    auto Add = [&](const Spec &X, const char *Role, int64_t Index) {
      TensorRecord T = record(C.Id, Role, Index, X.Type, 0);
      T.Shape = X.Shape;
      T.Strides = X.Strides;
      if (!X.From.empty()) {
        T.SourceId = Outputs.at(X.From);
        Writer->addTensor(T);
        return T.Id;
      }
      std::string Bytes;
      for (float V : X.Values) {
        uint32_t U;
        std::memcpy(&U, &V, 4);
        if (X.Type == DType::I64) {
          int64_t I = int64_t(V);
          Bytes.append(reinterpret_cast<char *>(&I), 8);
        } else if (X.Type == DType::BF16) {
          uint16_t H = uint16_t(U >> 16);
          Bytes.append(reinterpret_cast<char *>(&H), 2);
        } else {
          Bytes.append(reinterpret_cast<char *>(&U), 4);
        }
      }
      Writer->addTensor(T, Bytes);
      return T.Id;
    };
    for (size_t I = 0; I < Inputs.size(); ++I)
      Add(Inputs[I], "input", int64_t(I));
    for (size_t I = 0; I < Outs.size(); ++I) {
      int64_t Id = Add(Outs[I], "output", int64_t(I));
      if (I == 0)
        Outputs[Path] = Id;
    }
  }

  /// Adds op \p Name under call \p Path with several captured tensors:
  /// (role, values, shape, dtype F32 or I64), numbered by role in order.
  struct OpTensor {
    const char *Role;
    std::vector<float> Values;
    TensorDims Shape;
    DType Type = DType::F32;
  };
  /// Adds op \p Name under call \p Path (already added), with one
  /// captured tensor of role \p Role (`output` or `mutated`); its id.
  int64_t op(const std::string &Path, const std::string &Name, const char *Role,
             std::vector<float> Values, TensorDims Shape) {
    return opTensors(Path, Name, {OpTensor{Role, std::move(Values), std::move(Shape)}});
  }

  int64_t opTensors(const std::string &Path, const std::string &Name,
                    std::vector<OpTensor> Tensors) {
    OpRecord O;
    O.Id = Writer->nextOpId();
    O.ModuleCallId = Calls.at(Path);
    O.Seq = OpSeq++;
    O.Name = Name;
    Writer->addOp(O);
    std::map<std::string, int64_t> Next;
    for (const OpTensor &X : Tensors) {
      TensorRecord T = record(O.Id, X.Role, Next[X.Role]++, X.Type, 0);
      T.Owner = TensorOwner::Op;
      T.Shape = X.Shape;
      std::string Bytes;
      for (float V : X.Values) {
        if (X.Type == DType::I64) {
          int64_t I = int64_t(V);
          Bytes.append(reinterpret_cast<char *>(&I), 8);
        } else {
          Bytes.append(reinterpret_cast<char *>(&V), 4);
        }
      }
      Writer->addTensor(T, Bytes);
    }
    return O.Id;
  }

  /// Adds GPU kernel \p Name launched by op \p Op of call \p Path, with
  /// the snapshot of the buffer its parameter \p Param pointed into (one
  /// the op writes, `mutated`, or reads, `argument`).
  int64_t kernel(int64_t Op, const std::string &Path, const std::string &Name, int64_t Param,
                 std::vector<float> Buffer, const char *Role = "mutated") {
    KernelRecord K;
    K.Id = Writer->nextKernelId();
    K.OpId = Op;
    K.ModuleCallId = Calls.at(Path);
    K.Seq = KernelSeq++;
    K.Name = Name;
    Writer->addKernel(K);
    snapshot(K.Id, Param, std::move(Buffer), Role);
    return K.Id;
  }

  /// Another buffer snapshot of kernel \p Kernel.
  void snapshot(int64_t Kernel, int64_t Param, std::vector<float> Buffer,
                const char *Role = "mutated") {
    TensorRecord T = record(Kernel, Role, Param, DType::F32, int64_t(Buffer.size()));
    T.Owner = TensorOwner::Kernel;
    Writer->addTensor(T, std::string(reinterpret_cast<char *>(Buffer.data()), Buffer.size() * 4));
  }

  void close() { EXPECT_FALSE(bool(Writer->close())); }

  /// The forward step the calls added next belong to.
  int64_t Step = 1;
  /// Calls' classes, by path (vLLM's, qualified under vllm.); `C_<path>`
  /// for the others.
  std::map<std::string, std::string> ClassOf;

private:
  ModuleCallRecord addCall(const std::string &Path, const std::string &Parent) {
    ModuleCallRecord C;
    C.Id = Writer->nextModuleCallId();
    if (Calls.count(Parent) && Path != Parent)
      C.ParentId = Calls[Parent];
    C.Seq = Seq++;
    C.Step = Step;
    C.Path = Path;
    C.ClassName = "C_" + Path;
    C.ClassQualname = "m.C_" + Path;
    if (auto It = ClassOf.find(Path); It != ClassOf.end()) {
      C.ClassName = It->second;
      C.ClassQualname = "vllm.model_executor.layers." + It->second;
    }
    Writer->addModuleCall(C);
    Calls[Path] = C.Id;
    return C;
  }

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
  int64_t Seq = 0, OpSeq = 0, KernelSeq = 0;
};

class DiagnosisTest : public ::testing::Test {
protected:
  void SetUp() override { ASSERT_FALSE(sys::fs::createUniqueDirectory("ekka-diag", Root)); }
  void TearDown() override { sys::fs::remove_directories(Root); }
  std::string dir(StringRef Name) { return (Root + "/" + Name).str(); }
  std::unique_ptr<TraceReader> open(StringRef Name) {
    auto R = TraceReader::open(dir(Name));
    EXPECT_TRUE(bool(R));
    return R ? std::move(*R) : nullptr;
  }

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

  Diagnosis run(StringRef Target, StringRef Reference, StringRef FP32 = "",
                const DiagnoseOptions &Options = DiagnoseOptions()) {
    auto T = TraceReader::open(dir(Target));
    auto R = TraceReader::open(dir(Reference));
    EXPECT_TRUE(T && R);
    std::unique_ptr<TraceReader> F;
    if (!FP32.empty()) {
      auto X = TraceReader::open(dir(FP32));
      EXPECT_TRUE(bool(X));
      F = std::move(*X);
    }
    auto D = diagnose(**T, **R, F.get(), Options);
    EXPECT_TRUE(bool(D)) << (D ? "" : toString(D.takeError()));
    return std::move(*D);
  }

  /// Target \p Good agrees exactly with \p Reference in every call, and
  /// \p Bad is blamed at \p Path.
  void expectAlignedAndBlamed(StringRef Good, StringRef Bad, StringRef Reference,
                              StringRef Path) {
    Diagnosis D = run(Good, Reference);
    EXPECT_EQ(D.Result, Diagnosis::Verdict::NoDivergence);
    EXPECT_EQ(D.Uncompared, 0u);
    EXPECT_EQ(D.MaxRatio, 0);
    Diagnosis B = run(Bad, Reference);
    ASSERT_EQ(B.Result, Diagnosis::Verdict::Divergence);
    EXPECT_EQ(B.Suspects.front().Component.Path, Path);
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
  EXPECT_NE(D.InputsDifference.find("first difference at position 0: target 2, reference 1"),
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
  // The reason says what the infinite ratio stands for.
  EXPECT_NE(D.Suspects[0].Reason.find(
                "R = inf: its outputs hold 1 NaN and 0 Inf values, the reference's 0 and 0"),
            std::string::npos)
      << D.Suspects[0].Reason;
  // The same NaN on both sides agrees.
  mlpLike("ref2", {1, std::nanf("")}, {3, 4}, {5, 6});
  EXPECT_EQ(run("ref2", "ref2").Result, Diagnosis::Verdict::NoDivergence);
}

/// \p Head followed by 98 values of 10: an output of 100 values, enough
/// that the threshold is not raised for few values.
std::vector<float> wide(std::vector<float> Head) {
  Head.resize(Head.size() + 98, 10.0f);
  return Head;
}

// An R of few values is a noisy one: an output of two values departs only
// above exp(3.09 / sqrt(2)) = 8.89, and one within that is said, not blamed.
TEST_F(DiagnosisTest, AnOutputOfFewValuesIsHeldToAWiderThreshold) {
  mlpLike("fp32", {10, 10}, {1, 1}, {1, 1});
  mlpLike("ref", {11, 10}, {1, 1}, {1, 1});
  mlpLike("three", {13, 10}, {1, 1}, {1, 1});
  mlpLike("twenty", {30, 10}, {1, 1}, {1, 1});
  Diagnosis D = run("three", "ref", "fp32");
  EXPECT_EQ(D.Result, Diagnosis::Verdict::NoDivergence);
  ASSERT_EQ(D.FewValues.size(), 1u);
  EXPECT_EQ(D.FewValues[0], "a: R = 3 of 2 values, within the 8.89 that so few allow");
  Diagnosis B = run("twenty", "ref", "fp32");
  ASSERT_EQ(B.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(B.Suspects[0].Component.Path, "a");
  EXPECT_EQ(B.Suspects[0].Component.ComparedValues, 2);
}

// A rule's "noise" (an attention backend's, noisier than the reference's
// one kernel by design) holds the call to that many times the threshold,
// and the block around it too; the calls after it, given its output or
// what was made of it, are not blamed for passing that noise on. A bug
// inside still departs.
TEST_F(DiagnosisTest, ARulesNoiseHoldsTheCallAndTheBlockAroundItToAWiderThreshold) {
  // The block's output is its projection's unless Own says otherwise.
  auto Block = [&](StringRef Name, float Attn, float Out, std::optional<float> Own = {}) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2, 3});
    T.call("blk", "", wide({Own.value_or(Out), 10}), {});
    T.call("blk.attn", "blk", wide({Attn, 10}), {});
    T.call("blk.o", "blk", wide({Out, 10}), {"blk.attn"});
    T.call("blk.norm", "blk", wide({Out - 0.05f, 10}), {"blk.o"});
    T.close();
  };
  Block("fp32", 10, 10);
  Block("ref", 11, 11);
  Block("noisy", 12.8f, 12.7f); // R = 2.8, and 2.7 after it
  Block("broken", 20, 19);      // R = 10
  Block("after", 12.8f, 14.5f); // a bug after it: R = 4.5 where it was given 2.8
  Block("blockbug", 11, 11, 12.9f); // the block departs (2.9) where nothing inside does
  DiagnoseOptions O;
  MappingRule Rule;
  Rule.Target = "blk.attn";
  Rule.Reference = {"blk.attn"};
  Rule.Noise = 2;
  O.Mapping = {Rule};
  // Without the rule's noise, the backend is blamed.
  Diagnosis Plain = run("noisy", "ref", "fp32");
  ASSERT_EQ(Plain.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(Plain.Suspects[0].Component.Path, "blk.attn");
  Diagnosis D = run("noisy", "ref", "fp32", O);
  EXPECT_EQ(D.Result, Diagnosis::Verdict::NoDivergence);
  EXPECT_TRUE(D.Suspects.empty());
  ASSERT_EQ(D.NoisierByDesign.size(), 2u);
  EXPECT_EQ(D.NoisierByDesign[0],
            "blk: R = 2.7, within the 3 allowed a computation noisier than the reference's "
            "by design (inside it: blk.attn at R = 2.8, mapping file, noise 2)");
  EXPECT_EQ(D.NoisierByDesign[1],
            "blk.attn: R = 2.8, within the 3 allowed a computation noisier than the "
            "reference's by design (mapping file, noise 2)");
  EXPECT_EQ(thresholdOf(D.Curve[2], D), 3.0);
  EXPECT_EQ(thresholdOf(D.Curve[3], D), 1.5); // held to the input it was given
  EXPECT_EQ(thresholdOf(D.Curve[4], D), 1.5);
  EXPECT_FALSE(D.Curve[0].RuleNoise); // only the call directly around it
  // What the backend's noise reaches, directly or passed on, is an input
  // within noise (a report names no call as given what departs).
  EXPECT_TRUE(D.Curve[3].InputNoiseByDesign);
  EXPECT_TRUE(D.Curve[4].InputNoiseByDesign);
  EXPECT_FALSE(Plain.Curve[3].InputNoiseByDesign);
  // The block is allowed only what its backend's R explains.
  Diagnosis BlockBug = run("blockbug", "ref", "fp32", O);
  ASSERT_EQ(BlockBug.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(BlockBug.Suspects[0].Component.Path, "blk");
  Diagnosis After = run("after", "ref", "fp32", O);
  ASSERT_EQ(After.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(After.Suspects[0].Component.Path, "blk.o");
  EXPECT_NEAR(*After.Suspects[0].Component.Ratio, 4.5, 1e-5);
  EXPECT_TRUE(After.Curve[3].InputNoiseByDesign);
  EXPECT_FALSE(After.Curve[4].InputNoiseByDesign); // given blk.o's departure
  Diagnosis B = run("broken", "ref", "fp32", O);
  ASSERT_EQ(B.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(B.Suspects[0].Component.Path, "blk.attn");
  EXPECT_NEAR(*B.Suspects[0].Component.Ratio, 10.0, 1e-5);
}

TEST_F(DiagnosisTest, TheFP32ReferenceSetsTheScale) {
  // X_R misses Y_R by 1 (the reference's own rounding); a target that misses
  // by 1.2 is within noise, one that misses by 3 is not: R = 3.
  mlpLike("fp32", wide({10, 10}), {1, 1}, {1, 1});
  mlpLike("ref", wide({11, 10}), {1, 1}, {1, 1});
  mlpLike("ok", wide({11.2f, 10}), {1, 1}, {1, 1});
  mlpLike("bad", wide({13, 10}), {1, 1}, {1, 1});
  Diagnosis Ok = run("ok", "ref", "fp32");
  EXPECT_EQ(Ok.Result, Diagnosis::Verdict::NoDivergence) << Ok.MaxRatio;
  Diagnosis Bad = run("bad", "ref", "fp32");
  ASSERT_EQ(Bad.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(Bad.Suspects[0].Component.Path, "a");
  EXPECT_NEAR(*Bad.Suspects[0].Component.Ratio, 3.0, 1e-5);
}

// A calibration's noise holds each component to its own: a known-good
// pair where `a` misses the FP32 answer as the reference does (R = 1) lets
// a later R = 1.35, below the threshold, show; one where `a` is noisier
// (R = 1.4) keeps a later R = 1.6 from being taken for a bug.
TEST_F(DiagnosisTest, ACalibratedNoiseHoldsAComponentToItsOwn) {
  mlpLike("fp32", wide({10, 10}), {1, 1}, {1, 1});
  mlpLike("ref", wide({11, 10}), {1, 1}, {1, 1});
  mlpLike("good", wide({11, 10}), {1, 1}, {1, 1});
  mlpLike("modest", wide({11.35f, 10}), {1, 1}, {1, 1});
  Diagnosis Good = run("good", "ref", "fp32");
  ASSERT_EQ(Good.Result, Diagnosis::Verdict::NoDivergence);
  DiagnoseOptions Calibrated;
  Calibrated.CalibratedNoise = calibratedNoise(Good);
  EXPECT_NEAR(Calibrated.CalibratedNoise["a"], 1.0, 1e-5);
  EXPECT_EQ(run("modest", "ref", "fp32").Result, Diagnosis::Verdict::NoDivergence);
  Diagnosis Modest = run("modest", "ref", "fp32", Calibrated);
  ASSERT_EQ(Modest.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(Modest.Suspects[0].Component.Path, "a");
  EXPECT_NEAR(*Modest.Suspects[0].Component.Threshold, 1.25, 1e-9);
  EXPECT_NE(Modest.Suspects[0].Reason.find("above its calibrated noise: 1 on the known-good "
                                           "pair, threshold 1.25"),
            std::string::npos)
      << Modest.Suspects[0].Reason;
  // Below the floor, however quiet the component was.
  mlpLike("slight", wide({11.15f, 10}), {1, 1}, {1, 1});
  EXPECT_EQ(run("slight", "ref", "fp32", Calibrated).Result, Diagnosis::Verdict::NoDivergence);

  mlpLike("noisy", wide({11.4f, 10}), {1, 1}, {1, 1});
  mlpLike("noisier", wide({11.6f, 10}), {1, 1}, {1, 1});
  DiagnoseOptions Noisy;
  Noisy.CalibratedNoise = calibratedNoise(run("noisy", "ref", "fp32"));
  EXPECT_EQ(run("noisier", "ref", "fp32").Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(run("noisier", "ref", "fp32", Noisy).Result, Diagnosis::Verdict::NoDivergence);
}

// A suspect whose output is its counterpart's under one simple relation
// says which: a scale, all zeros, its rows reordered; none where none holds.
TEST_F(DiagnosisTest, ASuspectsOutputIsRelatedToItsCounterpartsWhereOneRelationHolds) {
  auto Pooled = [&](StringRef Name, std::vector<float> Rows) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2, 3});
    T.callOutputs("pool", "", {Rows}, {3, 2});
    T.close();
  };
  Pooled("ref", {1, 2, 3, 4, 5, 6});
  Pooled("scaled", {2, 4, 6, 8, 10, 12});
  Pooled("zeros", {0, 0, 0, 0, 0, 0});
  Pooled("reversed", {5, 6, 3, 4, 1, 2});
  Pooled("other", {1, 2, 3, 4, 5, 9});
  auto Relation = [&](StringRef Target) {
    Diagnosis D = run(Target, "ref");
    EXPECT_EQ(D.Result, Diagnosis::Verdict::Divergence) << Target.str();
    return D.Suspects.empty() ? std::string("?") : D.Suspects[0].Relation;
  };
  EXPECT_EQ(Relation("scaled"), "the reference's times 2");
  EXPECT_EQ(Relation("zeros"), "all zeros");
  EXPECT_EQ(Relation("reversed"),
            "the reference's rows in another order (its row 0 is the reference's row 2)");
  EXPECT_EQ(Relation("other"), "");
}

// A fused add+norm layer returns (output, residual) where the reference's
// layer returns their sum: compared as the sum, no divergence; a layer whose
// sum is off is blamed.
TEST_F(DiagnosisTest, AResidualPairIsComparedAsItsSum) {
  auto Reference = [&](StringRef Name) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.callOutputs("layer", "", {{4, 6}}, {2});
    T.close();
  };
  auto Target = [&](StringRef Name, float Second) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.callOutputs("layer", "", {{1, 2}, {3, Second}}, {2});
    T.close();
  };
  Reference("ref");
  Target("ok", 4);
  Target("bad", 9);
  Diagnosis Ok = run("ok", "ref");
  EXPECT_EQ(Ok.Result, Diagnosis::Verdict::NoDivergence) << Ok.MaxRatio;
  for (const ComponentRatio &C : Ok.Curve)
    if (C.Path == "layer")
      EXPECT_TRUE(C.ResidualPair);
  Diagnosis Bad = run("bad", "ref");
  ASSERT_EQ(Bad.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(Bad.Suspects[0].Component.Path, "layer");
}

// A fused add+norm takes (hidden, residual) and returns (output, their sum)
// where the reference norm takes the sum and returns the output alone: the
// residual it returns is compared with the reference's input, so a norm
// that returns a stale residual (the sum not stored) is blamed, though its
// output is right.
TEST_F(DiagnosisTest, AFusedNormsResidualIsComparedWithTheReferencesInput) {
  std::vector<float> Hidden = {1, 2, 3, 4}, Residual = {0.5, -1, 2, 1}, Sum = {1.5, 1, 5, 5},
                     Out = {0.25, 0.5, -0.75, 1};
  {
    TraceBuilder T(dir("ref"));
    T.call("", "", {0}, {}, {1, 2});
    T.callSpecs("norm", "", {{Sum, {4}}}, {{Out, {4}}});
    T.close();
  }
  auto Target = [&](StringRef Name, std::vector<float> Returned) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.callSpecs("norm", "", {{Hidden, {4}}, {Residual, {4}}}, {{Out, {4}}, {Returned, {4}}});
    T.close();
  };
  Target("ok", Sum);
  Target("stale", Residual);
  Diagnosis Ok = run("ok", "ref");
  EXPECT_EQ(Ok.Result, Diagnosis::Verdict::NoDivergence) << Ok.MaxRatio;
  Diagnosis Stale = run("stale", "ref");
  ASSERT_EQ(Stale.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(Stale.Suspects[0].Component.Path, "norm");
}

// A module the target skipped (a final norm never called) has no call to
// depart: the model around it is blamed, and the report names the
// reference call inside its counterpart that nothing in the target matches.
TEST_F(DiagnosisTest, ASkippedModuleIsNamedInItsParentsCounterpart) {
  {
    TraceBuilder T(dir("ref"));
    T.call("", "", {0}, {}, {1, 2});
    T.call("model", "", {2, 4}, {""});
    T.call("model.layer", "model", {1, 2}, {""});
    T.call("model.rot", "model", {1}, {""}); // twice, named once
    T.call("model.rot", "model", {1}, {""});
    T.call("model.moved", "model", {1}, {""}); // the target calls it elsewhere
    T.call("model.norm", "model", {2, 4}, {"model.layer"});
    T.close();
  }
  {
    TraceBuilder T(dir("skipped"));
    T.call("", "", {0}, {}, {1, 2});
    T.call("model", "", {1, 2}, {""});
    T.call("model.layer", "model", {1, 2}, {""});
    T.call("model.layer.moved", "model.layer", {1}, {""});
    T.close();
  }
  Diagnosis D = run("skipped", "ref");
  ASSERT_EQ(D.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(D.Suspects[0].Component.Path, "model");
  EXPECT_EQ(D.Suspects[0].UnmatchedReference,
            (std::vector<std::string>{"model.rot (C_model.rot) x2", "model.norm (C_model.norm)"}));
}

// vLLM's act_fn (SiluAndMul) takes gate and up together: the same path as
// HF's act_fn, another computation. Its features differ, so it is not
// paired (and not blamed for the difference that makes).
TEST_F(DiagnosisTest, TheSameNameForAnotherComputationIsNotPaired) {
  {
    TraceBuilder T(dir("ref"));
    T.call("", "", {0}, {}, {1, 2});
    T.callOutputs("mlp.act_fn", "", {{1, 2, 3, 4}}, {1, 4});
    T.close();
  }
  {
    TraceBuilder T(dir("tgt"));
    T.call("", "", {0}, {}, {1, 2});
    T.callOutputs("mlp.act_fn", "", {{5, 6}}, {1, 2});
    T.close();
  }
  Diagnosis D = run("tgt", "ref");
  EXPECT_EQ(D.Result, Diagnosis::Verdict::NoDivergence);
  for (const ComponentRatio &C : D.Curve)
    if (C.Path == "mlp.act_fn") {
      EXPECT_FALSE(C.Mapped);
      EXPECT_NE(C.UnmappedReason.find("different computation"), std::string::npos);
    }
}

// The built-in recipes map a fused projection onto the reference's
// separate ones, concatenated: right when the parts agree, blamed when one
// part is off.
TEST_F(DiagnosisTest, RecipesMapFusedProjections) {
  ASSERT_FALSE(builtinRecipes().empty());
  {
    TraceBuilder T(dir("ref"));
    T.call("", "", {0}, {}, {1, 2});
    T.callOutputs("model.layers.0.mlp.gate_proj", "", {{1, 2}}, {1, 2});
    T.callOutputs("model.layers.0.mlp.up_proj", "", {{3, 4}}, {1, 2});
    T.close();
  }
  auto Target = [&](StringRef Name, float Up) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.callOutputs("model.layers.0.mlp.gate_up_proj", "", {{1, 2, 3, Up}}, {1, 4});
    T.close();
  };
  Target("ok", 4);
  Target("bad", 40);
  Diagnosis Ok = run("ok", "ref");
  EXPECT_EQ(Ok.Result, Diagnosis::Verdict::NoDivergence);
  for (const ComponentRatio &C : Ok.Curve)
    if (C.Path == "model.layers.0.mlp.gate_up_proj") {
      EXPECT_TRUE(C.Mapped);
      EXPECT_EQ(C.MappedBy, "recipe vllm-hf 3: name gate_up_proj");
      EXPECT_EQ(C.ReferencePaths.size(), 2u);
    }
  Diagnosis Bad = run("bad", "ref");
  ASSERT_EQ(Bad.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(Bad.Suspects[0].Component.Path, "model.layers.0.mlp.gate_up_proj");
}

// The recipes about vLLM's classes hold wherever a model puts the layer,
// under any names: each one's reference is found relative to the call (its
// parent's projections, the next call's input). Paths
// no name rule knows: without the class rules nothing here is compared.
TEST_F(DiagnosisTest, RecipesFollowVllmClassesWhereverTheyStand) {
  using Spec = TraceBuilder::Spec;
  auto Layout = [&](StringRef Name, bool Target, float Act) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.call("blocks.0.attention", "", {9});
    if (Target) {
      T.ClassOf = {{"blocks.0.attention.fused", "QKVParallelLinear"},
                   {"blocks.0.attention.backend", "Attention"},
                   {"blocks.0.ffn.merged", "MergedColumnParallelLinear"},
                   {"blocks.0.ffn.act", "SiluAndMul"}};
      T.callSpecs("blocks.0.attention.fused", "blocks.0.attention", {}, {{{1, 2, 3, 4}, {1, 4}}});
      T.callSpecs("blocks.0.attention.backend", "blocks.0.attention",
                  {{{}, {1, 4}, DType::F32, "blocks.0.attention.fused"}}, {{{5, 6}, {1, 2}}});
    } else {
      T.callSpecs("blocks.0.attention.q_proj", "blocks.0.attention", {}, {{{1, 2}, {1, 2}}});
      T.callSpecs("blocks.0.attention.k_proj", "blocks.0.attention", {}, {{{3}, {1, 1}}});
      T.callSpecs("blocks.0.attention.v_proj", "blocks.0.attention", {}, {{{4}, {1, 1}}});
      T.callSpecs("attn_out", "blocks.0.attention", {}, {{{5, 6}, {1, 2}}});
    }
    T.callSpecs("blocks.0.attention.dense", "blocks.0.attention",
                {{{}, {1, 2}, DType::F32, Target ? "blocks.0.attention.backend" : "attn_out"}},
                {{{7, 8}, {1, 2}}});
    T.call("blocks.0.ffn", "", {9});
    if (Target) {
      T.callSpecs("blocks.0.ffn.merged", "blocks.0.ffn", {}, {{{1, 2, 3, 4}, {1, 4}}});
      T.callSpecs("blocks.0.ffn.act", "blocks.0.ffn",
                  {{{}, {1, 4}, DType::F32, "blocks.0.ffn.merged"}}, {{{Act, 6}, {1, 2}}});
    } else {
      T.callSpecs("blocks.0.ffn.gate_proj", "blocks.0.ffn", {}, {{{1, 2}, {1, 2}}});
      T.callSpecs("blocks.0.ffn.up_proj", "blocks.0.ffn", {}, {{{3, 4}, {1, 2}}});
      // HF's act_fn: the gate's activation alone, not what w2 is given.
      T.callSpecs("blocks.0.ffn.act", "blocks.0.ffn",
                  {{{}, {1, 2}, DType::F32, "blocks.0.ffn.gate_proj"}}, {{{1, 1}, {1, 2}}});
      T.callSpecs("product", "blocks.0.ffn", {}, {{{5, 6}, {1, 2}}});
    }
    T.callSpecs("blocks.0.ffn.w2", "blocks.0.ffn",
                {{{}, {1, 2}, DType::F32, Target ? "blocks.0.ffn.act" : "product"}},
                {{{7, 8}, {1, 2}}});
    T.close();
  };
  Layout("ref", false, 0);
  Layout("tgt", true, 5);
  Layout("bad", true, 50);
  std::map<std::string, std::pair<std::string, std::vector<std::string>>> Expected = {
      {"blocks.0.attention.fused",
       {"QKVParallelLinear",
        {"blocks.0.attention.q_proj", "blocks.0.attention.k_proj", "blocks.0.attention.v_proj"}}},
      {"blocks.0.attention.backend", {"Attention", {"blocks.0.attention.dense:input"}}},
      {"blocks.0.ffn.merged",
       {"MergedColumnParallelLinear", {"blocks.0.ffn.gate_proj", "blocks.0.ffn.up_proj"}}},
      {"blocks.0.ffn.act", {"SiluAndMul", {"blocks.0.ffn.w2:input"}}}};
  Diagnosis D = run("tgt", "ref");
  EXPECT_EQ(D.Result, Diagnosis::Verdict::NoDivergence);
  size_t Seen = 0;
  for (const ComponentRatio &C : D.Curve) {
    auto It = Expected.find(C.Path);
    if (It == Expected.end())
      continue;
    ++Seen;
    EXPECT_TRUE(C.Mapped) << C.Path << ": " << C.UnmappedReason;
    EXPECT_EQ(C.MappedBy, "recipe vllm-hf 3: class " + It->second.first) << C.Path;
    EXPECT_EQ(C.ReferencePaths, It->second.second) << C.Path;
    EXPECT_TRUE(C.Ratio) << C.Path;
  }
  EXPECT_EQ(Seen, Expected.size());
  Diagnosis B = run("bad", "ref");
  ASSERT_EQ(B.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(B.Suspects[0].Component.Path, "blocks.0.ffn.act");
}

// A router computed in bf16 where the reference keeps it in fp32: its
// logits are within noise, the experts it drives are not, and the experts'
// second input (logits here, routing weights in the reference) cannot be
// compared. The lower-precision producer of that input comes first.
TEST_F(DiagnosisTest, ALowerPrecisionProducerOfAnUncomparedInputComesFirst) {
  using Spec = TraceBuilder::Spec;
  auto Layout = [&](StringRef Name, DType GateType, std::vector<float> Experts, bool Target) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.callSpecs("h", "", {}, {{{1, 2}, {2}}});
    T.callSpecs("mlp.gate", "", {{{}, {2}, DType::F32, "h"}}, {{{0.5f, 0.25f}, {2}, GateType}});
    Spec Second = Target ? Spec{{}, {2}, GateType, "mlp.gate"} : Spec{{0.7f, 0.3f, 0.1f}, {3}};
    T.callSpecs("mlp.experts", "", {{{}, {2}, DType::F32, "h"}, Second}, {{Experts, {2}}});
    T.close();
  };
  Layout("ref", DType::F32, {3, 4}, false);
  Layout("tgt", DType::BF16, {3, 9}, true);
  Diagnosis D = run("tgt", "ref");
  ASSERT_EQ(D.Result, Diagnosis::Verdict::Divergence);
  ASSERT_GE(D.Suspects.size(), 2u);
  EXPECT_EQ(D.Suspects[0].Component.Path, "mlp.gate");
  EXPECT_NE(D.Suspects[0].Reason.find("BF16 where the reference's is F32"), std::string::npos)
      << D.Suspects[0].Reason;
  EXPECT_EQ(D.Suspects[1].Component.Path, "mlp.experts");
  // The same router at the reference's precision is not blamed.
  Layout("same", DType::F32, {3, 9}, true);
  Diagnosis Same = run("same", "ref");
  ASSERT_FALSE(Same.Suspects.empty());
  EXPECT_EQ(Same.Suspects[0].Component.Path, "mlp.experts");
}

// A candidate whose output departs only a little more than its inputs
// already did passed a divergence on; it is not a local divergence.
TEST_F(DiagnosisTest, PassingADivergenceOnIsNoLocalDivergence) {
  // R measured against the FP32 reference: a's output (b's input) is at
  // R = 1.4, b's output at R = 1.6 (over the threshold, not over 1.5 × 1.4).
  auto Layout = [&](StringRef Name, float A, float B) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.call("a", "", {A, 10});
    T.call("b", "", {B, 10}, {"a"});
    T.call("c", "", {A == 10 ? 10.f : (A == 11 ? 11.f : 30.f), 10});
    T.close();
  };
  Layout("fp32", 10, 10);
  Layout("ref", 11, 11);
  Layout("tgt", 11.4f, 11.6f);
  Diagnosis D = run("tgt", "ref", "fp32");
  for (const Suspect &S : D.Suspects)
    EXPECT_NE(S.Component.Path, "b") << S.Reason;
  for (const ComponentRatio &C : D.Curve)
    if (C.Path == "b") {
      EXPECT_GT(*C.Ratio, 1.5);
      EXPECT_LT(*C.InputRatio, 1.5);
    }
}

// A mapped child whose inputs could not be compared was given them by an
// op its parent ran in place (an engine's fused q/k norm + rope, called by
// the attention block itself). When the reference's op statistics find
// what the op wrote nowhere in the parent's counterpart, the parent comes
// first, with that op; when they find it, the child does.
TEST_F(DiagnosisTest, AnOpThatWroteAChildsInputInPlaceIsCheckedByStatistics) {
  std::vector<float> Q = {1, -2, 3, 0.5};
  auto Reference = [&](StringRef Name) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.callSpecs("attn", "", {{{1, 2, 3, 4}, {4}}}, {{{4, 3, 2, 1}, {4}}});
    T.op("attn", "aten::mul", "output", Q, {4});
    T.callSpecs("attn.core", "attn", {}, {{{4, 3, 2, 1}, {4}}});
    T.close();
  };
  auto Target = [&](StringRef Name, std::vector<float> Written,
                    const std::string &Op = "zoo::fused") {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.callSpecs("attn", "", {{{1, 2, 3, 4}, {4}}}, {{{40, 3, 2, 1}, {4}}});
    T.op("attn", Op, "mutated", Written, {4});
    T.callSpecs("attn.core", "attn", {{Written, {4}}}, {{{40, 3, 2, 1}, {4}}});
    T.close();
  };
  Reference("ref");
  Target("wrote-else", {1, -2, 30, 0.5});
  Target("wrote-same", Q);
  Diagnosis Else = run("wrote-else", "ref");
  ASSERT_EQ(Else.Result, Diagnosis::Verdict::Divergence);
  ASSERT_GE(Else.Suspects.size(), 2u);
  EXPECT_EQ(Else.Suspects[0].Component.Path, "attn");
  ASSERT_TRUE(Else.Suspects[0].Op.has_value());
  EXPECT_EQ(Else.Suspects[0].Op->Name, "zoo::fused");
  EXPECT_EQ(Else.Suspects[1].Component.Path, "attn.core");
  Diagnosis Same = run("wrote-same", "ref");
  ASSERT_EQ(Same.Result, Diagnosis::Verdict::Divergence);
  ASSERT_FALSE(Same.Suspects.empty());
  EXPECT_EQ(Same.Suspects[0].Component.Path, "attn.core");
  // A PyTorch op (q scaled in place before the backend, where the reference
  // scales inside its attention) is no kernel standing for reference ops.
  Target("aten-wrote-else", {1, -2, 30, 0.5}, "aten::mul_");
  Diagnosis Aten = run("aten-wrote-else", "ref");
  ASSERT_EQ(Aten.Result, Diagnosis::Verdict::Divergence);
  ASSERT_FALSE(Aten.Suspects.empty());
  EXPECT_EQ(Aten.Suspects[0].Component.Path, "attn.core");
}

// Inside a suspect whose core has no reference counterpart (an engine's
// attention), the op that last wrote what the next mapped child was given
// is named; it ran in an unmapped child, so the suspect stays first.
TEST_F(DiagnosisTest, TheLastWriterOfADepartingChildInputIsNamed) {
  using Spec = TraceBuilder::Spec;
  auto Layout = [&](StringRef Name, bool Target, std::vector<float> Core) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.callSpecs("attn", "", {{{1, 2}, {2}}}, {{{Core[0] * 2, Core[1] * 2}, {2}}});
    T.callSpecs("attn.qkv", "attn", {{{1, 2}, {2}}}, {{{3, 4}, {2}}});
    if (Target) {
      T.callSpecs("attn.core", "attn", {}, {});
      T.op("attn.core", "zoo::core", "mutated", Core, {2});
    }
    T.callSpecs("attn.o_proj", "attn", {{Core, {2}}}, {{{Core[0] * 2, Core[1] * 2}, {2}}});
    T.op("attn.o_proj", "aten::linear", "output", {Core[0] * 2, Core[1] * 2}, {2});
    T.close();
  };
  Layout("ref", false, {5, 6});
  Layout("tgt", true, {5, 60});
  Diagnosis D = run("tgt", "ref");
  ASSERT_EQ(D.Result, Diagnosis::Verdict::Divergence);
  ASSERT_FALSE(D.Suspects.empty());
  EXPECT_EQ(D.Suspects[0].Component.Path, "attn");
  ASSERT_TRUE(D.Suspects[0].Op.has_value());
  EXPECT_EQ(D.Suspects[0].Op->Name, "zoo::core");
  EXPECT_EQ(D.Suspects[0].Op->ReadBy, "attn.o_proj");

  // A NaN written is found as the writer's too (NaN equals no value).
  Layout("nan", true, {5, std::nanf("")});
  Diagnosis N = run("nan", "ref");
  ASSERT_EQ(N.Result, Diagnosis::Verdict::Divergence);
  ASSERT_FALSE(N.Suspects.empty());
  EXPECT_EQ(N.Suspects[0].Component.Path, "attn");
  ASSERT_TRUE(N.Suspects[0].Op.has_value());
  EXPECT_EQ(N.Suspects[0].Op->Name, "zoo::core");
}

// Beneath the op, the kernels' buffer snapshots (a GPU trace with capture)
// single out the kernel: against the reference's same kernels when it ran
// them (a kernel developer's old and new build), else the one that wrote the
// op's departing value.
TEST_F(DiagnosisTest, TheKernelBeneathTheOpIsNamedFromItsBufferSnapshots) {
  using Spec = TraceBuilder::Spec;
  auto Layout = [&](StringRef Name, std::vector<float> Out, std::vector<float> Fill,
                    bool Kernels, std::vector<float> Read = {9, 9}) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.callSpecs("mlp", "", {{{1, 2}, {2}}}, {{Out, {2}}});
    int64_t Op = T.op("mlp", "zoo::gemm", "output", Out, {2});
    if (Kernels) {
      int64_t Fills = T.kernel(Op, "mlp", "fill_kernel", 2, Fill);
      // A buffer the op only reads: not where a kernel departs.
      T.snapshot(Fills, 0, Read, "argument");
      T.kernel(Op, "mlp", "gemm_kernel", 2, Out);
      T.kernel(Op, "mlp", "epilogue_kernel", 2, Out);
    }
    T.close();
  };
  // The reference ran the same kernels; the target's fill left ones where
  // the reference's left zeros, and the GEMM's result departs after it.
  Layout("ref", {3, 4}, {0, 0}, true);
  Layout("tgt", {3, 40}, {1, 1}, true);
  Diagnosis D = run("tgt", "ref");
  ASSERT_EQ(D.Result, Diagnosis::Verdict::Divergence);
  ASSERT_TRUE(D.Suspects[0].Op.has_value());
  EXPECT_EQ(D.Suspects[0].Op->Name, "zoo::gemm");
  EXPECT_EQ(D.Suspects[0].Op->Kernels.size(), 3u);
  EXPECT_EQ(D.Suspects[0].Op->Kernel, "fill_kernel");
  EXPECT_TRUE(D.Suspects[0].Op->KernelRatio.has_value());
  // The same fill as the reference's: the GEMM is the first to depart.
  Layout("tgt2", {3, 40}, {0, 0}, true, {7, 7});
  Diagnosis G = run("tgt2", "ref");
  ASSERT_TRUE(G.Suspects[0].Op.has_value());
  EXPECT_EQ(G.Suspects[0].Op->Kernel, "gemm_kernel");
  // A reference without kernels (HF on the CPU, another library): the
  // kernel after which the buffer held the departing output wrote it.
  Layout("cpu-ref", {3, 4}, {}, false);
  Diagnosis W = run("tgt", "cpu-ref");
  ASSERT_TRUE(W.Suspects[0].Op.has_value());
  EXPECT_EQ(W.Suspects[0].Op->Kernel, "gemm_kernel");
  EXPECT_FALSE(W.Suspects[0].Op->KernelRatio.has_value());
  EXPECT_NE(W.Suspects[0].Op->KernelReason.find("held the op's departing value"),
            std::string::npos);
  EXPECT_EQ(W.Suspects[0].Op->KernelIndex, 1);
  // No snapshots: the op and its kernels, none singled out.
  Layout("plain", {3, 40}, {}, false);
  Diagnosis P = run("plain", "cpu-ref");
  ASSERT_TRUE(P.Suspects[0].Op.has_value());
  EXPECT_TRUE(P.Suspects[0].Op->Kernel.empty());
}

// A KV-cache write is checked by un-paging the cache it wrote with its own
// slot mapping: what it stored must be what it was given. One that stored a
// token in the wrong slot is named before the attention that read the cache.
TEST_F(DiagnosisTest, AKVCacheWriteThatStoredOtherValuesIsNamedFirst) {
  using Spec = TraceBuilder::Spec;
  using OpTensor = TraceBuilder::OpTensor;
  // Three tokens, two heads of two: keys and values [3, 2, 2]; a cache of
  // 4 blocks of 2 slots, [4, 2, 2, 2]; the tokens in slots 5, 1 and 6.
  std::vector<float> K = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<float> V(12);
  for (size_t I = 0; I < 12; ++I)
    V[I] = K[I] * -0.5f;
  std::vector<float> Slots = {5, 1, 6};
  auto Page = [&](const std::vector<float> &X, std::vector<float> Where) {
    std::vector<float> Cache(4 * 2 * 4, 0);
    for (size_t T = 0; T < 3; ++T)
      for (size_t E = 0; E < 4; ++E)
        Cache[size_t(Where[T]) * 4 + E] = X[T * 4 + E];
    return Cache;
  };
  auto Layout = [&](StringRef Name, bool Engine, std::vector<float> KeySlots,
                    std::vector<float> Out) {
    TraceBuilder B(dir(Name));
    B.call("", "", {0}, {}, {1, 2, 3});
    B.callSpecs("attn", "", {{{1, 2, 3}, {3}}}, {{Out, {3}}});
    if (Engine) {
      B.opTensors("attn", "zoo::reshape_and_cache",
                  {OpTensor{"input", K, {3, 2, 2}}, OpTensor{"input", V, {3, 2, 2}},
                   OpTensor{"input", Slots, {3}, DType::I64},
                   OpTensor{"mutated", Page(K, KeySlots), {4, 2, 2, 2}},
                   OpTensor{"mutated", Page(V, Slots), {4, 2, 2, 2}}});
      B.op("attn", "zoo::paged_attention", "output", Out, {3});
    }
    B.close();
  };
  Layout("ref", false, {}, {1, 2, 3});
  // The attention departs in both; only one stored a key in the wrong slot.
  Layout("tgt", true, Slots, {1, 2, 30});
  Layout("bad", true, {5, 1, 7}, {1, 2, 30});
  Diagnosis D = run("tgt", "ref");
  ASSERT_EQ(D.Result, Diagnosis::Verdict::Divergence);
  ASSERT_TRUE(D.Suspects[0].Op.has_value());
  EXPECT_EQ(D.Suspects[0].Op->Name, "zoo::paged_attention");
  Diagnosis B = run("bad", "ref");
  ASSERT_EQ(B.Result, Diagnosis::Verdict::Divergence);
  ASSERT_TRUE(B.Suspects[0].Op.has_value());
  EXPECT_EQ(B.Suspects[0].Op->Name, "zoo::reshape_and_cache");
  EXPECT_NE(B.Suspects[0].Op->Reason.find("un-paged by its slot mapping"), std::string::npos)
      << B.Suspects[0].Op->Reason;
  EXPECT_TRUE(B.Suspects[0].Op->WroteInPlace);
}

// A mapped child whose own output agrees but which wrote, in place, the
// tensor a later child read comes first (routed experts overwriting the
// hidden states the shared expert then reads).
TEST_F(DiagnosisTest, AChildThatWroteItsInputInPlaceComesFirst) {
  auto Layout = [&](StringRef Name, std::vector<float> SharedInput) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.callSpecs("mlp", "", {{{1, 2}, {2}}}, {{{SharedInput[0] + 7, SharedInput[1] + 8}, {2}}});
    T.callSpecs("mlp.experts", "mlp", {{{1, 2}, {2}}}, {{{7, 8}, {2}}});
    T.op("mlp.experts", "zoo::moe", "mutated", SharedInput, {2});
    T.callSpecs("mlp.shared", "mlp", {{SharedInput, {2}}}, {{SharedInput, {2}}});
    T.op("mlp.shared", "aten::mul", "output", SharedInput, {2});
    T.close();
  };
  Layout("ref", {1, 2});
  Layout("tgt", {7, 8}); // the experts' result, written over their input
  Diagnosis D = run("tgt", "ref");
  ASSERT_EQ(D.Result, Diagnosis::Verdict::Divergence);
  ASSERT_GE(D.Suspects.size(), 2u);
  EXPECT_EQ(D.Suspects[0].Component.Path, "mlp.experts");
  EXPECT_NE(D.Suspects[0].Reason.find("wrote, in place (op zoo::moe)"), std::string::npos)
      << D.Suspects[0].Reason;
  EXPECT_EQ(D.Suspects[1].Component.Path, "mlp");
}

} // namespace

namespace {

// Pipeline stages: rank 0 runs the first layer, rank 1 the second and the
// head; both enter the root and the decoder. Joined, they are the
// reference's one call sequence, and a bug in the last stage is found.
TEST_F(DiagnosisTest, PipelineStagesAreJoinedIntoOneCallSequence) {
  std::vector<int64_t> Tokens = {5, 6, 7};
  {
    TraceBuilder R(dir("ref"));
    R.call("", "", {0.5f, 0.25f}, {}, Tokens);
    R.call("model", "", {2, 3});
    R.call("model.layers.0", "model", {1, 2});
    R.call("model.layers.1", "model", {2, 3}, {"model.layers.0"});
    R.call("head", "", {0.5f, 0.25f}, {"model"});
    R.close();
  }
  auto Stage = [&](StringRef Name, bool First, std::vector<float> Head) {
    TraceBuilder T(dir(Name));
    T.call("", "", First ? std::vector<float>{1, 2} : Head, {}, Tokens);
    T.call("model", "", First ? std::vector<float>{1, 2} : std::vector<float>{2, 3});
    if (First) {
      T.call("model.layers.0", "model", {1, 2});
    } else {
      T.call("model.layers.1", "model", {2, 3});
      T.call("head", "", Head, {"model"});
    }
    T.close();
  };
  Stage("rank-0", true, {});
  Stage("rank-1", false, {0.5f, 0.25f});
  Stage("bad-rank-1", false, {9, 9});

  auto Ref = open("ref"), First = open("rank-0"), Last = open("rank-1"), Bad = open("bad-rank-1");
  TraceReader *Clean[] = {First.get(), Last.get()};
  TraceReader *Broken[] = {First.get(), Bad.get()};
  auto Layout = rankLayout(Clean);
  ASSERT_TRUE(bool(Layout));
  EXPECT_EQ(*Layout, RankLayout::Stages);

  auto D = diagnose(Clean, *Ref, nullptr, DiagnoseOptions());
  ASSERT_TRUE(bool(D)) << toString(D.takeError());
  EXPECT_EQ(D->Result, Diagnosis::Verdict::NoDivergence);
  // One call per module, in the stages' order; the earlier stage's root and
  // decoder calls are the last stage's.
  std::vector<std::string> Paths;
  for (const ComponentRatio &C : D->Curve)
    Paths.push_back(C.Path);
  EXPECT_EQ(Paths, (std::vector<std::string>{"", "model", "model.layers.0", "model.layers.1",
                                             "head"}));

  auto E = diagnose(Broken, *Ref, nullptr, DiagnoseOptions());
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  ASSERT_EQ(E->Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(E->Suspects.front().Component.Path, "head");
}

TEST_F(DiagnosisTest, RanksOfTheSameModulesAreNotStages) {
  for (StringRef Name : {"tp-0", "tp-1"}) {
    TraceBuilder T(dir(Name));
    T.call("", "", {1}, {}, {1});
    T.call("a", "", {1});
    T.close();
  }
  auto A = TraceReader::open(dir("tp-0")), B = TraceReader::open(dir("tp-1"));
  ASSERT_TRUE(A && B);
  TraceReader *Ranks[] = {A->get(), B->get()};
  auto Layout = rankLayout(Ranks);
  ASSERT_TRUE(bool(Layout));
  EXPECT_EQ(*Layout, RankLayout::SameModules);
}

} // namespace

namespace {

/// Rank \p R's shard of a [2 tokens, 4 features] tensor split in two along
/// its features, as a column-parallel module holds it: [2 tokens, 2].
std::vector<float> columnShard(const std::vector<float> &Full, int R) {
  return {Full[2 * R], Full[2 * R + 1], Full[4 + 2 * R], Full[5 + 2 * R]};
}

// Tensor parallelism: a column-parallel module's output is a shard on each
// rank, gathered (each token's features, rank after rank) to meet the
// reference's; a bad shard on rank 1 is found there.
TEST_F(DiagnosisTest, TensorParallelShardsAreGatheredFromTheRanks) {
  using Spec = TraceBuilder::Spec;
  std::vector<float> Full = {1, 2, 3, 4, 5, 6, 7, 8}; // [2 tokens, 4 features]
  std::vector<float> Out = {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f};
  {
    TraceBuilder R(dir("ref"));
    R.call("", "", {0}, {}, {1, 2});
    R.callSpecs("col", "", {}, {Spec{Full, {1, 2, 4}}});
    R.callSpecs("row", "", {Spec{{}, {1, 2, 4}, DType::F32, "col"}}, {Spec{Out, {1, 2, 3}}});
    R.close();
  }
  auto Rank = [&](StringRef Name, int R, bool Bad) {
    std::vector<float> Shard = columnShard(Full, R);
    if (Bad)
      Shard[1] += 3;
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.callSpecs("col", "", {}, {Spec{Shard, {2, 2}}});
    T.callSpecs("row", "", {Spec{{}, {2, 2}, DType::F32, "col"}}, {Spec{Out, {2, 3}}});
    T.close();
  };
  Rank("tp-0", 0, false);
  Rank("tp-1", 1, false);
  Rank("bad-tp-1", 1, true);
  auto Ref = open("ref"), A = open("tp-0"), B = open("tp-1"), Bad = open("bad-tp-1");
  TraceReader *Clean[] = {A.get(), B.get()};
  TraceReader *Broken[] = {A.get(), Bad.get()};

  auto D = diagnose(Clean, *Ref, nullptr, DiagnoseOptions());
  ASSERT_TRUE(bool(D)) << toString(D.takeError());
  EXPECT_EQ(D->Result, Diagnosis::Verdict::NoDivergence) << D->InputsDifference;
  auto Col = llvm::find_if(D->Curve, [](const ComponentRatio &C) { return C.Path == "col"; });
  ASSERT_NE(Col, D->Curve.end());
  ASSERT_TRUE(Col->Ratio.has_value()); // compared, gathered: not unmapped
  EXPECT_EQ(*Col->Ratio, 0);

  auto E = diagnose(Broken, *Ref, nullptr, DiagnoseOptions());
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  ASSERT_EQ(E->Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(E->Suspects.front().Component.Path, "col");
}

// Under tensor parallelism an engine component without a reference
// counterpart (a rotary embedding over each rank's heads) holds a shard of
// what the reference's op computed whole: its statistics are checked with
// the other ranks' shards added, so it is cleared, not found nowhere (and
// put before the suspect that consumed it).
TEST_F(DiagnosisTest, AProducersShardsAreCheckedTogetherUnderTensorParallelism) {
  using Spec = TraceBuilder::Spec;
  std::vector<float> Full = {1, 2, 3, 4, 5, 6, 7, 8}; // [2 tokens, 4 features]
  std::vector<float> Out = {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f};
  {
    TraceBuilder R(dir("ref"));
    R.call("", "", {0}, {}, {1, 2});
    R.callSpecs("attn", "", {}, {Spec{{1, 2}, {2}}});
    R.op("attn", "aten::mul", "output", Full, {2, 4});
    R.callSpecs("attn.core", "attn", {}, {Spec{Out, {1, 2, 3}}});
    R.close();
  }
  auto Rank = [&](StringRef Name, int R) {
    std::vector<float> Shard = columnShard(Full, R);
    std::vector<float> Bad = Out;
    Bad[2] += 40;
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.callSpecs("attn", "", {}, {Spec{{1, 2}, {2}}});
    T.callSpecs("attn.rot", "attn", {}, {Spec{Shard, {2, 2}}});
    T.callSpecs("attn.core", "attn", {Spec{{}, {2, 2}, DType::F32, "attn.rot"}},
                {Spec{Bad, {2, 3}}});
    T.close();
  };
  Rank("tp-0", 0);
  Rank("tp-1", 1);
  auto Ref = open("ref"), A = open("tp-0"), B = open("tp-1");
  TraceReader *Ranks[] = {A.get(), B.get()};
  DiagnoseOptions Options;
  auto D = diagnose(Ranks, *Ref, nullptr, Options);
  ASSERT_TRUE(bool(D)) << toString(D.takeError());
  ASSERT_EQ(D->Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(D->Suspects.front().Component.Path, "attn.core");
  for (const Suspect &S : D->Suspects)
    EXPECT_NE(S.Component.Path, "attn.rot");
}

TEST_F(DiagnosisTest, ACallWithUncomparedInputsDownstreamOfADivergenceIsNotBlamed) {
  using Spec = TraceBuilder::Spec;
  // proj is broken; backend runs after it inside the same layer, and its
  // input has no counterpart of the reference's shape (an engine's
  // attention backend): it departs, but only passes proj's divergence on.
  auto Layout = [&](StringRef Name, bool Target) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.callSpecs("layer", "", {}, {Spec{Target ? std::vector<float>{1, 9} : std::vector<float>{1, 2}, {2}}});
    T.callSpecs("layer.proj", "layer", {}, {Spec{Target ? std::vector<float>{3, 9} : std::vector<float>{3, 4}, {2}}});
    T.callSpecs("layer.backend", "layer",
                {Target ? Spec{{3, 9, 1, 1}, {2, 2}} : Spec{{3, 4}, {1, 2}}},
                {Spec{Target ? std::vector<float>{5, 9} : std::vector<float>{5, 6}, {2}}});
    T.close();
  };
  Layout("ref", false);
  Layout("tgt", true);
  Diagnosis D = run("tgt", "ref");
  ASSERT_EQ(D.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(D.Suspects.front().Component.Path, "layer.proj");
  for (const Suspect &S : D.Suspects)
    EXPECT_NE(S.Component.Path, "layer.backend");
}

TEST_F(DiagnosisTest, TensorParallelStagesAreJoinedAndGathered) {
  using Spec = TraceBuilder::Spec;
  // Four ranks: two pipeline stages of two tensor-parallel ranks each
  // (vLLM's numbering: rank = stage * 2 + shard). Each layer's output is
  // column-parallel: each rank holds half of the features.
  std::vector<float> L0 = {1, 2, 3, 4, 5, 6, 7, 8}, L1 = {8, 7, 6, 5, 4, 3, 2, 1};
  std::vector<float> Head = {0.5f, 0.25f};
  {
    TraceBuilder R(dir("ref"));
    R.call("", "", Head, {}, {1, 2});
    R.callSpecs("model", "", {}, {Spec{L1, {1, 2, 4}}});
    R.callSpecs("model.layers.0", "model", {}, {Spec{L0, {1, 2, 4}}});
    R.callSpecs("model.layers.1", "model", {}, {Spec{L1, {1, 2, 4}}});
    R.call("head", "", Head, {});
    R.close();
  }
  auto Shard = [](const std::vector<float> &Full, int Half) {
    return std::vector<float>{Full[2 * Half], Full[2 * Half + 1], Full[4 + 2 * Half],
                              Full[5 + 2 * Half]};
  };
  auto Rank = [&](StringRef Name, int Stage, int Half, bool Bad) {
    TraceBuilder T(dir(Name));
    T.call("", "", Stage ? Head : std::vector<float>{1, 2}, {}, {1, 2});
    if (Stage == 0) {
      T.callSpecs("model", "", {}, {Spec{{1, 2}, {2}}});
      T.callSpecs("model.layers.0", "model", {}, {Spec{Shard(L0, Half), {2, 2}}});
    } else {
      std::vector<float> Out = Shard(L1, Half);
      if (Bad)
        Out[0] += 5;
      T.callSpecs("model", "", {}, {Spec{Out, {2, 2}}});
      T.callSpecs("model.layers.1", "model", {}, {Spec{Out, {2, 2}}});
      T.call("head", "", Head, {});
    }
    T.close();
  };
  Rank("r0", 0, 0, false);
  Rank("r1", 0, 1, false);
  Rank("r2", 1, 0, false);
  Rank("r3", 1, 1, false);
  Rank("bad-r3", 1, 1, true);
  auto Ref = open("ref"), R0 = open("r0"), R1 = open("r1"), R2 = open("r2"), R3 = open("r3"),
       Bad = open("bad-r3");
  TraceReader *Clean[] = {R0.get(), R1.get(), R2.get(), R3.get()};
  TraceReader *Broken[] = {R0.get(), R1.get(), R2.get(), Bad.get()};
  auto Stages = rankStages(Clean);
  ASSERT_TRUE(bool(Stages)) << toString(Stages.takeError());
  EXPECT_EQ(*Stages, (std::vector<std::vector<size_t>>{{0, 1}, {2, 3}}));
  auto Layout = rankLayout(Clean);
  ASSERT_TRUE(bool(Layout));
  EXPECT_EQ(*Layout, RankLayout::TensorParallelStages);

  auto D = diagnose(Clean, *Ref, nullptr, DiagnoseOptions());
  ASSERT_TRUE(bool(D)) << toString(D.takeError());
  EXPECT_EQ(D->Result, Diagnosis::Verdict::NoDivergence);
  std::vector<std::string> Paths;
  for (const ComponentRatio &C : D->Curve) {
    Paths.push_back(C.Path);
    if (C.Path.rfind("model.layers.", 0) == 0) {
      ASSERT_TRUE(C.Ratio.has_value()) << C.Path; // gathered across the stage's ranks
      EXPECT_EQ(*C.Ratio, 0) << C.Path;
    }
  }
  EXPECT_EQ(Paths, (std::vector<std::string>{"", "model", "model.layers.0", "model.layers.1",
                                             "head"}));

  auto E = diagnose(Broken, *Ref, nullptr, DiagnoseOptions());
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  ASSERT_EQ(E->Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(E->Suspects.front().Component.Path, "model.layers.1");

  // Stages of different sizes are no layout ekka-diagnose knows.
  TraceReader *Uneven[] = {R0.get(), R1.get(), R2.get()};
  auto U = rankStages(Uneven);
  ASSERT_FALSE(bool(U));
  EXPECT_NE(toString(U.takeError()).find("stages of different sizes"), std::string::npos);
}

TEST_F(DiagnosisTest, AReferenceOfSeveralRanksIsJoinedOrComparedShardForShard) {
  using Spec = TraceBuilder::Spec;
  std::vector<int64_t> Tokens = {1, 2};
  // One process: root, model, two layers, head.
  auto Whole = [&](StringRef Name, std::vector<float> Head) {
    TraceBuilder T(dir(Name));
    T.call("", "", Head, {}, Tokens);
    T.call("model", "", {2, 3});
    T.call("model.layers.0", "model", {1, 2});
    T.call("model.layers.1", "model", {2, 3}, {"model.layers.0"});
    T.call("head", "", Head, {"model"});
    T.close();
  };
  // The same as two pipeline stages.
  auto Stage = [&](StringRef Name, bool First) {
    TraceBuilder T(dir(Name));
    T.call("", "", First ? std::vector<float>{1, 2} : std::vector<float>{0.5f, 0.25f}, {},
           Tokens);
    T.call("model", "", First ? std::vector<float>{1, 2} : std::vector<float>{2, 3});
    if (First) {
      T.call("model.layers.0", "model", {1, 2});
    } else {
      T.call("model.layers.1", "model", {2, 3});
      T.call("head", "", {0.5f, 0.25f}, {"model"});
    }
    T.close();
  };
  Whole("tgt", {0.5f, 0.25f});
  Whole("bad", {9, 9});
  Stage("ref-0", true);
  Stage("ref-1", false);
  auto Tgt = open("tgt"), Bad = open("bad"), R0 = open("ref-0"), R1 = open("ref-1");
  TraceReader *Target[] = {Tgt.get()}, *Broken[] = {Bad.get()}, *Ref[] = {R0.get(), R1.get()};
  auto D = diagnose(Target, Ref, {}, DiagnoseOptions());
  ASSERT_TRUE(bool(D)) << toString(D.takeError());
  EXPECT_EQ(D->Result, Diagnosis::Verdict::NoDivergence);
  EXPECT_EQ(D->Uncompared, 0u); // the later stage's layer and head are there
  auto E = diagnose(Broken, Ref, {}, DiagnoseOptions());
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  ASSERT_EQ(E->Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(E->Suspects.front().Component.Path, "head");

  // Tensor-parallel on both sides: shard meets shard through the first
  // ranks. Against a single-rank target, a sharded reference is refused.
  auto Rank = [&](StringRef Name, std::vector<float> Shard) {
    TraceBuilder T(dir(Name));
    T.call("", "", {1}, {}, Tokens);
    T.callSpecs("col", "", {}, {Spec{Shard, {2, 2}}});
    T.close();
  };
  Rank("t0", {1, 2, 5, 6});
  Rank("t1", {3, 4, 7, 8});
  Rank("r0", {1, 2, 5, 6});
  Rank("r1", {3, 4, 7, 8});
  Rank("bad-t0", {1, 9, 5, 6});
  auto T0 = open("t0"), T1 = open("t1"), Q0 = open("r0"), Q1 = open("r1"), B0 = open("bad-t0");
  TraceReader *TP[] = {T0.get(), T1.get()}, *BadTP[] = {B0.get(), T1.get()},
              *RefTP[] = {Q0.get(), Q1.get()}, *One[] = {T0.get()};
  auto S = diagnose(TP, RefTP, {}, DiagnoseOptions());
  ASSERT_TRUE(bool(S)) << toString(S.takeError());
  EXPECT_EQ(S->Result, Diagnosis::Verdict::NoDivergence);
  EXPECT_EQ(S->Uncompared, 0u);
  auto SB = diagnose(BadTP, RefTP, {}, DiagnoseOptions());
  ASSERT_TRUE(bool(SB)) << toString(SB.takeError());
  ASSERT_EQ(SB->Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(SB->Suspects.front().Component.Path, "col");
  auto Refused = diagnose(One, RefTP, {}, DiagnoseOptions());
  ASSERT_FALSE(bool(Refused));
  EXPECT_NE(toString(Refused.takeError()).find("shard for shard"), std::string::npos);
}

TEST_F(DiagnosisTest, CodeThatNamesItsModulesItsOwnWayIsMappedByValuesAndStructure) {
  // HF's names on the reference side; the target's are its own (no rule
  // and no path pairs them): tok ~ model.embed, blocks.0 ~ model.layers.0,
  // ffn ~ mlp, w1/w3/w2 ~ gate/up/down, out ~ lm_head.
  std::vector<float> E = {1, 2}, L = {3, 4}, P = {5, 6}, G = {7, 8}, U = {9, 10},
                     M = {11, 12}, H = {13, 14};
  {
    TraceBuilder R(dir("ref"));
    R.call("", "", {0}, {}, {1, 2});
    R.call("model", "", M, {});
    R.call("model.embed", "model", E, {});
    R.call("model.layers.0", "model", L, {"model.embed"});
    R.call("model.layers.0.mlp", "model.layers.0", P, {"model.embed"});
    R.call("model.layers.0.mlp.gate", "model.layers.0.mlp", G, {"model.embed"});
    R.call("model.layers.0.mlp.up", "model.layers.0.mlp", U, {"model.embed"});
    R.call("model.layers.0.mlp.down", "model.layers.0.mlp", P, {"model.layers.0.mlp.up"});
    R.call("lm_head", "", H, {"model"});
    R.close();
  }
  auto Target = [&](StringRef Name, bool Bug) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.call("tok", "", E, {});
    T.call("blocks.0", "", Bug ? std::vector<float>{3, 70} : L, {"tok"});
    T.call("blocks.0.ffn", "blocks.0", Bug ? std::vector<float>{5, 60} : P, {"tok"});
    T.call("blocks.0.ffn.w1", "blocks.0.ffn", G, {"tok"});
    T.call("blocks.0.ffn.w3", "blocks.0.ffn", Bug ? std::vector<float>{9, 50} : U, {"tok"});
    T.call("blocks.0.ffn.w2", "blocks.0.ffn", Bug ? std::vector<float>{5, 60} : P,
           {"blocks.0.ffn.w3"});
    T.call("out", "", Bug ? std::vector<float>{13, 80} : H, {"blocks.0"});
    T.close();
  };
  Target("tgt", false);
  Target("bad", true);
  auto Mapped = [](const Diagnosis &D, StringRef Path) -> const ComponentRatio * {
    auto It = llvm::find_if(D.Curve, [&](const ComponentRatio &C) { return C.Path == Path; });
    return It == D.Curve.end() ? nullptr : &*It;
  };

  Diagnosis D = run("tgt", "ref");
  EXPECT_EQ(D.Result, Diagnosis::Verdict::NoDivergence);
  EXPECT_EQ(D.Uncompared, 0u);
  std::map<std::string, std::string> Expected = {
      {"tok", "model.embed"}, {"blocks.0", "model.layers.0"},
      {"blocks.0.ffn", "model.layers.0.mlp"}, {"blocks.0.ffn.w1", "model.layers.0.mlp.gate"},
      {"blocks.0.ffn.w3", "model.layers.0.mlp.up"}, {"blocks.0.ffn.w2", "model.layers.0.mlp.down"},
      {"out", "lm_head"}};
  for (const auto &[Path, Ref] : Expected) {
    const ComponentRatio *C = Mapped(D, Path);
    ASSERT_TRUE(C) << Path;
    EXPECT_EQ(C->ReferencePaths, std::vector<std::string>{Ref}) << Path;
    EXPECT_EQ(C->MappedBy, "tensor evidence") << Path;
  }

  // With w3 broken, w3 and everything around and after it departs: those
  // are paired by structure, and w3 is blamed.
  Diagnosis B = run("bad", "ref");
  ASSERT_EQ(B.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(B.Suspects.front().Component.Path, "blocks.0.ffn.w3");
  const ComponentRatio *W3 = Mapped(B, "blocks.0.ffn.w3");
  ASSERT_TRUE(W3);
  EXPECT_EQ(W3->MappedBy, "structure");
  EXPECT_EQ(W3->ReferencePaths, std::vector<std::string>{"model.layers.0.mlp.up"});
  EXPECT_EQ(Mapped(B, "blocks.0.ffn.w1")->MappedBy, "tensor evidence");
  EXPECT_EQ(Mapped(B, "blocks.0")->ReferencePaths, std::vector<std::string>{"model.layers.0"});
  EXPECT_EQ(Mapped(B, "out")->ReferencePaths, std::vector<std::string>{"lm_head"});

  // Without tensor evidence or structure to go by, nothing is paired: an
  // extra target module after the others stays unmapped.
  {
    TraceBuilder T(dir("extra"));
    T.call("", "", {0}, {}, {1, 2});
    T.call("tok", "", E, {});
    T.call("sampler", "", {1, 2, 3}, {"tok"});
    T.close();
  }
  Diagnosis X = run("extra", "ref");
  const ComponentRatio *S = Mapped(X, "sampler");
  ASSERT_TRUE(S);
  EXPECT_FALSE(S->Mapped);
  EXPECT_NE(S->UnmappedReason.find("structure or values"), std::string::npos);
}

TEST_F(DiagnosisTest, ATransposedLayoutIsComparedElementByElement) {
  using Spec = TraceBuilder::Spec;
  // The reference's [1, heads 2, tokens 3]; the target's [tokens 3, heads 2]:
  // the same values, laid out the other way round.
  {
    TraceBuilder R(dir("ref"));
    R.call("", "", {0}, {}, {1, 2, 3});
    R.callSpecs("heads", "", {}, {Spec{{1, 2, 3, 4, 5, 6}, {1, 2, 3}}});
    R.close();
  }
  auto Target = [&](StringRef Name, std::vector<float> Out) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2, 3});
    T.callSpecs("heads", "", {}, {Spec{Out, {3, 2}}});
    T.close();
  };
  Target("tgt", {1, 4, 2, 5, 3, 6});
  Target("bad", {1, 4, 2, 5, 3, 7});
  expectAlignedAndBlamed("tgt", "bad", "ref", "heads");
}

TEST_F(DiagnosisTest, AnOpenLayoutIsSettledByTheValuesAndKeptForTheComponent) {
  using Spec = TraceBuilder::Spec;
  // The reference's [1, heads 2, tokens 2, dim 3] against the target's
  // [tokens 2, heads 2, dim 3]: with as many tokens as heads, the shapes
  // agree and only the values tell the layouts apart.
  auto Heads = [](float Layer) {
    std::vector<float> V;
    for (int I = 0; I < 12; ++I)
      V.push_back(Layer * 100 + float(I * I % 7) + 0.25f * float(I));
    return V;
  };
  auto TokensFirst = [](const std::vector<float> &H) {
    std::vector<float> V(12);
    for (int Head = 0; Head < 2; ++Head)
      for (int Tok = 0; Tok < 2; ++Tok)
        for (int D = 0; D < 3; ++D)
          V[size_t((Tok * 2 + Head) * 3 + D)] = H[size_t((Head * 2 + Tok) * 3 + D)];
    return V;
  };
  auto Write = [&](StringRef Name, std::vector<float> L0, std::vector<float> L1,
                   TensorDims Shape, TensorDims Strides = {}) {
    TraceBuilder B(dir(Name));
    B.call("", "", {0}, {}, {1, 2});
    B.callSpecs("layers.0.attn", "", {}, {Spec{L0, Shape, DType::F32, "", Strides}});
    B.callSpecs("layers.1.attn", "", {}, {Spec{L1, Shape, DType::F32, "", Strides}});
    B.close();
  };
  // HF's heads-first tensor is a transposed view of [1, tokens, heads, dim]:
  // its strides say so, and back the search.
  Write("ref", Heads(0), Heads(1), {1, 2, 2, 3}, {12, 3, 6, 1});
  Write("contiguous-ref", Heads(0), Heads(1), {1, 2, 2, 3});
  Write("tgt", TokensFirst(Heads(0)), TokensFirst(Heads(1)), {2, 2, 3});
  std::vector<float> Wrong = TokensFirst(Heads(1));
  Wrong[4] += 3;
  Write("bad", TokensFirst(Heads(0)), Wrong, {2, 2, 3});
  // Layer 1 returns the reference's layout where layer 0 did not: taken as
  // it is, it would agree; the component's layout says otherwise.
  Write("mixed", TokensFirst(Heads(0)), Heads(1), {2, 2, 3});

  Diagnosis D = run("tgt", "ref");
  EXPECT_EQ(D.Result, Diagnosis::Verdict::NoDivergence);
  ASSERT_EQ(D.Curve.size(), 3u);
  EXPECT_EQ(D.MaxRatio, 0);
  ASSERT_TRUE(D.Curve[1].Transposed);
  EXPECT_EQ(*D.Curve[1].Transposed, std::make_pair(0, 1));
  EXPECT_NE(D.Curve[1].LayoutBy.find("search"), std::string::npos);
  ASSERT_TRUE(D.Curve[2].Transposed);
  EXPECT_EQ(D.Curve[2].LayoutBy, "as the component's earlier calls");
  // --calibrate keeps the layout, generalized over layers.
  std::vector<CalibratedRule> Rules = calibratedRules(D);
  ASSERT_EQ(Rules.size(), 1u);
  EXPECT_EQ(Rules[0].Rule.Target, "layers.*.attn");
  EXPECT_EQ(Rules[0].Rule.Reference, std::vector<std::string>{"layers.*.attn"});
  EXPECT_EQ(Rules[0].Rule.Transpose, std::make_pair(0, 1));
  EXPECT_EQ(Rules[0].Validated, 2u);

  Diagnosis B = run("bad", "ref");
  ASSERT_EQ(B.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(B.Suspects.front().Component.Path, "layers.1.attn");

  Diagnosis M = run("mixed", "ref");
  ASSERT_EQ(M.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(M.Suspects.front().Component.Path, "layers.1.attn");

  // Neither side a transposed view: no program swapped anything in memory,
  // so nothing is searched (a kernel that wrote its output the other way
  // round is not explained away), and the first layer departs.
  Diagnosis N = run("tgt", "contiguous-ref");
  ASSERT_EQ(N.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(N.Suspects.front().Component.Path, "layers.0.attn");
  EXPECT_FALSE(N.Curve[1].Transposed);

  // A mapping rule's layout (what --calibrate wrote) is used as it is.
  auto T = TraceReader::open(dir("tgt")), R = TraceReader::open(dir("ref"));
  ASSERT_TRUE(T && R);
  DiagnoseOptions O;
  MappingRule Rule;
  Rule.Target = "layers.*.attn";
  Rule.Reference = {"layers.*.attn"};
  Rule.Transpose = std::make_pair(0, 1);
  Rule.Source = "calibration";
  O.Mapping = {Rule};
  auto ByRule = diagnose(**T, **R, nullptr, O);
  ASSERT_TRUE(bool(ByRule));
  EXPECT_EQ(ByRule->Result, Diagnosis::Verdict::NoDivergence);
  EXPECT_EQ(ByRule->Curve[1].LayoutBy, "by the mapping");
  EXPECT_EQ(ByRule->Curve[2].LayoutBy, "by the mapping");
  // A rule without one leaves the layout to the search.
  Rule.Transpose.reset();
  O.Mapping = {Rule};
  auto T2 = TraceReader::open(dir("tgt")), R2 = TraceReader::open(dir("ref"));
  ASSERT_TRUE(T2 && R2);
  auto Searched = diagnose(**T2, **R2, nullptr, O);
  ASSERT_TRUE(bool(Searched));
  EXPECT_EQ(Searched->Result, Diagnosis::Verdict::NoDivergence);
  EXPECT_NE(Searched->Curve[1].LayoutBy.find("search"), std::string::npos);
}

// A reference view that only its memory order makes comparable: Gemma-3
// normalizes q heads first ([1, heads, tokens, dim], a transposed view of
// [1, tokens, heads, dim]) where an engine holds [tokens, heads * dim].
TEST_F(DiagnosisTest, AReferenceViewIsReadInItsMemoryOrderWhereOnlyThatMeetsTheTarget) {
  using Spec = TraceBuilder::Spec;
  // Tokens 4, heads 2, dim 3: the value of (token t, head h, d) is 100 t + 10 h + d.
  std::vector<float> TokensFirst, HeadsFirst;
  for (int T = 0; T < 4; ++T)
    for (int H = 0; H < 2; ++H)
      for (int D = 0; D < 3; ++D)
        TokensFirst.push_back(float(100 * T + 10 * H + D + 1));
  for (int H = 0; H < 2; ++H)
    for (int T = 0; T < 4; ++T)
      for (int D = 0; D < 3; ++D)
        HeadsFirst.push_back(float(100 * T + 10 * H + D + 1));
  {
    TraceBuilder R(dir("ref"));
    R.call("", "", {0}, {}, {1, 2, 3, 4});
    R.callSpecs("q_norm", "", {}, {Spec{HeadsFirst, {1, 2, 4, 3}, DType::F32, "", {24, 3, 6, 1}}});
    R.close();
  }
  auto Target = [&](StringRef Name, std::vector<float> Out) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2, 3, 4});
    T.callSpecs("q_norm", "", {}, {Spec{Out, {4, 6}}});
    T.close();
  };
  Target("tgt", TokensFirst);
  std::vector<float> Bad = TokensFirst;
  Bad[7] += 50;
  Target("bad", Bad);
  expectAlignedAndBlamed("tgt", "bad", "ref", "q_norm");
}

TEST_F(DiagnosisTest, AModuleOnlyTheTargetHasIsNoRootCauseByStructureAlone) {
  // The target's block runs an extra module of the same shapes as a
  // reference module the target lacks; the two are paired by structure
  // (nothing agrees by value), and they differ — but the block around them
  // agrees: no divergence.
  {
    TraceBuilder R(dir("ref"));
    R.call("", "", {0}, {}, {1, 2});
    R.call("blk", "", {1, 2}, {});
    R.call("blk.x", "blk", {3, 4}, {});
    R.close();
  }
  {
    TraceBuilder T(dir("tgt"));
    T.call("", "", {0}, {}, {1, 2});
    T.call("blk", "", {1, 2}, {});
    T.call("blk.extra", "blk", {7, 9}, {});
    T.close();
  }
  Diagnosis D = run("tgt", "ref");
  EXPECT_EQ(D.Result, Diagnosis::Verdict::NoDivergence);
  auto Extra = llvm::find_if(D.Curve, [](const ComponentRatio &C) { return C.Path == "blk.extra"; });
  ASSERT_NE(Extra, D.Curve.end());
  EXPECT_EQ(Extra->MappedBy, "structure");
}

TEST_F(DiagnosisTest, RecipesGiveWayToTheSamePath) {
  // The same engine code on both sides: its attention backend is paired
  // with the reference's backend by path, not by the recipe that meets an
  // HF model (o_proj's input).
  auto Layout = [&](StringRef Name, std::vector<float> Attn) {
    TraceBuilder T(dir(Name));
    T.call("", "", {0}, {}, {1, 2});
    T.call("model.layers.0.self_attn", "", {1, 2}, {});
    T.call("model.layers.0.self_attn.attn", "model.layers.0.self_attn", Attn, {});
    T.call("model.layers.0.self_attn.o_proj", "model.layers.0.self_attn", {5, 6},
           {"model.layers.0.self_attn.attn"});
    T.close();
  };
  Layout("ref", {3, 4});
  Layout("tgt", {3, 4});
  Diagnosis D = run("tgt", "ref");
  auto Attn = llvm::find_if(
      D.Curve, [](const ComponentRatio &C) { return C.Path == "model.layers.0.self_attn.attn"; });
  ASSERT_NE(Attn, D.Curve.end());
  EXPECT_EQ(Attn->MappedBy, "");
  EXPECT_EQ(Attn->ReferencePaths, std::vector<std::string>{"model.layers.0.self_attn.attn"});
  EXPECT_TRUE(Attn->InputsCompared);
}

TEST_F(DiagnosisTest, APaddedReferenceBatchIsComparedOnItsRealTokens) {
  using Spec = TraceBuilder::Spec;
  // The reference: two sequences of 3 and 1 tokens, padded on the right to
  // 3 ([2, 3] ids and mask); its padding rows hold what padding computes.
  // The target: the 4 real tokens, one after the other, as an engine packs
  // them.
  std::vector<float> Real = {1, 2, 3, 4, 5, 6, 7, 8}; // [4 tokens, 2 features]
  {
    std::vector<float> Padded = {1, 2, 3, 4, 5, 6, 7, 8, 900, 901, 902, 903};
    TraceBuilder R(dir("ref"));
    R.callSpecs("", "", {Spec{{5, 6, 7, 8, 0, 0}, {2, 3}, DType::I64},
                         Spec{{1, 1, 1, 1, 0, 0}, {2, 3}, DType::I64}},
                {Spec{Padded, {2, 3, 2}}});
    R.callSpecs("a", "", {}, {Spec{Padded, {2, 3, 2}}});
    R.close();
  }
  auto Target = [&](StringRef Name, std::vector<float> Ids, std::vector<float> A) {
    TraceBuilder T(dir(Name));
    T.callSpecs("", "", {Spec{Ids, {4}, DType::I64}}, {Spec{Real, {4, 2}}});
    T.callSpecs("a", "", {}, {Spec{A, {4, 2}}});
    T.close();
  };
  Target("tgt", {5, 6, 7, 8}, Real);
  std::vector<float> Bad = Real;
  Bad[6] += 1; // the second sequence's token
  Target("bad", {5, 6, 7, 8}, Bad);
  Target("dropped", {6, 7, 8, 8}, Real);

  Diagnosis D = run("tgt", "ref");
  EXPECT_EQ(D.Result, Diagnosis::Verdict::NoDivergence) << D.InputsDifference;
  EXPECT_EQ(D.MaxRatio, 0);
  EXPECT_EQ(D.Uncompared, 0u);
  EXPECT_NE(D.NoiseModel.find("padded to 3 tokens compared on its 4 real tokens"),
            std::string::npos)
      << D.NoiseModel;

  Diagnosis E = run("bad", "ref");
  ASSERT_EQ(E.Result, Diagnosis::Verdict::Divergence);
  EXPECT_EQ(E.Suspects.front().Component.Path, "a");

  // The ids are compared without the padding too.
  Diagnosis F = run("dropped", "ref");
  EXPECT_EQ(F.Result, Diagnosis::Verdict::InputsDiffer);
  EXPECT_NE(F.InputsDifference.find("first difference at position 0"), std::string::npos)
      << F.InputsDifference;
}

} // namespace

namespace {

ComponentRatio mappedCall(std::string Path, std::vector<std::string> Refs,
                          std::optional<double> Ratio, std::string By = "recipe vllm-hf 3") {
  ComponentRatio C;
  C.Path = std::move(Path);
  C.ReferencePaths = std::move(Refs);
  C.Ratio = Ratio;
  C.MappedBy = std::move(By);
  return C;
}

TEST(Calibration, ValidatedRuleMappingsAreGeneralizedOverLayers) {
  Diagnosis D;
  D.Curve = {
      mappedCall("m.layers.0.qkv", {"m.layers.0.q", "m.layers.0.k"}, 0.9),
      mappedCall("m.layers.1.qkv", {"m.layers.1.q", "m.layers.1.k"}, 1.1),
      // Paired by path: pairing by path finds it again, nothing to record.
      mappedCall("m.layers.0.norm", {"m.layers.0.norm"}, 0.5, ""),
      // Numbered differently on the two sides: kept literal.
      mappedCall("blocks.3.mlp", {"m.layers.2.mlp"}, 0.7, "mapping file"),
      // One instance uncompared: not validated.
      mappedCall("m.layers.0.gate_up", {"m.layers.0.gate", "m.layers.0.up"}, 0.8),
      mappedCall("m.layers.1.gate_up", {"m.layers.1.gate", "m.layers.1.up"}, std::nullopt),
  };
  std::vector<CalibratedRule> Rules = calibratedRules(D);
  ASSERT_EQ(Rules.size(), 2u);
  EXPECT_EQ(Rules[0].Rule.Target, "m.layers.*.qkv");
  EXPECT_EQ(Rules[0].Rule.Reference, (std::vector<std::string>{"m.layers.*.q", "m.layers.*.k"}));
  EXPECT_EQ(Rules[0].Validated, 2u);
  EXPECT_DOUBLE_EQ(Rules[0].LargestRatio, 1.1);
  EXPECT_EQ(Rules[0].Rule.Source, "recipe vllm-hf 3");
  EXPECT_EQ(Rules[1].Rule.Target, "blocks.3.mlp");
  EXPECT_EQ(Rules[1].Rule.Reference, (std::vector<std::string>{"m.layers.2.mlp"}));
}

} // namespace

namespace {

/// A served run: each step's root given token ids and positions, as a
/// serving engine flattens its batch.
void servedStep(TraceBuilder &B, int64_t Step, std::vector<float> Ids,
                std::vector<float> Positions) {
  B.Step = Step;
  TensorDims Shape = {int64_t(Ids.size())};
  B.callSpecs("", "", {{Ids, Shape, DType::I64}, {Positions, Shape, DType::I64}},
              {{std::vector<float>(Ids.size(), 1.0f), Shape}});
}

} // namespace

TEST_F(DiagnosisTest, ServedRequestsAreReadFromTheRootsPositions) {
  // Two prompts prefilled together, decoded side by side, then the first
  // alone (the second ended).
  {
    TraceBuilder B(dir("served"));
    servedStep(B, 1, {10, 11, 12, 20, 21}, {0, 1, 2, 0, 1});
    servedStep(B, 2, {13, 22}, {3, 2});
    servedStep(B, 3, {14}, {4});
    B.close();
  }
  auto T = open("served");
  TraceReader *Ranks[] = {T.get()};
  auto Requests = servedRequests(Ranks, 0);
  ASSERT_TRUE(bool(Requests)) << toString(Requests.takeError());
  ASSERT_EQ(Requests->size(), 2u);
  EXPECT_EQ((*Requests)[0].Tokens, (std::vector<int64_t>{10, 11, 12, 13, 14}));
  EXPECT_EQ((*Requests)[1].Tokens, (std::vector<int64_t>{20, 21, 22}));
  ASSERT_EQ((*Requests)[1].Segments.size(), 2u);
  EXPECT_EQ((*Requests)[1].Segments[1].Step, 2);
  EXPECT_EQ((*Requests)[1].Segments[1].Begin, 1);
  // Two requests expecting the same position, one going on: the trace
  // does not tell which, and says so rather than guess.
  {
    TraceBuilder B(dir("ambiguous"));
    servedStep(B, 1, {10, 11, 20, 21}, {0, 1, 0, 1});
    servedStep(B, 2, {12}, {2});
    B.close();
  }
  auto A = open("ambiguous");
  TraceReader *AmbiguousRanks[] = {A.get()};
  auto Ambiguous = servedRequests(AmbiguousRanks, 0);
  ASSERT_FALSE(bool(Ambiguous));
  EXPECT_NE(toString(Ambiguous.takeError()).find("continues one of 2 requests at position 2"),
            std::string::npos);
}
