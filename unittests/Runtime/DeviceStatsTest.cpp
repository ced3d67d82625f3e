//===- DeviceStatsTest.cpp - A GPU tensor's statistics, checked on a CPU ---===//
//
// The statistics kernel (lib/Runtime/DeviceStats.cu) and ATen's reductions,
// its fallback, must give what statsOfBytes gives on a CPU: min and max skip
// NaNs (NaN when every element is one), the sums take NaNs and infinities
// in. Without a GPU: the kernel's arithmetic (DeviceStatsMath.h) in the
// order the kernel applies it — a thread's grid-strided elements, a tree
// over a block's threads, the blocks' partials reduced by the last block —
// and the reductions on host tensors. utils/gpu-check runs the kernel.
//
//===----------------------------------------------------------------------===//
#include "../../lib/Runtime/DeviceStatsMath.h"
#include "../../lib/Runtime/TensorRecording.h"

#include "ekka/Trace/TraceFormat.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

using namespace ekka;

namespace {

namespace ds = ekka::devicestats;

ds::Acc tree(std::vector<ds::Acc> Threads) {
  for (int Half = ds::Threads / 2; Half > 0; Half /= 2)
    for (int I = 0; I < Half; ++I)
      ds::merge(Threads[I], Threads[I + Half]);
  return Threads[0];
}

/// What the kernel computes for the tensors \p Xs of one launch, on the
/// host: block by block of the grid, each finding its tensor as the kernel
/// does (planBlocks, itemOfBlock), its threads' grid-strided elements
/// within that tensor's blocks reduced in a tree; then each tensor's
/// blocks' partials reduced by its last block, in a tree too.
std::vector<TensorStats> likeOneLaunch(const std::vector<std::vector<double>> &Xs) {
  int Count = int(Xs.size());
  std::vector<int64_t> N;
  for (const auto &X : Xs)
    N.push_back(int64_t(X.size()));
  std::vector<uint32_t> FirstBlock(Count + 1);
  uint32_t Grid = ds::planBlocks(N.data(), Count, FirstBlock.data());
  std::vector<ds::Acc> Partials;
  for (uint32_t Block = 0; Block < Grid; ++Block) {
    int Item = ds::itemOfBlock(FirstBlock.data(), Count, Block);
    uint32_t Blocks = FirstBlock[Item + 1] - FirstBlock[Item];
    uint32_t Local = Block - FirstBlock[Item];
    std::vector<ds::Acc> Threads(ds::Threads, ds::start());
    for (int T = 0; T < ds::Threads; ++T)
      for (int64_t I = int64_t(Local) * ds::Threads + T; I < N[Item];
           I += int64_t(Blocks) * ds::Threads)
        ds::add(Threads[T], Xs[Item][I]);
    Partials.push_back(tree(Threads));
  }
  std::vector<TensorStats> Out;
  for (int Item = 0; Item < Count; ++Item) {
    uint32_t First = FirstBlock[Item], Blocks = FirstBlock[Item + 1] - First;
    ds::Acc All = Partials[First];
    if (Blocks > 1) {
      std::vector<ds::Acc> Threads(ds::Threads, ds::start());
      for (uint32_t T = 0; T < uint32_t(ds::Threads); ++T)
        for (uint32_t B = T; B < Blocks; B += ds::Threads)
          ds::merge(Threads[T], Partials[First + B]);
      All = tree(Threads);
    }
    double Six[6];
    ds::finish(All, N[Item], Six);
    Out.push_back(statsOfDoubles(Six));
  }
  return Out;
}

/// What a launch of its own computes for \p X, on the host, written apart
/// from likeOneLaunch: a grid of blocksFor(N) blocks, no item to find.
TensorStats likeALaunchOfItsOwn(const std::vector<double> &X) {
  int64_t N = int64_t(X.size());
  int Blocks = ds::blocksFor(N);
  std::vector<ds::Acc> Partials;
  for (int B = 0; B < Blocks; ++B) {
    std::vector<ds::Acc> Threads(ds::Threads, ds::start());
    for (int T = 0; T < ds::Threads; ++T)
      for (int64_t I = int64_t(B) * ds::Threads + T; I < N; I += int64_t(Blocks) * ds::Threads)
        ds::add(Threads[T], X[I]);
    Partials.push_back(tree(Threads));
  }
  ds::Acc All = Partials[0];
  if (Blocks > 1) {
    std::vector<ds::Acc> Threads(ds::Threads, ds::start());
    for (int T = 0; T < ds::Threads; ++T)
      for (int B = T; B < Blocks; B += ds::Threads)
        ds::merge(Threads[T], Partials[B]);
    All = tree(Threads);
  }
  double Out[6];
  ds::finish(All, N, Out);
  return statsOfDoubles(Out);
}

TensorStats likeTheKernel(const std::vector<double> &X) { return likeOneLaunch({X}).front(); }

TensorStats onTheCpu(const std::vector<double> &X) {
  llvm::StringRef Bytes(reinterpret_cast<const char *>(X.data()), X.size() * sizeof(double));
  return *statsOfBytes(DType::F64, Bytes);
}

/// Equal, but for the order of the sums' additions: within 1e-12 of the
/// sum of magnitudes; NaN equal to NaN.
void expectSame(const TensorStats &Got, const TensorStats &Want, const std::vector<double> &X,
                const char *What) {
  double Scale = 0, ScaleSq = 0;
  for (double V : X)
    if (std::isfinite(V)) {
      Scale += std::fabs(V);
      ScaleSq += V * V;
    }
  auto Near = [](double A, double B, double S) {
    if (std::isnan(B))
      return std::isnan(A);
    if (std::isinf(B))
      return A == B;
    return std::fabs(A - B) <= 1e-12 * std::max(S, 1.0);
  };
  auto Same = [](double A, double B) { return std::isnan(B) ? std::isnan(A) : A == B; };
  EXPECT_TRUE(Near(Got.Sum, Want.Sum, Scale)) << What << ": sum " << Got.Sum << " vs " << Want.Sum;
  EXPECT_TRUE(Near(Got.SumSq, Want.SumSq, ScaleSq))
      << What << ": sumsq " << Got.SumSq << " vs " << Want.SumSq;
  EXPECT_TRUE(Same(Got.Min, Want.Min)) << What << ": min " << Got.Min << " vs " << Want.Min;
  EXPECT_TRUE(Same(Got.Max, Want.Max)) << What << ": max " << Got.Max << " vs " << Want.Max;
  EXPECT_EQ(Got.NanCount, Want.NanCount) << What;
  EXPECT_EQ(Got.InfCount, Want.InfCount) << What;
}

const double Nan = std::numeric_limits<double>::quiet_NaN();
const double Inf = std::numeric_limits<double>::infinity();

/// Values of each kind the statistics treat apart, in tensors of one
/// block, two, many, and more than the grid's cap (a thread then takes
/// several elements per block stride).
std::vector<std::pair<std::string, std::vector<double>>> cases() {
  std::mt19937_64 Random(7);
  std::normal_distribution<double> Normal(0.5, 3.0);
  std::vector<std::pair<std::string, std::vector<double>>> Out;
  int64_t Capped = int64_t(ds::MaxBlocks) * ds::Threads * ds::PerThread + 12345;
  for (int64_t N : {int64_t(1), int64_t(255), int64_t(4096), int64_t(4097), int64_t(100003),
                    Capped}) {
    std::vector<double> X(N);
    for (double &V : X)
      V = Normal(Random);
    Out.push_back({"normal " + std::to_string(N), X});
    if (N > 300) {
      std::vector<double> Specials = X;
      Specials[7] = Nan;
      Specials[N / 2] = Inf;
      Specials[N - 1] = -Inf;
      Out.push_back({"NaN and infinities " + std::to_string(N), Specials});
      std::vector<double> OneNumber(N, Nan);
      OneNumber[N / 3] = -2.5;
      Out.push_back({"one number among NaNs " + std::to_string(N), OneNumber});
    }
    Out.push_back({"all NaN " + std::to_string(N), std::vector<double>(N, Nan)});
    std::vector<double> Infinities(N, Inf);
    Infinities[0] = -Inf;
    Out.push_back({"only infinities " + std::to_string(N), Infinities});
  }
  return Out;
}

TEST(DeviceStats, TheKernelsArithmeticGivesTheCpusStatistics) {
  for (const auto &[What, X] : cases())
    expectSame(likeTheKernel(X), onTheCpu(X), X, What.c_str());
}

// Several tensors in one launch: each gets the blocks it would get alone,
// and the same statistics, bit for bit (the same additions in the same
// order), whatever the others are.
TEST(DeviceStats, OneLaunchForSeveralTensorsGivesEachItsOwnStatistics) {
  std::vector<std::vector<double>> Xs;
  std::vector<std::string> Names;
  for (const auto &[What, X] : cases())
    if (X.size() < 200000) {
      Xs.push_back(X);
      Names.push_back(What);
    }
  ASSERT_LE(Xs.size(), size_t(ds::MaxItems));
  std::vector<TensorStats> Together = likeOneLaunch(Xs);
  ASSERT_EQ(Together.size(), Xs.size());
  for (size_t I = 0; I < Xs.size(); ++I) {
    TensorStats Alone = likeALaunchOfItsOwn(Xs[I]);
    auto Bits = [](double V) {
      uint64_t B;
      std::memcpy(&B, &V, sizeof B);
      return std::isnan(V) ? uint64_t(0x7ff8000000000000) : B;
    };
    EXPECT_EQ(Bits(Together[I].Sum), Bits(Alone.Sum)) << Names[I];
    EXPECT_EQ(Bits(Together[I].SumSq), Bits(Alone.SumSq)) << Names[I];
    EXPECT_EQ(Bits(Together[I].Min), Bits(Alone.Min)) << Names[I];
    EXPECT_EQ(Bits(Together[I].Max), Bits(Alone.Max)) << Names[I];
    EXPECT_EQ(Together[I].NanCount, Alone.NanCount) << Names[I];
    expectSame(Together[I], onTheCpu(Xs[I]), Xs[I], Names[I].c_str());
  }
}

TEST(DeviceStats, TheGridOfOneLaunch) {
  int64_t N[] = {1, ds::Threads * ds::PerThread + 1, int64_t(1) << 40, 5};
  uint32_t First[5];
  EXPECT_EQ(ds::planBlocks(N, 4, First), uint32_t(1 + 2 + ds::MaxBlocks + 1));
  EXPECT_EQ(First[0], 0u);
  EXPECT_EQ(First[1], 1u);
  EXPECT_EQ(First[2], 3u);
  EXPECT_EQ(First[3], uint32_t(3 + ds::MaxBlocks));
  EXPECT_EQ(First[4], uint32_t(4 + ds::MaxBlocks));
  for (uint32_t Block = 0; Block < First[4]; ++Block) {
    int Item = ds::itemOfBlock(First, 4, Block);
    EXPECT_LE(First[Item], Block);
    EXPECT_LT(Block, First[Item + 1]);
  }
  uint32_t One[2];
  EXPECT_EQ(ds::planBlocks(N, 1, One), 1u);
  EXPECT_EQ(ds::itemOfBlock(One, 1, 0), 0);
  // The most tensors of a launch, each as large as a grid of its own gets:
  // the grid still fits a launch's first dimension.
  std::vector<int64_t> Largest(ds::MaxItems, int64_t(1) << 40);
  std::vector<uint32_t> Firsts(ds::MaxItems + 1);
  EXPECT_EQ(ds::planBlocks(Largest.data(), ds::MaxItems, Firsts.data()),
            uint32_t(ds::MaxItems) * ds::MaxBlocks);
  EXPECT_EQ(ds::itemOfBlock(Firsts.data(), ds::MaxItems, uint32_t(ds::MaxItems) * ds::MaxBlocks - 1),
            ds::MaxItems - 1);
  EXPECT_EQ(size_t(ds::MaxItems), DeviceStatsBatcher::MaxItems);
}

// Without room for partials, each tensor of a launch takes one block.
TEST(DeviceStats, OneBlockEachWithoutRoomForPartials) {
  int64_t N[] = {1, int64_t(1) << 30, 70000};
  uint32_t First[4];
  EXPECT_EQ(ds::planBlocks(N, 3, First, /*OneEach=*/true), 3u);
  for (uint32_t Block = 0; Block < 3; ++Block)
    EXPECT_EQ(ds::itemOfBlock(First, 3, Block), int(Block));
}

// The room for partials: runs handed out first in, first out, free again
// once their launch is done and every run before it too; never more than
// there is, and no run over another.
TEST(DeviceStats, ThePartialsArena) {
  ds::PartialsArena A(100);
  int L1, L2, L3, L4, L5;
  EXPECT_EQ(A.take(0, &L1), 0u); // no run
  EXPECT_EQ(A.used(), 0u);
  EXPECT_EQ(A.take(40, &L1), 0u);
  EXPECT_EQ(A.take(40, &L2), 40u);
  EXPECT_EQ(A.take(30, &L3), std::nullopt); // 20 left at the end, none before
  EXPECT_EQ(A.take(101, &L3), std::nullopt);
  A.give(&L2); // done, but behind L1
  EXPECT_EQ(A.used(), 80u);
  EXPECT_EQ(A.take(30, &L3), std::nullopt);
  A.give(&L1); // both free now
  EXPECT_EQ(A.used(), 0u);
  EXPECT_EQ(A.take(30, &L3), 0u);
  EXPECT_EQ(A.take(60, &L4), 30u);
  A.give(&L3);
  EXPECT_EQ(A.take(20, &L5), 0u); // wrapped around: [90, 100) is too short
  EXPECT_EQ(A.used(), 90u);        // and unused until the runs before it are free
  EXPECT_EQ(A.take(11, &L1), std::nullopt); // [20, 30) holds 10
  EXPECT_EQ(A.take(10, &L1), 20u);
  EXPECT_EQ(A.used(), 100u);
  EXPECT_EQ(A.take(1, &L2), std::nullopt); // full
  A.give(&L4);
  A.give(&L5);
  A.give(&L1);
  EXPECT_EQ(A.used(), 0u);
  // Many rounds of launches done in order and out of it: the runs in
  // flight never overlap.
  ds::PartialsArena B(1000);
  std::vector<std::pair<int *, std::pair<uint32_t, uint32_t>>> Flying;
  std::vector<int> Owners(4000);
  std::mt19937 Random(3);
  for (int I = 0; I < 4000; ++I) {
    uint32_t N = 1 + Random() % 300;
    if (auto At = B.take(N, &Owners[I])) {
      for (const auto &[Owner, Run] : Flying)
        ASSERT_TRUE(*At + N <= Run.first || Run.second <= *At) << I;
      ASSERT_LE(*At + N, 1000u);
      Flying.push_back({&Owners[I], {*At, *At + N}});
    }
    if (!Flying.empty() && Random() % 2) {
      size_t K = Random() % Flying.size();
      B.give(Flying[K].first);
      Flying.erase(Flying.begin() + K);
    }
  }
}

TEST(DeviceStats, GridSizes) {
  EXPECT_EQ(ds::blocksFor(1), 1);
  EXPECT_EQ(ds::blocksFor(ds::Threads * ds::PerThread), 1);
  EXPECT_EQ(ds::blocksFor(ds::Threads * ds::PerThread + 1), 2);
  EXPECT_EQ(ds::blocksFor(int64_t(1) << 40), ds::MaxBlocks);
}

TEST(DeviceStats, TheReductionsFallbackGivesTheCpusStatistics) {
  // ATen's reductions, as a GPU tensor of another element type (or on a
  // GPU the kernel was not built for) gets them; here on host tensors.
  for (const auto &[What, X] : cases()) {
    if (X.size() > 200000)
      continue;
    at::Tensor T = at::from_blob(const_cast<double *>(X.data()), {int64_t(X.size())},
                                 at::kDouble);
    expectSame(statsByReductions(T), onTheCpu(X), X, What.c_str());
    std::vector<double> Rounded;
    for (double V : X)
      Rounded.push_back(double(float(V)));
    expectSame(statsByReductions(T.to(at::kFloat)), onTheCpu(Rounded), Rounded,
               (What + ", float").c_str());
  }
  at::Tensor Ints = at::arange(1000, at::kLong);
  TensorStats S = statsByReductions(Ints);
  EXPECT_EQ(S.Sum, 499500.0);
  EXPECT_EQ(S.Min, 0.0);
  EXPECT_EQ(S.Max, 999.0);
  EXPECT_EQ(S.NanCount, 0);
}

// The small floats of quantized inference: ATen has no sums for them (and
// no conversion for fp4), which the reductions go around; a GPU tensor of
// these types takes them. Every code, contiguous and as a transposed view.
TEST(DeviceStats, SmallFloatsReduceAsTheirBytesRead) {
  at::Tensor Codes = at::arange(256, at::kInt).to(at::kByte).reshape({16, 16});
  for (auto [Torch, Type] : {std::pair{at::kFloat8_e4m3fn, DType::F8E4M3},
                             {at::kFloat8_e5m2, DType::F8E5M2},
                             {at::kFloat8_e4m3fnuz, DType::F8E4M3FNUZ},
                             {at::kFloat8_e5m2fnuz, DType::F8E5M2FNUZ},
                             {at::kFloat8_e8m0fnu, DType::F8E8M0},
                             {at::kFloat4_e2m1fn_x2, DType::F4}}) {
    for (bool Transposed : {false, true}) {
      at::Tensor T = Codes.view(Torch);
      if (Transposed)
        T = T.t();
      EXPECT_EQ(traceDType(T), Type);
      at::Tensor Bytes = T.contiguous().view(at::kByte);
      std::string Raw(static_cast<const char *>(Bytes.const_data_ptr()), 256);
      std::vector<double> Values;
      for (char C : Raw) {
        double V[2];
        unsigned K = valuesOfByte(Type, uint8_t(C), V);
        Values.insert(Values.end(), V, V + K);
      }
      std::string What = std::string(dtypeName(Type)) + (Transposed ? ", transposed" : "");
      EXPECT_EQ(valueCount(T), int64_t(Values.size())) << What;
      expectSame(statsByReductions(T), *statsOfBytes(Type, Raw), Values, What.c_str());
      expectSame(tensorStats(T), *statsOfBytes(Type, Raw), Values, What.c_str());
    }
  }
}

// An fp4 tensor is described in 4-bit elements, as safetensors counts them.
TEST(DeviceStats, Float4TensorsAreDescribedInTheirValues) {
  at::Tensor T = at::zeros({3, 5}, at::kByte).view(at::kFloat4_e2m1fn_x2);
  TensorRecord R;
  ASSERT_TRUE(describeTensor(T, R));
  EXPECT_EQ(R.Type, DType::F4);
  EXPECT_EQ(std::vector<int64_t>(R.Shape.begin(), R.Shape.end()), (std::vector<int64_t>{3, 10}));
  EXPECT_EQ(std::vector<int64_t>(R.Strides.begin(), R.Strides.end()),
            (std::vector<int64_t>{10, 1}));
  TensorRecord Column;
  ASSERT_TRUE(describeTensor(T.t(), Column)); // a byte's two are not side by side
  EXPECT_EQ(std::vector<int64_t>(Column.Shape.begin(), Column.Shape.end()),
            (std::vector<int64_t>{5, 6}));
  EXPECT_TRUE(Column.Strides.empty());
  TensorRecord Scalar;
  ASSERT_TRUE(describeTensor(T[0][0], Scalar));
  EXPECT_EQ(std::vector<int64_t>(Scalar.Shape.begin(), Scalar.Shape.end()),
            (std::vector<int64_t>{2}));
}

} // namespace
