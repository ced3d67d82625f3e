//===- CxxIndexerTest.cpp -------------------------------------------------===//
#include "ekka/Index/CxxIndexer.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

using namespace ekka;
using namespace llvm;

namespace {

class CxxIndexerTest : public ::testing::Test {
protected:
  void SetUp() override { ASSERT_FALSE(sys::fs::createUniqueDirectory("ekka-cxx", Dir)); }
  void TearDown() override { sys::fs::remove_directories(Dir); }

  std::string write(StringRef Name, StringRef Content) {
    SmallString<256> P(Dir);
    sys::path::append(P, Name);
    std::error_code EC;
    raw_fd_ostream OS(P, EC);
    OS << Content;
    SmallString<256> Real;
    sys::fs::real_path(P, Real);
    return Real.str().str();
  }

  /// Indexes Main, claiming every file, and returns the main file's result.
  FileDefinitions index(StringRef Main) {
    CxxIndexerOptions Opts;
    Opts.IncludeDirs.push_back(Dir.str().str());
    CxxIndexer Indexer(Opts);
    auto TU = Indexer.indexTranslationUnit(Main, SourceLanguage::Cuda,
                                           [](StringRef) { return true; });
    for (CxxFileDefinitions &R : TU.Files)
      if (R.RealPath == Main)
        return std::move(R.Definitions);
    for (CxxFileDefinitions &R : TU.Files)
      ADD_FAILURE() << "recorded " << R.RealPath;
    ADD_FAILURE() << "main file not recorded: " << Main.str();
    return {};
  }

  static const Definition *find(const FileDefinitions &F, StringRef Qualified,
                                DefinitionKind K) {
    for (const Definition &D : F.Definitions)
      if (D.QualifiedName == Qualified && D.Kind == K)
        return &D;
    return nullptr;
  }

  SmallString<128> Dir;
};

TEST_F(CxxIndexerTest, KernelsWithMangledNamesAndFullSpans) {
  std::string Main = write("k.cu", R"(namespace a { namespace b {
__global__ void plain(float* x, int n) {
  x[0] = n;
}
template <int N>
__global__ void templated(float* x) {
  x[0] = N;
}
} }
)");
  FileDefinitions F = index(Main);
  const Definition *Plain = find(F, "a::b::plain", DefinitionKind::Kernel);
  ASSERT_TRUE(Plain);
  EXPECT_EQ(Plain->MangledName, "_ZN1a1b5plainEPfi");
  EXPECT_EQ(Plain->LineStart, 2u);
  EXPECT_EQ(Plain->LineEnd, 4u) << "the skipped body must still end the span";
  const Definition *T = find(F, "a::b::templated", DefinitionKind::Kernel);
  ASSERT_TRUE(T);
  EXPECT_TRUE(T->IsTemplate);
  EXPECT_TRUE(T->MangledName.empty());
  EXPECT_EQ(T->LineStart, 5u);
  EXPECT_EQ(T->LineEnd, 8u);
}

TEST_F(CxxIndexerTest, MissingHeaderDoesNotLoseTemplateBases) {
  std::string Main = write("m.cu", R"(#include "does/not/exist.h"
template <typename T> struct Base { T v; };
struct Derived : Base<int> { void f(); int g() const { return 1; } };
)");
  FileDefinitions F = index(Main);
  const Definition *D = find(F, "Derived", DefinitionKind::Struct);
  ASSERT_TRUE(D);
  EXPECT_EQ(D->Bases, (std::vector<std::string>{"Base"}));
  EXPECT_EQ(D->Methods, (std::vector<std::string>{"f", "g"}));
  EXPECT_GT(F.ParseErrors, 0u);
}

TEST_F(CxxIndexerTest, InactiveBranchKernelsAreFoundByTheLexer) {
  std::string Main = write("arch.cu", R"(namespace ns {
#if __CUDA_ARCH__ >= 900
__global__ void __launch_bounds__(128) sm90_kernel(int* p) { *p = 1; }
#endif
// __global__ in a comment is no kernel
#define MAKE __global__ void from_macro_definition() {}
}
)");
  FileDefinitions F = index(Main);
  const Definition *K = find(F, "ns::sm90_kernel", DefinitionKind::Kernel);
  ASSERT_TRUE(K);
  EXPECT_TRUE(K->FoundByLexer);
  EXPECT_EQ(K->LineStart, 3u);
  EXPECT_EQ(K->LineEnd, 3u);
  size_t Kernels = 0;
  for (const Definition &D : F.Definitions)
    Kernels += D.Kind == DefinitionKind::Kernel;
  EXPECT_EQ(Kernels, 1u);
}

TEST_F(CxxIndexerTest, UnclosedRecordAtTheFileStartEndsAtItsHead) {
  // Found by ekka-fuzz-cxx_indexer: a record the parser did not see (the
  // stray '/'), at byte 0, whose brace never closes, came out as lines 1-0.
  std::string Main = write("unclosed.cu", "/struct p{");
  FileDefinitions F = index(Main);
  const Definition *P = find(F, "p", DefinitionKind::Struct);
  ASSERT_TRUE(P);
  EXPECT_TRUE(P->FoundByLexer);
  EXPECT_EQ(P->LineStart, 1u);
  EXPECT_EQ(P->LineEnd, 1u);
  EXPECT_LE(P->ByteStart, P->ByteEnd);
  EXPECT_LE(P->ByteEnd, 10u);
}

TEST_F(CxxIndexerTest, TemplatesAskingForMillionsOfClassesStopAtTheLimit) {
  // Each F instantiates two more: 2^40 classes, days and terabytes of
  // Clang's time and memory, unless instantiation stops.
  std::string Bomb = write("bomb.cpp", R"(template <int N, int M> struct F {
  F<N - 1, 2 * M> a;
  F<N - 1, 2 * M + 1> b;
};
template <int M> struct F<0, M> { int v; };
F<40, 0> x;
struct After { int after() const; };
)");
  CxxIndexerOptions Opts;
  Opts.MaxASTMemory = 16 << 20;
  CxxIndexer Indexer(Opts);
  auto All = [](StringRef) { return true; };
  CxxTranslationUnit TU = Indexer.indexTranslationUnit(Bomb, SourceLanguage::Cxx, All);
  EXPECT_TRUE(TU.StoppedInstantiating);
  ASSERT_FALSE(TU.Files.empty());
  ASSERT_EQ(TU.Files[0].RealPath, Bomb); // the main file first
  const Definition *After = find(TU.Files[0].Definitions, "After", DefinitionKind::Struct);
  ASSERT_TRUE(After);
  EXPECT_EQ(After->Methods, (std::vector<std::string>{"after"}));

  // A unit within the limit instantiates every template it uses.
  std::string Plain = write("plain.cpp", "template <int N> struct G { G<N - 1> g; };\n"
                                         "template <> struct G<0> {};\nG<200> y;\n");
  CxxTranslationUnit PlainTU = Indexer.indexTranslationUnit(Plain, SourceLanguage::Cxx, All);
  EXPECT_FALSE(PlainTU.StoppedInstantiating);
  EXPECT_EQ(PlainTU.ParseErrors, 0u);
}

TEST_F(CxxIndexerTest, OnlyWantedFilesAreRecordedAndIncludesListed) {
  std::string Header = write("h.cuh", "struct InHeader {};\n");
  std::string Main = write("s.cu", "#include \"h.cuh\"\nstruct InSource {};\n");
  CxxIndexer Indexer({});
  auto TU = Indexer.indexTranslationUnit(
      Main, SourceLanguage::Cuda, [&](StringRef P) { return P == Main; });
  ASSERT_EQ(TU.Files.size(), 1u);
  EXPECT_EQ(TU.Files[0].RealPath, Main);
  ASSERT_EQ(TU.Files[0].Definitions.Definitions.size(), 1u);
  EXPECT_EQ(TU.Files[0].Definitions.Definitions[0].Name, "InSource");
  EXPECT_NE(llvm::find(TU.Includes, Header), TU.Includes.end());
}

TEST_F(CxxIndexerTest, RegistrationArgumentsThatAreNotTheFunction) {
  // `>>>` is one token in CUDA (a launch); a lambda's body compares with `<`;
  // tags come in braces.
  std::string Main = write("ops.cu", R"(TORCH_LIBRARY(t, m) {
  m.impl("nested", torch::kCPU, &ns::op<std::pair<int, std::pair<int, int>>>);
  m.def("lambda(Tensor a) -> Tensor", [](at::Tensor a) { return a.size(0) < 2 ? a : a; });
  m.def("tagged(Tensor a) -> Tensor", {at::Tag::pointwise, at::Tag::core});
  m.impl("after", &after);
}
)");
  FileDefinitions F = index(Main);
  auto Bases = [&](StringRef Op) {
    const Definition *D = find(F, Op, DefinitionKind::Op);
    return D ? D->Bases : std::vector<std::string>{"(not found)"};
  };
  EXPECT_EQ(Bases("t::nested"), std::vector<std::string>{"ns::op"});
  EXPECT_EQ(Bases("t::lambda"), std::vector<std::string>{"(lambda at line 3)"});
  EXPECT_EQ(Bases("t::tagged"), std::vector<std::string>{});
  EXPECT_EQ(Bases("t::after"), std::vector<std::string>{"after"});
  const Definition *Tagged = find(F, "t::tagged", DefinitionKind::Op);
  ASSERT_TRUE(Tagged);
  EXPECT_TRUE(Tagged->IsDeclaration);
}

} // namespace
