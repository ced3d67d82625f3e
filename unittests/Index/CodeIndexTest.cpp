//===- CodeIndexTest.cpp --------------------------------------------------===//
#include "ekka/Index/CodeIndex.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

using namespace ekka;
using namespace llvm;

namespace {

class CodeIndexTest : public ::testing::Test {
protected:
  void SetUp() override {
    ASSERT_FALSE(sys::fs::createUniqueDirectory("ekka-idx", Dir));
    Path = (Dir + "/index.db").str();
  }
  void TearDown() override { sys::fs::remove_directories(Dir); }

  static Definition def(StringRef Name, StringRef Qualified, DefinitionKind K,
                        uint64_t Begin, uint64_t End) {
    Definition D;
    D.Name = Name.str();
    D.QualifiedName = Qualified.str();
    D.Kind = K;
    D.ByteStart = Begin;
    D.ByteEnd = End;
    D.LineStart = D.LineEnd = 1;
    return D;
  }

  void fill() {
    auto Index = CodeIndex::openForWriting(Path);
    ASSERT_TRUE(bool(Index)) << toString(Index.takeError());
    ASSERT_FALSE(bool((*Index)->beginBatch()));
    StringRef Text = "class Attention:\n    pass\n";
    FileDefinitions Py;
    Py.Definitions.push_back(def("Attention", "models.llama.Attention",
                                 DefinitionKind::Class, 0, Text.size() - 1));
    Definition Jitted = def("_fwd_kernel", "models.triton._fwd_kernel",
                            DefinitionKind::Function, 0, 5);
    Jitted.Decorators = {"triton.heuristics({\"EVEN\": lambda a: True})", "triton.jit"};
    Py.Definitions.push_back(Jitted);
    Py.Definitions.push_back(def("_launch", "models.triton._launch",
                                 DefinitionKind::Function, 0, 5));
    IndexedFile F;
    F.Path = "/repo/models/llama.py";
    F.Module = "models.llama";
    ASSERT_FALSE(bool((*Index)->storeFile(F, Text, Py)));

    StringRef Cu = "__global__ void k(float*) {}";
    FileDefinitions Cxx;
    Definition K = def("k", "ns::k", DefinitionKind::Kernel, 0, Cu.size());
    K.MangledName = "_ZN2ns1kEPf";
    Cxx.Definitions.push_back(K);
    IndexedFile G;
    G.Path = "/repo/k.cu";
    G.Language = SourceLanguage::Cuda;
    ASSERT_FALSE(bool((*Index)->storeFile(G, Cu, Cxx)));
    ASSERT_FALSE(bool((*Index)->commitBatch()));
    ASSERT_FALSE(bool((*Index)->finish()));
  }

  SmallString<128> Dir;
  std::string Path;
};

TEST_F(CodeIndexTest, ClassDefinitionsBySimpleQualifiedAndSuffixName) {
  fill();
  auto Index = CodeIndex::openForReading(Path);
  ASSERT_TRUE(bool(Index));
  for (StringRef Name : {"Attention", "models.llama.Attention", "llama.Attention"}) {
    auto R = (*Index)->classDefinitions(Name);
    ASSERT_TRUE(bool(R));
    ASSERT_EQ(R->size(), 1u) << Name.str();
    EXPECT_EQ((*R)[0].Source, "class Attention:\n    pass");
    EXPECT_EQ((*R)[0].File, "/repo/models/llama.py");
  }
  auto None = (*Index)->classDefinitions("ttention");
  ASSERT_TRUE(bool(None));
  EXPECT_TRUE(None->empty());
}

TEST_F(CodeIndexTest, FindKernelByEveryName) {
  fill();
  auto Index = CodeIndex::openForReading(Path);
  ASSERT_TRUE(bool(Index));
  auto Mangled = (*Index)->findKernel("_ZN2ns1kEPf");
  ASSERT_TRUE(Mangled && Mangled->size() == 1u);
  EXPECT_EQ((*Mangled)[0].Relation, "mangled-name");
  auto Demangled = (*Index)->findKernel("void ns::k(float*)");
  ASSERT_TRUE(Demangled && Demangled->size() == 1u);
  EXPECT_EQ((*Demangled)[0].Relation, "qualified-name");
  auto Triton = (*Index)->findKernel("_fwd_kernel");
  ASSERT_TRUE(Triton && Triton->size() == 1u);
  EXPECT_EQ((*Triton)[0].Relation, "function-name");
  // Neither a Python function that is not jitted, nor one named by a C++
  // kernel's qualified or mangled name.
  for (StringRef Name : {"_launch", "ns::_fwd_kernel", "_ZN2ns11_fwd_kernelEPf"}) {
    auto None = (*Index)->findKernel(Name);
    ASSERT_TRUE(bool(None));
    EXPECT_TRUE(None->empty()) << Name.str();
  }
}

TEST_F(CodeIndexTest, ReplacingAFileReplacesItsDefinitions) {
  fill();
  {
    auto Index = CodeIndex::openForWriting(Path);
    ASSERT_TRUE(bool(Index));
    IndexedFile F;
    F.Path = "/repo/models/llama.py";
    ASSERT_FALSE(bool((*Index)->storeFile(F, "", FileDefinitions())));
    auto Counts = (*Index)->counts();
    ASSERT_TRUE(bool(Counts));
    EXPECT_EQ(Counts->Definitions, 1u);
  }
}

TEST_F(CodeIndexTest, ANewIndexAppearsOnlyWhenFinished) {
  {
    auto Index = CodeIndex::openForWriting(Path);
    ASSERT_TRUE(bool(Index));
    EXPECT_FALSE(sys::fs::exists(Path));
  } // dropped without finish(): nothing is left behind
  EXPECT_FALSE(sys::fs::exists(Path));
  std::error_code EC;
  sys::fs::directory_iterator It(Dir, EC);
  EXPECT_EQ(It, sys::fs::directory_iterator()) << "a temporary file was left";
}

TEST_F(CodeIndexTest, RefusesFilesThatAreNotIndexes) {
  {
    std::error_code EC;
    raw_fd_ostream OS(Path, EC);
    OS << "plain text, not SQLite, long enough to be read as a header......\n";
  }
  auto Read = CodeIndex::openForReading(Path);
  ASSERT_FALSE(bool(Read));
  EXPECT_NE(toString(Read.takeError()).find("is not an Ekka code index (file is not a database)"),
            std::string::npos);
  auto Write = CodeIndex::openForWriting(Path);
  ASSERT_FALSE(bool(Write));
  consumeError(Write.takeError());
}

TEST_F(CodeIndexTest, RefusesAnotherFormatVersion) {
  fill();
  {
    auto Db = SQLiteDatabase::open(Path, SQLiteDatabase::Mode::ReadWriteCreate);
    ASSERT_TRUE(bool(Db));
    ASSERT_FALSE(bool((*Db)->exec("UPDATE meta SET value = 'ekka-index 99' WHERE key = 'format'")));
  }
  auto Read = CodeIndex::openForReading(Path);
  ASSERT_FALSE(bool(Read));
  EXPECT_NE(toString(Read.takeError()).find("has index format 99; this ekka-index reads format 1"),
            std::string::npos);
}

} // namespace
