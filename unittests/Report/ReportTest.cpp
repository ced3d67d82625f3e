//===- ReportTest.cpp - Text, JSON, HTML and mapping reports ---------------===//
#include "ekka/Report/Report.h"
#include "ekka/Index/CodeIndex.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"

#include <gtest/gtest.h>
#include <limits>

using namespace ekka;
using namespace llvm;

namespace {

ComponentRatio component(std::string Path, std::string Class, std::optional<double> R) {
  ComponentRatio C;
  C.Path = std::move(Path);
  C.ClassName = Class;
  C.ClassQualname = "zoo.engine." + Class;
  C.SourceFile = "zoo/engine.py";
  C.SourceLine = 42;
  C.Ratio = R;
  return C;
}

/// A divergence at layer 0's MLP, whose GEMM launched an nvcc kernel in an
/// anonymous namespace, after a call that was not compared.
Diagnosis divergence() {
  Diagnosis D;
  D.Result = Diagnosis::Verdict::Divergence;
  D.NoiseModel = "against the FP32 reference";
  D.Curve = {component("model.layers.0.self_attn", "Attention", 1.1),
             component("model.layers.0.mlp", "MLP<float>", 37.5),
             component("model.layers.0.mlp.act_fn", "SiluAndMul", std::nullopt),
             component("model.norm", "RMSNorm", std::numeric_limits<double>::infinity())};
  D.Curve[2].Mapped = false;
  D.Curve[2].UnmappedReason = "no reference call of that path";
  D.MaxRatio = std::numeric_limits<double>::infinity();
  Suspect S;
  S.Component = D.Curve[1];
  S.Reason = "its output departs while its inputs agree";
  S.Before = {D.Curve[0]};
  S.After = {D.Curve[3]};
  OpFinding Op;
  Op.Name = "zoo::quant_gemm";
  Op.Ratio = 80;
  Op.Reason = "first op whose output departs";
  Op.Kernels = {"fill_kernel", "_ZN12_GLOBAL__N_111gemm_kernelEPKfPfi"};
  Op.Kernel = Op.Kernels[1];
  Op.KernelIndex = 1;
  Op.KernelReason = "first of the op's kernels whose buffer departs";
  Op.KernelRatio = 90;
  S.Op = Op;
  D.Suspects.push_back(S);
  return D;
}

TEST(Report, TheFirstLineOfTheTextIsTheAnswer) {
  std::string Out;
  raw_string_ostream OS(Out);
  printText(OS, divergence(), SourceLocator());
  StringRef First = StringRef(Out).split('\n').first;
  EXPECT_EQ(First, "divergence: model.layers.0.mlp (MLP<float>) at step 0, R = 37.5");
  EXPECT_NE(Out.find("  source: zoo/engine.py:42\n"), std::string::npos);
  EXPECT_NE(Out.find("  op: zoo::quant_gemm, R = 80 (first op whose output departs)"),
            std::string::npos);
  // No index: the kernel by its demangled name.
  EXPECT_NE(Out.find("kernel: (anonymous namespace)::gemm_kernel(float const*, float*, int)"),
            std::string::npos)
      << Out;
  // The kernel the snapshots single out is marked, the other is not.
  EXPECT_NE(Out.find("int)\n    ^ first of the op's kernels whose buffer departs, R = 90\n"),
            std::string::npos)
      << Out;
  EXPECT_NE(Out.find("  kernel: fill_kernel\n  kernel: "), std::string::npos) << Out;

  Diagnosis Clean;
  Clean.MaxRatio = 1.2;
  Clean.NoiseModel = "noise model";
  Out.clear();
  printText(OS, Clean, SourceLocator());
  EXPECT_TRUE(StringRef(Out).starts_with("no-divergence: "));
}

// A layer that departs where its input does not: the first call inside it
// given what departs is named, unless that input departs only by the noise
// a rule allows upstream (o_proj given an attention backend's).
TEST(Report, ACallGivenOnlyAllowedNoiseIsNotNamedAsGivenWhatDeparts) {
  auto Text = [](bool NoiseByDesign) {
    Diagnosis D;
    D.Result = Diagnosis::Verdict::Divergence;
    D.Curve = {component("model.layers.0", "DecoderLayer", 18.3),
               component("model.layers.0.attn", "Attention", 1.55),
               component("model.layers.0.o_proj", "Linear", 1.47),
               component("model.layers.0.act_fn", "SiluAndMul", 20.2)};
    for (size_t I = 0; I < D.Curve.size(); ++I) {
      D.Curve[I].Seq = int64_t(I);
      D.Curve[I].Mapped = true;
    }
    D.Curve[0].InputRatio = 0;
    D.Curve[1].RuleNoise = 2;
    D.Curve[1].NoiseOwn = true;
    D.Curve[1].Threshold = 3; // as the diagnosis sets it
    D.Curve[2].InputRatio = 1.55;
    D.Curve[2].InputNoiseByDesign = NoiseByDesign;
    Suspect S;
    S.Component = D.Curve[0];
    S.Reason = "output diverges";
    D.Suspects.push_back(S);
    std::string Out;
    raw_string_ostream OS(Out);
    printText(OS, D, SourceLocator());
    return Out;
  };
  EXPECT_NE(Text(false).find("  inside it, model.layers.0.o_proj was given what departs "
                             "from what its counterpart was given (R = 1.55)\n"),
            std::string::npos)
      << Text(false);
  EXPECT_EQ(Text(true).find("inside it,"), std::string::npos) << Text(true);
}

// The curve's JSON says which rule's noise a call is held to, and whether
// its inputs depart only by such noise upstream.
TEST(Report, TheCurvesJSONGivesARulesNoise) {
  Diagnosis D = divergence();
  D.Curve[0].RuleNoise = 2;
  D.Curve[0].NoiseOwn = true;
  D.Curve[1].InputRatio = 1.55;
  D.Curve[1].InputNoiseByDesign = true;
  json::Value V = toJSON(D, SourceLocator());
  const json::Array *Curve = V.getAsObject()->getArray("components");
  ASSERT_TRUE(Curve && Curve->size() == 4);
  EXPECT_EQ((*Curve)[0].getAsObject()->getNumber("rule_noise"), 2);
  EXPECT_EQ((*Curve)[0].getAsObject()->getBoolean("input_noise_by_design"), false);
  EXPECT_TRUE((*Curve)[1].getAsObject()->get("rule_noise")->getAsNull().has_value());
  EXPECT_EQ((*Curve)[1].getAsObject()->getBoolean("input_noise_by_design"), true);
}

TEST(Report, JSONHasTheContractedKeysAndNoInfinity) {
  json::Value V = toJSON(divergence(), SourceLocator());
  // Round trip through text: an infinite ratio must still be valid JSON.
  std::string Text;
  raw_string_ostream(Text) << V;
  auto Parsed = json::parse(Text);
  ASSERT_TRUE(bool(Parsed)) << toString(Parsed.takeError());
  const json::Object *O = Parsed->getAsObject();
  ASSERT_TRUE(O);
  EXPECT_EQ(O->getString("verdict"), "divergence");
  const json::Array *Suspects = O->getArray("suspects");
  ASSERT_TRUE(Suspects && Suspects->size() == 1);
  const json::Object *S = (*Suspects)[0].getAsObject();
  EXPECT_EQ(S->getString("component"), "model.layers.0.mlp");
  EXPECT_EQ(S->getString("class"), "zoo.engine.MLP<float>");
  EXPECT_EQ(S->getNumber("ratio"), 37.5);
  EXPECT_EQ(S->getString("source"), "zoo/engine.py:42");
  const json::Object *Kernel = S->getObject("kernel");
  ASSERT_TRUE(Kernel);
  EXPECT_EQ(Kernel->getString("op"), "zoo::quant_gemm");
  EXPECT_EQ(Kernel->get("source")->getAsNull().has_value(), true);
  const json::Object *Departing = Kernel->getObject("departing_kernel");
  ASSERT_TRUE(Departing);
  EXPECT_EQ(Departing->getString("display_name"),
            "(anonymous namespace)::gemm_kernel(float const*, float*, int)");
  EXPECT_EQ(Departing->getNumber("ratio"), 90);
  const json::Object *Evidence = S->getObject("evidence");
  ASSERT_TRUE(Evidence && Evidence->getArray("before") && Evidence->getArray("after"));
  EXPECT_EQ((*Evidence->getArray("after"))[0].getAsObject()->getNumber("ratio"),
            std::numeric_limits<double>::max());
  // The uncompared call is in the curve with a null ratio.
  const json::Array *Curve = O->getArray("components");
  ASSERT_TRUE(Curve && Curve->size() == 4);
  EXPECT_TRUE((*Curve)[2].getAsObject()->get("ratio")->getAsNull().has_value());
  EXPECT_FALSE(O->get("inputs_difference"));

  Diagnosis Inputs;
  Inputs.Result = Diagnosis::Verdict::InputsDiffer;
  Inputs.InputsDifference = "token 0: 1 against 2";
  json::Value I = toJSON(Inputs, SourceLocator());
  EXPECT_EQ(I.getAsObject()->getString("verdict"), "inputs-differ");
  EXPECT_EQ(I.getAsObject()->getString("inputs_difference"), "token 0: 1 against 2");
}

TEST(Report, TheHTMLPageIsSelfContainedWithThePlotAndTheSuspect) {
  std::string Out;
  raw_string_ostream OS(Out);
  writeHtml(OS, divergence(), SourceLocator());
  StringRef Page(Out);
  EXPECT_TRUE(Page.starts_with("<!DOCTYPE html>"));
  EXPECT_TRUE(Page.rtrim().ends_with("</html>"));
  EXPECT_FALSE(Page.contains("<script")) << "self-contained and static";
  // One address only: the SVG namespace; nothing is fetched, and the
  // page's policy forbids scripts and loads.
  EXPECT_EQ(Page.count("http://"), 1u);
  EXPECT_TRUE(Page.contains("content=\"default-src 'none';"));
  EXPECT_TRUE(Page.contains("<svg id=\"error-ratio\""));
  // One point per compared call: three of four; the suspect circled.
  EXPECT_EQ(Page.count("<circle cx="), 3u);
  EXPECT_EQ(Page.count("<circle class=\"suspect-mark\""), 1u);
  // Names are escaped.
  EXPECT_TRUE(Page.contains("zoo.engine.MLP&lt;float&gt;"));
  EXPECT_FALSE(Page.contains("MLP<float>"));
  EXPECT_TRUE(Page.contains("<b>model.layers.0.mlp</b>"));
  EXPECT_TRUE(Page.contains("op <b>zoo::quant_gemm</b>"));
  EXPECT_TRUE(Page.contains("(anonymous namespace)::gemm_kernel"));
  EXPECT_FALSE(Page.contains("class=\"notes\""));
}

// The notes on calls above the threshold that are not suspects are in
// every report: the text's lines, the page's list, the JSON's arrays.
TEST(Report, EveryReportGivesTheNotesOnCallsThatAreNotSuspects) {
  Diagnosis D = divergence();
  D.Rescaled = {"model.embed's output is the reference's times 48"};
  D.FewValues = {"router: R = 2, within the 3.1 its 64 values allow"};
  D.NoisierByDesign = {"attn: R = 1.55, within the 3 allowed <by design>"};
  std::string Text, Page;
  raw_string_ostream TS(Text), PS(Page);
  printText(TS, D, SourceLocator());
  writeHtml(PS, D, SourceLocator());
  EXPECT_NE(Text.find("  rescaled: model.embed's output is the reference's times 48\n  few values: "
                      "router: R = 2, within the 3.1 its 64 values allow\n  noisier by design: "
                      "attn: R = 1.55, within the 3 allowed <by design>\n"),
            std::string::npos)
      << Text;
  EXPECT_NE(Page.find("<ul class=\"notes\">\n<li>rescaled: model.embed's output"),
            std::string::npos)
      << Page;
  EXPECT_TRUE(StringRef(Page).contains("<li>few values: router: R = 2"));
  EXPECT_TRUE(StringRef(Page).contains("<li>noisier by design: attn: R = 1.55, within the 3 "
                                       "allowed &lt;by design&gt;</li>"));
  json::Value J = toJSON(D, SourceLocator());
  EXPECT_EQ(J.getAsObject()->getArray("noisier_by_design")->size(), 1u);
}

TEST(Report, TheMappingListsEveryCallWithHowOrWhyNot) {
  Diagnosis D = divergence();
  D.Curve[0].ReferencePaths = {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj"};
  D.Curve[0].MappedBy = "recipe vllm-hf 3";
  D.Curve[0].RuleNoise = 2; // its rule's
  D.Curve[0].NoiseOwn = true;
  D.Curve[1].RuleNoise = 1.4; // from a call inside it: not its mapping's
  D.Curve[1].ReferencePaths = {"model.layers.0.mlp"};
  D.Curve[1].ResidualPair = true;
  D.Curve[1].Transposed = std::make_pair(0, 1);
  D.Curve[1].LayoutBy = "by the mapping";
  D.Curve[3].ReferencePaths = {""};
  D.Curve[3].Parts = {"a", "b"};
  D.Curve[3].Part = 1;
  D.Curve[3].ConcatDim = -1;
  std::string Out;
  raw_string_ostream OS(Out);
  printMapping(OS, D);
  EXPECT_EQ(Out, "mapped    step 0  model.layers.0.self_attn  <->  "
                 "model.layers.0.self_attn.q_proj, model.layers.0.self_attn.k_proj  "
                 "[by recipe vllm-hf 3, noise 2]\n"
                 "mapped    step 0  model.layers.0.mlp  <->  model.layers.0.mlp  "
                 "[(output, residual) pair summed, dims 0,1 swapped, by the mapping]\n"
                 "unmapped  step 0  model.layers.0.mlp.act_fn  (no reference call of that path)\n"
                 "mapped    step 0  model.norm  <->  (root)  [part 2 of 2 along dim -1]\n");
}

TEST(Report, OnlyAKnownGoodPairCalibrates) {
  Diagnosis D = divergence();
  EXPECT_EQ(calibrationRefusal(D), "it diverges at model.layers.0.mlp (R = 37.5)");
  D.Result = Diagnosis::Verdict::InputsDiffer;
  D.InputsDifference = "token 3";
  EXPECT_EQ(calibrationRefusal(D), "its inputs differ (token 3)");
  Diagnosis Clean;
  EXPECT_EQ(calibrationRefusal(Clean), "");
  unsigned N = 7;
  json::Value V = calibrationJSON(Clean, {"t", "r", ""}, &N);
  EXPECT_EQ(N, 0u);
  const json::Object *Origin = V.getAsObject()->getObject("calibrated");
  ASSERT_TRUE(Origin);
  EXPECT_EQ(Origin->getString("target"), "t");
  EXPECT_TRUE(V.getAsObject()->getArray("components")->empty());
  // A layout the search settled, on a component paired by path: written
  // with its "transpose", which --mapping reads back.
  Clean.Curve = {component("model.layers.0.attn", "Attention", 0.5),
                 component("model.layers.1.attn", "Attention", 0.7)};
  for (ComponentRatio &C : Clean.Curve) {
    C.ReferencePaths = {C.Path};
    C.Transposed = std::make_pair(0, 1);
  }
  json::Value L = calibrationJSON(Clean, {"t", "r", ""}, &N);
  EXPECT_EQ(N, 1u);
  const json::Object *Rule = (*L.getAsObject()->getArray("components"))[0].getAsObject();
  EXPECT_EQ(Rule->getString("target"), "model.layers.*.attn");
  EXPECT_EQ(Rule->getString("from"), "path");
  const json::Array *Swap = Rule->getArray("transpose");
  ASSERT_TRUE(Swap && Swap->size() == 2);
  EXPECT_EQ((*Swap)[1].getAsInteger(), 1);
  std::string Text;
  raw_string_ostream(Text) << L;
  auto Back = parseMappingRules(Text, "calibration");
  ASSERT_TRUE(bool(Back)) << toString(Back.takeError());
  ASSERT_EQ(Back->size(), 1u);
  EXPECT_EQ((*Back)[0].Transpose, std::make_pair(0, 1));
}

TEST(SourceLocatorTest, AnOpIsTracedToItsImplementationNotItsFake) {
  // vLLM's direct_register_custom_op registers both on one line; the fake
  // is stored first here, so only the preference can pick the real one.
  SmallString<128> Dir;
  ASSERT_FALSE(sys::fs::createUniqueDirectory("ekka-sources", Dir));
  std::string Path = (Dir + "/index.db").str();
  {
    auto Index = CodeIndex::openForWriting(Path);
    ASSERT_TRUE(bool(Index)) << toString(Index.takeError());
    ASSERT_FALSE(bool((*Index)->beginBatch()));
    FileDefinitions F;
    auto Add = [&](StringRef Name, StringRef Qualified, DefinitionKind K, unsigned Line) {
      Definition D;
      D.Name = Name.str();
      D.QualifiedName = Qualified.str();
      D.Kind = K;
      D.LineStart = D.LineEnd = Line;
      F.Definitions.push_back(D);
      return &F.Definitions.back();
    };
    Add("attn_fake", "layer.attn_fake", DefinitionKind::Function, 1);
    Add("attn", "layer.attn", DefinitionKind::Function, 4);
    Definition *Fake = Add("attn", "vllm::attn", DefinitionKind::Op, 7);
    Fake->Bases = {"layer.attn_fake"};
    Fake->Decorators = {"Fake"};
    Add("attn", "vllm::attn", DefinitionKind::Op, 7)->Bases = {"layer.attn"};
    IndexedFile File;
    File.Path = "/repo/layer.py";
    File.Module = "layer";
    ASSERT_FALSE(bool((*Index)->storeFile(File, "", F)));
    ASSERT_FALSE(bool((*Index)->commitBatch()));
    ASSERT_FALSE(bool((*Index)->finish()));
  }
  auto Index = CodeIndex::openForReading(Path);
  ASSERT_TRUE(bool(Index)) << toString(Index.takeError());
  CodeIndex *Indexes[] = {Index->get()};
  EXPECT_EQ(SourceLocator(Indexes).op("vllm::attn"), "/repo/layer.py:4 (attn)");
  sys::fs::remove_directories(Dir);
}

} // namespace
