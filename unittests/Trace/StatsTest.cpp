//===- StatsTest.cpp - A tensor's statistics from its bytes ---------------===//
#include "ekka/Trace/TraceFormat.h"
#include "ekka/Support/Lanes.h"

#include <gtest/gtest.h>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace ekka;

namespace {

template <typename T> std::string bytesOf(const std::vector<T> &V) {
  return std::string(reinterpret_cast<const char *>(V.data()), V.size() * sizeof(T));
}

/// The statistics, element by element.
TensorStats plain(const std::vector<double> &V) {
  TensorStats S;
  S.Min = std::numeric_limits<double>::infinity();
  S.Max = -S.Min;
  for (double X : V) {
    S.Sum += X;
    S.SumSq += X * X;
    if (X != X) {
      ++S.NanCount;
      continue;
    }
    S.InfCount += std::isinf(X);
    S.Min = std::min(S.Min, X);
    S.Max = std::max(S.Max, X);
  }
  if (V.empty())
    S = TensorStats();
  else if (S.NanCount == int64_t(V.size()))
    S.Min = S.Max = std::nan("");
  return S;
}

void expectSame(const TensorStats &A, const TensorStats &B, const std::string &Case) {
  auto Same = [](double X, double Y) { return X == Y || (X != X && Y != Y); };
  EXPECT_TRUE(Same(A.Sum, B.Sum)) << Case << ": sum " << A.Sum << " vs " << B.Sum;
  EXPECT_TRUE(Same(A.SumSq, B.SumSq)) << Case;
  EXPECT_TRUE(Same(A.Min, B.Min)) << Case << ": min " << A.Min << " vs " << B.Min;
  EXPECT_TRUE(Same(A.Max, B.Max)) << Case << ": max " << A.Max << " vs " << B.Max;
  EXPECT_EQ(A.NanCount, B.NanCount) << Case;
  EXPECT_EQ(A.InfCount, B.InfCount) << Case;
}

// Four lanes, vector units, the tail in partly used lanes: the same
// statistics as one element after another, for every length and where the
// NaNs and infinities fall, and for the integer types; in the baseline
// build of the loop and in its AVX2 clone (where this CPU has it).
class Stats : public ::testing::TestWithParam<int> {
  lanes::ScopedWideOverride Build{GetParam()};
};
INSTANTIATE_TEST_SUITE_P(Lanes, Stats, ::testing::Values(0, 1));

TEST_P(Stats, TheLanesGiveThePlainStatistics) {
  std::mt19937 Gen(3);
  std::uniform_int_distribution<int> Small(-20, 20);
  const double Inf = std::numeric_limits<double>::infinity();
  // Eight elements a step in two chains, then four, then a partial tail.
  for (size_t N : {size_t(0), size_t(1), size_t(2), size_t(3), size_t(4), size_t(5), size_t(7),
                   size_t(8), size_t(9), size_t(11), size_t(12), size_t(13), size_t(15),
                   size_t(1000), size_t(1003), size_t(1005)}) {
    for (int Kind = 0; Kind < 4; ++Kind) {
      std::vector<double> V(N);
      for (double &X : V)
        X = Small(Gen) * 0.25; // exact in every float type, sums exact too
      if (Kind == 1 && N) // all positive: a tail lane must not bring a 0
        for (double &X : V)
          X = std::abs(X) + 1;
      if (Kind == 2 && N) { // NaN and infinities, last one in the tail
        V[N - 1] = std::nan("");
        V[N / 2] = Inf;
        V[0] = N > 2 ? -Inf : V[0];
      }
      if (Kind == 3) // all NaN
        for (double &X : V)
          X = std::nan("");
      std::string Case = "N=" + std::to_string(N) + " kind " + std::to_string(Kind);
      std::vector<float> F(V.begin(), V.end());
      std::vector<uint16_t> B;
      for (float X : F) {
        uint32_t U;
        std::memcpy(&U, &X, 4);
        B.push_back(uint16_t(U >> 16));
      }
      auto SF = statsOfBytes(DType::F32, bytesOf(F));
      auto SD = statsOfBytes(DType::F64, bytesOf(V));
      auto SB = statsOfBytes(DType::BF16, bytesOf(B));
      ASSERT_TRUE(SF && SD && SB);
      TensorStats Want = plain(V);
      expectSame(*SF, Want, Case + " f32");
      expectSame(*SD, Want, Case + " f64");
      expectSame(*SB, Want, Case + " bf16");
      if (Kind == 0) {
        std::vector<int32_t> I(N);
        std::vector<double> ID(N);
        for (size_t K = 0; K < N; ++K)
          ID[K] = I[K] = int32_t(V[K] * 4);
        auto SI = statsOfBytes(DType::I32, bytesOf(I));
        ASSERT_TRUE(SI);
        expectSame(*SI, plain(ID), Case + " i32");
      }
    }
  }
}

// Finite elements whose squares overflow a double: the common pass cannot
// accept sums that are not finite, and the counting pass it falls back to
// finds no infinity among the elements (only in the sum of squares).
TEST_P(Stats, AnOverflowingSumOfSquaresIsNoInfinity) {
  for (size_t N : {size_t(3), size_t(16), size_t(21)}) {
    std::vector<double> V(N, 1e200);
    V[N / 2] = -1e300;
    auto S = statsOfBytes(DType::F64, bytesOf(V));
    ASSERT_TRUE(S);
    expectSame(*S, plain(V), "N=" + std::to_string(N));
    EXPECT_EQ(S->InfCount, 0);
    EXPECT_TRUE(std::isinf(S->SumSq));
  }
}

// The other loaders: half and float8 element by element, the 1- and 8-byte
// integers through vector conversions.
TEST_P(Stats, EveryDTypeIsRead) {
  const double Inf = std::numeric_limits<double>::infinity();
  // half: 1, -2, 0.5, infinity, NaN, 0.25 (five elements: a tail)
  std::vector<uint16_t> Half = {0x3c00, 0xc000, 0x3800, 0x7c00, 0x7e00, 0x3400};
  auto H = statsOfBytes(DType::F16, bytesOf(Half));
  ASSERT_TRUE(H);
  expectSame(*H, plain({1, -2, 0.5, Inf, std::nan(""), 0.25}), "f16");
  // e4m3fn: 1, 448, -0.5, NaN
  std::vector<uint8_t> E4 = {0x38, 0x7e, 0xb0, 0x7f};
  auto F8 = statsOfBytes(DType::F8E4M3, bytesOf(E4));
  ASSERT_TRUE(F8);
  expectSame(*F8, plain({1, 448, -0.5, std::nan("")}), "e4m3");
  std::vector<int8_t> I8 = {-3, 5, 127, -128, 0};
  auto SI8 = statsOfBytes(DType::I8, bytesOf(I8));
  ASSERT_TRUE(SI8);
  expectSame(*SI8, plain({-3, 5, 127, -128, 0}), "i8");
  std::vector<uint64_t> U64 = {1, uint64_t(1) << 40, 7, 0, 3};
  auto SU = statsOfBytes(DType::U64, bytesOf(U64));
  ASSERT_TRUE(SU);
  expectSame(*SU, plain({1, std::ldexp(1.0, 40), 7, 0, 3}), "u64");
  std::vector<uint8_t> Bools = {1, 0, 1};
  auto SB = statsOfBytes(DType::Bool, bytesOf(Bools));
  ASSERT_TRUE(SB);
  expectSame(*SB, plain({1, 0, 1}), "bool");
  // Complex: the parts, real and imaginary together; C32's are halves.
  std::vector<float> C64 = {0, -1, 1, -2, 2, -3, std::nanf(""), 4};
  auto SC = statsOfBytes(DType::C64, bytesOf(C64));
  ASSERT_TRUE(SC);
  expectSame(*SC, plain({0, -1, 1, -2, 2, -3, std::nan(""), 4}), "c64");
  std::vector<double> C128 = {0.5, -Inf, 3, 1};
  auto SD = statsOfBytes(DType::C128, bytesOf(C128));
  ASSERT_TRUE(SD);
  expectSame(*SD, plain({0.5, -Inf, 3, 1}), "c128");
  std::vector<uint16_t> C32 = {0x3c00, 0xc000}; // 1 - 2i
  auto SH = statsOfBytes(DType::C32, bytesOf(C32));
  ASSERT_TRUE(SH);
  expectSame(*SH, plain({1, -2}), "c32");
}

TEST(DTypes, ComplexTypesAreNamedAndSized) {
  for (DType T : {DType::C32, DType::C64, DType::C128})
    EXPECT_EQ(parseDType(dtypeName(T)), T);
  EXPECT_EQ(dtypeBits(DType::C32), 32u);
  EXPECT_EQ(dtypeBits(DType::C64), 64u);
  EXPECT_EQ(dtypeBits(DType::C128), 128u);
  EXPECT_EQ(partType(DType::C64), DType::F32);
  EXPECT_EQ(partType(DType::BF16), DType::BF16);
  // safetensors has C64 alone: the others are not captured.
  EXPECT_TRUE(storableDType(DType::C64));
  EXPECT_FALSE(storableDType(DType::C32));
  EXPECT_FALSE(storableDType(DType::C128));
}

// The small floats of quantized inference, named as safetensors 0.8 names
// them, each code's value as the OCP and AMD formats define it.
TEST(DTypes, SmallFloatsAreNamedSizedAndRead) {
  for (DType T : {DType::F8E4M3FNUZ, DType::F8E5M2FNUZ, DType::F8E8M0, DType::F4}) {
    EXPECT_EQ(parseDType(dtypeName(T)), T);
    EXPECT_TRUE(storableDType(T));
  }
  EXPECT_EQ(dtypeName(DType::F8E4M3FNUZ), "F8_E4M3FNUZ");
  EXPECT_EQ(dtypeName(DType::F8E8M0), "F8_E8M0");
  EXPECT_EQ(dtypeName(DType::F4), "F4");
  EXPECT_EQ(dtypeBits(DType::F8E8M0), 8u);
  EXPECT_EQ(dtypeBits(DType::F4), 4u);
  EXPECT_EQ(dtypeBytes(DType::F4, 6), 3u);
  EXPECT_EQ(dtypeBytes(DType::F4, 7), 4u);
  EXPECT_EQ(dtypeBytes(DType::BF16, 3), 6u);
  EXPECT_EQ(dtypeBytes(DType::F64, uint64_t(1) << 61), std::nullopt);

  const double NaN = std::nan(""), Tiny = std::ldexp(1.0, -10);
  // e4m3fnuz: bias 8, NaN where -0 would be, no infinities.
  std::vector<std::pair<uint8_t, double>> E4 = {
      {0x00, 0}, {0x01, Tiny}, {0x40, 1}, {0x7f, 240}, {0xff, -240}, {0xc0, -1}, {0x80, NaN}};
  for (auto [B, V] : E4) {
    double Got = float8e4m3fnuzToDouble(B);
    EXPECT_TRUE(Got == V || (Got != Got && V != V)) << "e4m3fnuz " << int(B) << ": " << Got;
  }
  // e5m2fnuz: bias 16; its largest is 57344, as e5m2's, which has infinities.
  EXPECT_EQ(float8e5m2fnuzToDouble(0x40), 1.0);
  EXPECT_EQ(float8e5m2fnuzToDouble(0x7f), 57344.0);
  EXPECT_EQ(float8e5m2fnuzToDouble(0x01), std::ldexp(1.0, -17));
  EXPECT_TRUE(std::isnan(float8e5m2fnuzToDouble(0x80)));
  // e8m0: 2^(b - 127), unsigned, all ones NaN.
  EXPECT_EQ(float8e8m0ToDouble(0x7f), 1.0);
  EXPECT_EQ(float8e8m0ToDouble(0x80), 2.0);
  EXPECT_EQ(float8e8m0ToDouble(0x00), std::ldexp(1.0, -127));
  EXPECT_TRUE(std::isnan(float8e8m0ToDouble(0xff)));
  // e2m1: the sixteen codes.
  const double E2M1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (unsigned C = 0; C < 16; ++C)
    EXPECT_EQ(float4e2m1ToDouble(uint8_t(C)), E2M1[C]) << C;
  // Two to a byte, the low bits' first.
  double Two[2];
  ASSERT_EQ(valuesOfByte(DType::F4, 0xF7, Two), 2u);
  EXPECT_EQ(Two[0], 6.0);
  EXPECT_EQ(Two[1], -6.0);
  EXPECT_EQ(valuesOfByte(DType::F32, 0, Two), 0u);
}

// An F4 tensor's statistics are over its 4-bit values; a byte histogram
// gives any byte type's (a GPU counts bytes rather than widen them).
TEST(DTypes, ByteHistogramsGiveTheStatisticsOfTheValues) {
  std::mt19937 Random(3);
  for (DType T : {DType::F4, DType::F8E4M3, DType::F8E5M2, DType::F8E4M3FNUZ,
                  DType::F8E5M2FNUZ, DType::F8E8M0, DType::U8, DType::I8}) {
    for (size_t N : {size_t(1), size_t(256), size_t(1001)}) {
      std::string Bytes(N, 0);
      for (size_t I = 0; I < N; ++I)
        Bytes[I] = char(N == 256 ? I : Random() & 0xFF); // every code once
      std::vector<double> Values;
      int64_t Counts[256] = {};
      for (char C : Bytes) {
        double V[2];
        unsigned K = valuesOfByte(T, uint8_t(C), V);
        Values.insert(Values.end(), V, V + K);
        ++Counts[uint8_t(C)];
      }
      std::string Case = std::string(dtypeName(T)) + " x" + std::to_string(N);
      auto FromBytes = statsOfBytes(T, Bytes);
      auto FromCounts = statsOfByteCounts(T, Counts);
      ASSERT_TRUE(FromBytes && FromCounts) << Case;
      TensorStats Want = plain(Values);
      // The sums in another order: equal to a relative 1e-12.
      for (TensorStats *Got : {&*FromBytes, &*FromCounts}) {
        auto Near = [](double A, double B) {
          return (A != A && B != B) || A == B || std::fabs(A - B) <= 1e-12 * std::fabs(B);
        };
        EXPECT_TRUE(Near(Got->Sum, Want.Sum)) << Case << ": " << Got->Sum << " vs " << Want.Sum;
        EXPECT_TRUE(Near(Got->SumSq, Want.SumSq)) << Case;
        TensorStats Exact = *Got;
        Exact.Sum = Want.Sum;
        Exact.SumSq = Want.SumSq;
        expectSame(Exact, Want, Case);
      }
    }
  }
  int64_t Counts[256] = {};
  EXPECT_FALSE(statsOfByteCounts(DType::F32, Counts));
  auto Empty = statsOfByteCounts(DType::F4, Counts);
  ASSERT_TRUE(Empty);
  expectSame(*Empty, TensorStats(), "no bytes");
}

} // namespace
