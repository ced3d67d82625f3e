//===- TensorMathTest.cpp -------------------------------------------------===//
#include "ekka/Analysis/TensorMath.h"

#include <cmath>
#include <cstring>
#include <gtest/gtest.h>

using namespace ekka;

namespace {

TEST(TensorMath, WidensFloat8) {
  // e4m3fn: 1, 448 (its largest), -0.5, the smallest subnormal, NaN.
  const char E4[] = {0x38, 0x7e, char(0xb0), 0x01, 0x7f};
  auto A = toDoubles(DType::F8E4M3, llvm::StringRef(E4, 5));
  ASSERT_TRUE(A.has_value());
  EXPECT_EQ((*A)[0], 1.0);
  EXPECT_EQ((*A)[1], 448.0);
  EXPECT_EQ((*A)[2], -0.5);
  EXPECT_EQ((*A)[3], std::ldexp(1.0, -9));
  EXPECT_TRUE(std::isnan((*A)[4]));
  // e5m2: 1, 57344 (its largest), infinity, NaN.
  const char E5[] = {0x3c, 0x7b, 0x7c, 0x7d};
  auto B = toDoubles(DType::F8E5M2, llvm::StringRef(E5, 4));
  ASSERT_TRUE(B.has_value());
  EXPECT_EQ((*B)[0], 1.0);
  EXPECT_EQ((*B)[1], 57344.0);
  EXPECT_TRUE(std::isinf((*B)[2]));
  EXPECT_TRUE(std::isnan((*B)[3]));
  // The writer's statistics of captured FP8 bytes.
  auto S = statsOfBytes(DType::F8E4M3, llvm::StringRef(E4, 4));
  ASSERT_TRUE(S.has_value());
  EXPECT_EQ(S->Max, 448.0);
  EXPECT_EQ(S->Min, -0.5);
}

TEST(TensorMath, WidensHalfAndBFloat16) {
  uint16_t Half[3] = {0x3c00, 0xc000, 0x3555}; // 1, -2, ~0.333
  auto H = toDoubles(DType::F16, llvm::StringRef(reinterpret_cast<char *>(Half), 6));
  ASSERT_TRUE(H.has_value());
  EXPECT_EQ((*H)[0], 1.0);
  EXPECT_EQ((*H)[1], -2.0);
  EXPECT_NEAR((*H)[2], 1.0 / 3, 1e-3);
  uint16_t BF[2] = {0x3f80, 0x4049}; // 1, ~3.14
  auto B = toDoubles(DType::BF16, llvm::StringRef(reinterpret_cast<char *>(BF), 4));
  ASSERT_TRUE(B.has_value());
  EXPECT_EQ((*B)[0], 1.0);
  EXPECT_NEAR((*B)[1], 3.14, 0.01);
}

TEST(TensorMath, NormsAndFirstDifference) {
  std::vector<double> A = {3, 4}, B = {3, 0};
  EXPECT_DOUBLE_EQ(norm(A), 5);
  EXPECT_DOUBLE_EQ(distance(A, B), 4);
  EXPECT_EQ(firstDifference(A, B), std::optional<size_t>(1));
  EXPECT_EQ(firstDifference(A, A), std::nullopt);
  EXPECT_EQ(firstDifference({1, 2}, {1, 2, 3}), std::optional<size_t>(2));
  EXPECT_EQ(unitRoundoff(DType::I64), 0);
  EXPECT_EQ(unitRoundoff(DType::BF16), std::ldexp(1.0, -8));
}

} // namespace
