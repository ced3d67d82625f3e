//===- PluralTest.cpp -----------------------------------------------------===//
#include "ekka/Support/Plural.h"

#include <gtest/gtest.h>

using namespace ekka;

namespace {

TEST(Plural, CountsSayTheirNoun) {
  EXPECT_EQ(countOf(1, "module call"), "1 module call");
  EXPECT_EQ(countOf(0, "module call"), "0 module calls");
  EXPECT_EQ(countOf(3, "process", "processes"), "3 processes");
}

TEST(Plural, AscendingNumbersAreSaidAsRanges) {
  EXPECT_EQ(rangesOf({}), "");
  EXPECT_EQ(rangesOf({4}), "4");
  EXPECT_EQ(rangesOf({2, 3, 4, 5}), "2-5");
  EXPECT_EQ(rangesOf({1, 4}), "1, 4");
  EXPECT_EQ(rangesOf({2, 4, 5, 6}), "2, 4-6");
  EXPECT_EQ(rangesOf({1, 2, 7, 9, 10}), "1-2, 7, 9-10");
}

} // namespace
