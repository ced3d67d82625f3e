//===- SourceFilesTest.cpp ------------------------------------------------===//
#include "ekka/Support/SourceFiles.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

#include <map>

#include <sys/stat.h>

using namespace ekka;
using namespace llvm;

namespace {

class TempDir {
public:
  TempDir() { EXPECT_FALSE(sys::fs::createUniqueDirectory("ekka-test", Path)); }
  ~TempDir() { sys::fs::remove_directories(Path); }
  std::string file(StringRef Rel, StringRef Content) {
    SmallString<256> P(Path);
    sys::path::append(P, Rel);
    sys::fs::create_directories(sys::path::parent_path(P));
    std::error_code EC;
    raw_fd_ostream OS(P, EC);
    OS << Content;
    return P.str().str();
  }
  SmallString<256> Path;
};

TEST(SourceFiles, LanguageByExtension) {
  EXPECT_EQ(languageForPath("a/b.py"), SourceLanguage::Python);
  EXPECT_EQ(languageForPath("k.cu"), SourceLanguage::Cuda);
  EXPECT_EQ(languageForPath("k.cuh"), SourceLanguage::Cuda);
  EXPECT_EQ(languageForPath("x.hpp"), SourceLanguage::Cxx);
  EXPECT_EQ(languageForPath("x.c"), SourceLanguage::C);
  EXPECT_FALSE(languageForPath("README.md"));
  EXPECT_TRUE(isHeaderPath("x.cuh"));
  EXPECT_FALSE(isHeaderPath("x.cu"));
}

TEST(SourceFiles, ClassifyContent) {
  EXPECT_EQ(classifyContent("class A:\n    pass\n"), ContentProblem::None);
  EXPECT_EQ(classifyContent("s = \"caf\xc3\xa9\"\n"), ContentProblem::None);
  EXPECT_EQ(classifyContent("s = \"caf\xe9\"\n"), ContentProblem::NotUTF8);
  EXPECT_EQ(classifyContent(StringRef("a\0b", 3)), ContentProblem::Binary);
}

TEST(SourceFiles, WalkSkipsHiddenDirsAndSymlinkLoops) {
  TempDir T;
  T.file("pkg/a.py", "x = 1\n");
  T.file("pkg/sub/b.cu", "\n");
  T.file(".git/c.py", "\n");
  T.file("notes.txt", "\n");
  SmallString<256> Link(T.Path);
  sys::path::append(Link, "pkg", "sub", "loop");
  ASSERT_FALSE(sys::fs::create_link("..", Link));

  WalkStats Stats;
  auto Files = collectSourceFiles({T.Path.str().str()}, Stats);
  ASSERT_TRUE(bool(Files));
  ASSERT_EQ(Files->size(), 2u);
  EXPECT_TRUE(StringRef((*Files)[0].Path).ends_with("pkg/a.py"));
  EXPECT_TRUE(StringRef((*Files)[1].Path).ends_with("pkg/sub/b.cu"));
  EXPECT_EQ(Stats.SymlinkLoops, 1u);
  EXPECT_EQ(Stats.OtherFiles, 1u);
}

TEST(SourceFiles, WalkStaysInsideTheRootAndNamesFilesByRealPath) {
  TempDir T;
  T.file("repo/pkg/a.py", "x = 1\n");
  T.file("other/o.py", "y = 1\n");
  SmallString<256> Repo(T.Path), Up, OutLink, RepoLink(T.Path);
  sys::path::append(Repo, "repo");
  (Up = Repo) += "/up";
  (OutLink = Repo) += "/o.py";
  sys::path::append(RepoLink, "repolink");
  ASSERT_FALSE(sys::fs::create_link("..", Up));
  ASSERT_FALSE(sys::fs::create_link("../other/o.py", OutLink));
  ASSERT_FALSE(sys::fs::create_link("repo", RepoLink));

  SmallString<256> RealA;
  ASSERT_FALSE(sys::fs::real_path(Repo + "/pkg/a.py", RealA));
  for (StringRef Root : {Repo.str(), RepoLink.str()}) {
    WalkStats Stats;
    auto Files = collectSourceFiles({Root.str()}, Stats);
    ASSERT_TRUE(bool(Files));
    ASSERT_EQ(Files->size(), 1u) << Root.str();
    EXPECT_EQ((*Files)[0].Path, RealA.str());
    EXPECT_EQ(Stats.OutsideRoot, 2u);
    EXPECT_EQ(Stats.SymlinkLoops, 0u);
  }
}

// What a file listed by the walk may have become by the time it is read.
TEST(SourceFiles, ReadSourceTextRefusesWhatIsNoLongerASource) {
  TempDir T;
  std::string Text;
  std::string Small = T.file("a.py", "x = 1\n");
  EXPECT_EQ(readSourceText(Small, 6, Text), "");
  EXPECT_EQ(Text, "x = 1\n");
  EXPECT_EQ(readSourceText(Small, 5, Text), "too-large");
  EXPECT_EQ(readSourceText((T.Path + "/gone.py").str(), 100, Text), "vanished");
  // A FIFO is opened without waiting for a writer, then refused.
  std::string Fifo = (T.Path + "/fifo.py").str();
  ASSERT_EQ(::mkfifo(Fifo.c_str(), 0644), 0);
  EXPECT_EQ(readSourceText(Fifo, 100, Text), "special-file");
}

TEST(SourceFiles, WalkNamesWhyItSkips) {
  TempDir T;
  T.file("ok.py", "\n");
  T.file("caf\xe9.py", "\n");
  std::string Fifo = (T.Path + "/fifo.cu").str();
  ASSERT_EQ(::mkfifo(Fifo.c_str(), 0644), 0);
  ASSERT_FALSE(sys::fs::create_link("self.py", T.Path + "/self.py"));
  ASSERT_FALSE(sys::fs::create_link("missing.py", T.Path + "/dangling.py"));

  WalkStats Stats;
  auto Files = collectSourceFiles({T.Path.str().str()}, Stats);
  ASSERT_TRUE(bool(Files));
  ASSERT_EQ(Files->size(), 1u);
  std::map<std::string, std::string> Why;
  for (const auto &[Path, Reason] : Stats.Skipped)
    Why[sys::path::filename(Path).str()] = Reason;
  EXPECT_EQ(Why["caf\xe9.py"], "not-utf8-name");
  EXPECT_EQ(Why["fifo.cu"], "special-file");
  EXPECT_EQ(Why["self.py"], "symlink-loop");
  EXPECT_EQ(Why["dangling.py"], "dangling-symlink");
  EXPECT_EQ(Stats.SymlinkLoops, 1u);
  EXPECT_EQ(Stats.Unreadable, 3u);
}

TEST(SourceFiles, MissingRootIsAnError) {
  WalkStats Stats;
  auto Files = collectSourceFiles({"/definitely/not/here"}, Stats);
  ASSERT_FALSE(bool(Files));
  EXPECT_NE(toString(Files.takeError()).find("cannot read '/definitely/not/here'"),
            std::string::npos);
}

} // namespace
