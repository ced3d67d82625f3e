//===- ProgressTest.cpp ---------------------------------------------------===//
#include "ekka/Support/Progress.h"

#include <gtest/gtest.h>

using namespace ekka;

namespace {

TEST(Progress, APhaseIsItsName) {
  EXPECT_EQ(progressLine("reading the target trace", 0, 0, "", 3.0),
            "reading the target trace ...");
}

TEST(Progress, ACountShowsDoneOfTotalAndAfterASecondItsRate) {
  std::string Early = progressLine("reading files", 50, 200, "files", 0.5);
  EXPECT_NE(Early.find("[####............] 50/200 files"), std::string::npos) << Early;
  EXPECT_EQ(Early.find("/s"), std::string::npos) << Early;

  std::string Later = progressLine("reading files", 150, 200, "files", 3.0);
  EXPECT_NE(Later.find("150/200 files  50 files/s  3s"), std::string::npos) << Later;
  EXPECT_NE(Later.find("[############....]"), std::string::npos) << Later;

  // Slow work keeps a decimal; more done than the total is the total.
  EXPECT_NE(progressLine("comparing", 9, 4, "calls", 2.0).find("4/4 calls  2.0 calls/s"),
            std::string::npos);
}

TEST(Progress, TheLineFitsTheTerminal) {
  std::string Line = progressLine("parsing C/C++/CUDA", 10, 4000, "files", 12.0, 40);
  EXPECT_EQ(Line.size(), 39u);
  EXPECT_EQ(Line.rfind("parsing C/C++/CUDA", 0), 0u);
}

} // namespace
