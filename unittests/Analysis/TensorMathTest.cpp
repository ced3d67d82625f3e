//===- TensorMathTest.cpp -------------------------------------------------===//
#include "ekka/Analysis/TensorMath.h"
#include "ekka/Support/Lanes.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
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

TEST(TensorMath, WidensComplexAndUnsigned) {
  const float C[] = {1.5f, -2.0f, 0.0f, 3.0f}; // 1.5 - 2i, 3i
  auto A = toDoubles(DType::C64, llvm::StringRef(reinterpret_cast<const char *>(C), sizeof(C)));
  ASSERT_TRUE(A.has_value());
  EXPECT_EQ(*A, (std::vector<double>{1.5, -2.0, 0.0, 3.0}));
  EXPECT_EQ(unitRoundoff(DType::C64), unitRoundoff(DType::F32));
  EXPECT_EQ(unitRoundoff(DType::C128), unitRoundoff(DType::F64));
  const uint32_t U[] = {0, 4000000000u};
  auto B = toDoubles(DType::U32, llvm::StringRef(reinterpret_cast<const char *>(U), sizeof(U)));
  ASSERT_TRUE(B.has_value());
  EXPECT_EQ(*B, (std::vector<double>{0.0, 4e9}));
  EXPECT_EQ(unitRoundoff(DType::U32), 0.0);
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

// A whole's sums are its parts' added (a joined output's ratio is its
// steps'); a part with a NaN makes the whole not finite.
TEST(TensorMath, RatioSumsAddUp) {
  std::vector<double> T = {1, 2, 3, 4, 5}, R = {1, 2.5, 3, 4, 4}, Y = {1, 2, 3.5, 4, 5};
  llvm::ArrayRef<double> AT(T), AR(R), AY(Y);
  RatioSums Whole = ratioSums(AT, AR, AY);
  RatioSums Parts = ratioSums(AT.take_front(2), AR.take_front(2), AY.take_front(2));
  Parts += ratioSums(AT.drop_front(2), AR.drop_front(2), AY.drop_front(2));
  EXPECT_EQ(Parts.TR, Whole.TR);
  EXPECT_EQ(Parts.RR, Whole.RR);
  EXPECT_EQ(Parts.TY, Whole.TY);
  EXPECT_EQ(Parts.RY, Whole.RY);
  EXPECT_EQ(Parts.YY, Whole.YY);
  EXPECT_EQ(Parts.ST, 15);
  EXPECT_EQ(Parts.SR, 14.5);
  EXPECT_EQ(Parts.SY, 15.5);
  EXPECT_TRUE(Parts.Finite);
  std::vector<double> N = {std::nan("")};
  Parts += ratioSums(N, N, {});
  EXPECT_FALSE(Parts.Finite);
}

/// Values in a dtype's bytes (rounded to it) and as doubles.
struct Encoded {
  std::string Bytes;
  std::vector<double> Values;
};
Encoded encode(DType Type, const std::vector<double> &V) {
  Encoded E;
  for (double X : V) {
    if (Type == DType::F64) {
      E.Bytes.append(reinterpret_cast<const char *>(&X), 8);
      continue;
    }
    float F = float(X);
    uint32_t U;
    std::memcpy(&U, &F, 4);
    if (Type == DType::F32) {
      E.Bytes.append(reinterpret_cast<const char *>(&F), 4);
    } else if (Type == DType::BF16) {
      uint16_t H = uint16_t(U >> 16);
      E.Bytes.append(reinterpret_cast<const char *>(&H), 2);
    } else { // F16: small integers and halves are exact
      uint16_t H = 0;
      if (F != 0) {
        int Exp;
        float M = std::frexp(std::fabs(F), &Exp); // [0.5, 1)
        H = uint16_t((F < 0 ? 0x8000 : 0) | (uint16_t(Exp - 1 + 15) << 10) |
                     uint16_t(std::lround((M * 2 - 1) * 1024)));
      }
      E.Bytes.append(reinterpret_cast<const char *>(&H), 2);
    }
  }
  E.Values = *toDoubles(Type, E.Bytes);
  return E;
}

// The byte-level sums (four lanes, vector units, two threads for large
// tensors) are the plain sums of the widened values, for every dtype pair
// and every length, tails included; in the baseline build of the loop and
// in its AVX2 clone (where this CPU has it).
class ByteLevelSums : public ::testing::TestWithParam<int> {
  lanes::ScopedWideOverride Build{GetParam()};
};
INSTANTIATE_TEST_SUITE_P(TensorMath, ByteLevelSums, ::testing::Values(0, 1));

TEST_P(ByteLevelSums, AreThePlainSums) {
  std::mt19937 Gen(7);
  std::uniform_int_distribution<int> Small(-8, 8);
  for (size_t N : {size_t(0), size_t(1), size_t(3), size_t(4), size_t(5), size_t(1001),
                   (size_t(1) << 20) + 3}) {
    std::vector<double> T(N), R(N), Y(N);
    for (size_t I = 0; I < N; ++I) {
      // Halves of small integers: exact in every dtype here.
      Y[I] = Small(Gen) * 0.5;
      R[I] = Y[I] + (I % 3 == 0 ? 0.5 : 0);
      T[I] = Y[I] - (I % 5 == 0 ? 1 : 0);
    }
    for (DType A : {DType::F32, DType::BF16, DType::F16, DType::F64})
      for (DType B : {DType::F32, DType::BF16}) {
        Encoded ET = encode(A, T), ER = encode(B, R), EY = encode(DType::F32, Y);
        double TR = 0, RR = 0, TY = 0, RY = 0, YY = 0, ST = 0, SR = 0, SY = 0;
        for (size_t I = 0; I < N; ++I) {
          ST += T[I];
          SR += R[I];
          SY += Y[I];
          TR += (T[I] - R[I]) * (T[I] - R[I]);
          RR += R[I] * R[I];
          TY += (T[I] - Y[I]) * (T[I] - Y[I]);
          RY += (R[I] - Y[I]) * (R[I] - Y[I]);
          YY += Y[I] * Y[I];
        }
        std::string Case = "N=" + std::to_string(N) + " types " + std::to_string(int(A)) + "," +
                           std::to_string(int(B));
        ASSERT_EQ(ET.Values, T) << Case; // the test's values are exact
        auto Two = ratioSums(A, ET.Bytes, B, ER.Bytes, DType::F32, "", N);
        ASSERT_TRUE(Two.has_value()) << Case;
        EXPECT_TRUE(Two->Finite);
        // Exact: every product and partial sum is a small multiple of 1/4.
        EXPECT_EQ(Two->TR, TR) << Case;
        EXPECT_EQ(Two->RR, RR) << Case;
        EXPECT_EQ(Two->ST, ST) << Case; // the plain sums, which readers check
        EXPECT_EQ(Two->SR, SR) << Case;
        auto Three = ratioSums(A, ET.Bytes, B, ER.Bytes, DType::F32, EY.Bytes, N);
        ASSERT_TRUE(Three.has_value()) << Case;
        EXPECT_EQ(Three->TY, TY) << Case;
        EXPECT_EQ(Three->RY, RY) << Case;
        EXPECT_EQ(Three->YY, YY) << Case;
        EXPECT_EQ(Three->ST, ST) << Case;
        EXPECT_EQ(Three->SR, SR) << Case;
        EXPECT_EQ(Three->SY, SY) << Case;
      }
  }
  // Bytes of another size, a dtype it does not read: none.
  EXPECT_FALSE(ratioSums(DType::F32, std::string(8, '\0'), DType::F32, std::string(4, '\0'),
                         DType::F32, "", 2));
  EXPECT_FALSE(ratioSums(DType::I64, std::string(8, '\0'), DType::I64, std::string(8, '\0'),
                         DType::F32, "", 1));
  // A NaN anywhere: not finite, in the vector body and in the tail.
  for (size_t At : {size_t(1), size_t(8)}) {
    std::vector<double> V(9, 1.0);
    V[At] = std::nan("");
    Encoded E = encode(DType::F32, V), One = encode(DType::F32, std::vector<double>(9, 1.0));
    auto S = ratioSums(DType::F32, E.Bytes, DType::F32, One.Bytes, DType::F32, "", 9);
    ASSERT_TRUE(S.has_value());
    EXPECT_FALSE(S->Finite) << At;
  }
}

} // namespace
