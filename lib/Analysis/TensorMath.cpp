//===- TensorMath.cpp -----------------------------------------------------===//
#include "ekka/Analysis/TensorMath.h"
#include "ekka/Support/Lanes.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <system_error>
#include <thread>

namespace ekka {

namespace {

template <typename T> std::vector<double> widen(llvm::StringRef Bytes) {
  size_t N = Bytes.size() / sizeof(T);
  // Shards align their tensors (a trace's own always do): converted in one
  // pass, without first zeroing the result.
  if (reinterpret_cast<uintptr_t>(Bytes.data()) % alignof(T) == 0) {
    const T *P = reinterpret_cast<const T *>(Bytes.data());
    return std::vector<double>(P, P + N);
  }
  std::vector<double> Out(N);
  const char *P = Bytes.data();
  for (size_t I = 0; I < N; ++I) {
    T V;
    std::memcpy(&V, P + I * sizeof(T), sizeof(T));
    Out[I] = double(V);
  }
  return Out;
}

template <double (*Convert)(uint16_t)> std::vector<double> widen16(llvm::StringRef Bytes) {
  size_t N = Bytes.size() / 2;
  std::vector<double> Out(N);
  for (size_t I = 0; I < N; ++I) {
    uint16_t V;
    std::memcpy(&V, Bytes.data() + 2 * I, 2);
    Out[I] = Convert(V);
  }
  return Out;
}

template <double (*Convert)(uint8_t)> std::vector<double> widen8(llvm::StringRef Bytes) {
  std::vector<double> Out(Bytes.size());
  for (size_t I = 0; I < Bytes.size(); ++I)
    Out[I] = Convert(uint8_t(Bytes[I]));
  return Out;
}

} // namespace

std::optional<std::vector<double>> toDoubles(DType Type, llvm::StringRef Bytes) {
  switch (partType(Type)) { // a complex tensor's parts, interleaved
  case DType::F32: return widen<float>(Bytes);
  case DType::F64: return widen<double>(Bytes);
  case DType::F16: return widen16<halfToDouble>(Bytes);
  case DType::BF16: return widen16<bfloat16ToDouble>(Bytes);
  case DType::F8E4M3: return widen8<float8e4m3ToDouble>(Bytes);
  case DType::F8E5M2: return widen8<float8e5m2ToDouble>(Bytes);
  case DType::F8E4M3FNUZ: return widen8<float8e4m3fnuzToDouble>(Bytes);
  case DType::F8E5M2FNUZ: return widen8<float8e5m2fnuzToDouble>(Bytes);
  case DType::F8E8M0: return widen8<float8e8m0ToDouble>(Bytes);
  case DType::F4: {
    std::vector<double> Out(2 * Bytes.size()); // a byte's two, the low bits' first
    for (size_t I = 0; I < Bytes.size(); ++I)
      valuesOfByte(Type, uint8_t(Bytes[I]), &Out[2 * I]);
    return Out;
  }
  case DType::I64: return widen<int64_t>(Bytes);
  case DType::I32: return widen<int32_t>(Bytes);
  case DType::I16: return widen<int16_t>(Bytes);
  case DType::I8: return widen<int8_t>(Bytes);
  case DType::U8: return widen<uint8_t>(Bytes);
  case DType::Bool: return widen<uint8_t>(Bytes);
  case DType::U16: return widen<uint16_t>(Bytes);
  case DType::U32: return widen<uint32_t>(Bytes);
  case DType::U64: return widen<uint64_t>(Bytes);
  default: return std::nullopt;
  }
}

double unitRoundoff(DType Type) {
  switch (partType(Type)) {
  case DType::F64: return std::ldexp(1.0, -53);
  case DType::F32: return std::ldexp(1.0, -24);
  case DType::F16: return std::ldexp(1.0, -11);
  case DType::BF16: return std::ldexp(1.0, -8);
  case DType::F8E4M3: return std::ldexp(1.0, -4);
  case DType::F8E5M2: return std::ldexp(1.0, -3);
  case DType::F8E4M3FNUZ: return std::ldexp(1.0, -4);
  case DType::F8E5M2FNUZ: return std::ldexp(1.0, -3);
  case DType::F4: return std::ldexp(1.0, -2);
  // Powers of two alone: a value between two is at most a third off the
  // nearer (the arithmetic mean rounding to a power).
  case DType::F8E8M0: return std::ldexp(1.0, -1);
  default: return 0;
  }
}

namespace {

/// The sum of squares of A[I] - B[I] (of A[I] without B), over I < N, in
/// four independent sums: the loop runs at the rate of the loads rather
/// than of one chain of additions. Not finite if any element is not.
template <bool WithB> double sumOfSquares(const double *A, const double *B, size_t N) {
  double S[4] = {0, 0, 0, 0};
  size_t I = 0;
  for (; I + 4 <= N; I += 4)
    for (size_t J = 0; J < 4; ++J) {
      double D = WithB ? A[I + J] - B[I + J] : A[I + J];
      S[J] += D * D;
    }
  for (; I < N; ++I) {
    double D = WithB ? A[I] - B[I] : A[I];
    S[0] += D * D;
  }
  return (S[0] + S[1]) + (S[2] + S[3]);
}

} // namespace

double distance(llvm::ArrayRef<double> A, llvm::ArrayRef<double> B) {
  size_t N = std::min(A.size(), B.size());
  double Fast = sumOfSquares<true>(A.data(), B.data(), N);
  if (std::isfinite(Fast))
    return std::sqrt(Fast);
  double S = 0;
  for (size_t I = 0; I < N; ++I) {
    double X = A[I], Y = B[I];
    if (!std::isfinite(X) || !std::isfinite(Y)) {
      // The same NaN or infinity on both sides agrees; anything else is
      // as far apart as can be.
      bool Same = (std::isnan(X) && std::isnan(Y)) || X == Y;
      if (!Same)
        return std::numeric_limits<double>::infinity();
      continue;
    }
    double D = X - Y;
    S += D * D;
  }
  return std::sqrt(S);
}

double norm(llvm::ArrayRef<double> A) {
  double Fast = sumOfSquares<false>(A.data(), nullptr, A.size());
  if (std::isfinite(Fast))
    return std::sqrt(Fast);
  double S = 0;
  for (double V : A)
    if (std::isfinite(V))
      S += V * V;
  return std::sqrt(S);
}

namespace {

using lanes::Double4;
using LoadF32 = lanes::LoadAs<float>;
using LoadF64 = lanes::LoadAs<double>;
using LoadBF16 = lanes::LoadBF16;
using LoadF16 = lanes::LoadBy<uint16_t, halfToDouble>;

/// Calls \p F with the loader of \p Type; false when there is none.
template <typename Fn> bool withLoader(DType Type, Fn &&F) {
  switch (Type) {
  case DType::F32: F(LoadF32()); return true;
  case DType::F64: F(LoadF64()); return true;
  case DType::BF16: F(LoadBF16()); return true;
  case DType::F16: F(LoadF16()); return true;
  default: return false;
  }
}

// Four lanes of independent sums (ekka/Support/Lanes.h).
template <typename A, typename B, typename C>
RatioSums bytesSums3(const char *X, const char *R, const char *Y, size_t N) {
  // Against an FP32 reference R needs no Σ(XT−XR)².
  Double4 TY = {}, RY = {}, YY = {}, ST = {}, SR = {}, SY = {};
  size_t I = 0;
  for (; I + 4 <= N; I += 4) {
    Double4 XT = A::at4(X + I * A::Size), XR = B::at4(R + I * B::Size),
            YR = C::at4(Y + I * C::Size);
    TY += (XT - YR) * (XT - YR);
    RY += (XR - YR) * (XR - YR);
    YY += YR * YR;
    ST += XT;
    SR += XR;
    SY += YR;
  }
  for (; I < N; ++I) {
    double XT = A::at(X + I * A::Size), XR = B::at(R + I * B::Size), YR = C::at(Y + I * C::Size);
    TY[0] += (XT - YR) * (XT - YR);
    RY[0] += (XR - YR) * (XR - YR);
    YY[0] += YR * YR;
    ST[0] += XT;
    SR[0] += XR;
    SY[0] += YR;
  }
  RatioSums S;
  S.TY = lanes::sum(TY);
  S.RY = lanes::sum(RY);
  S.YY = lanes::sum(YY);
  S.ST = lanes::sum(ST);
  S.SR = lanes::sum(SR);
  S.SY = lanes::sum(SY);
  S.Finite = std::isfinite(S.TY + S.RY + S.YY);
  return S;
}

template <typename A, typename B> RatioSums bytesSums2(const char *X, const char *R, size_t N) {
  Double4 TR = {}, RR = {}, ST = {}, SR = {};
  size_t I = 0;
  for (; I + 4 <= N; I += 4) {
    Double4 XT = A::at4(X + I * A::Size), XR = B::at4(R + I * B::Size);
    TR += (XT - XR) * (XT - XR);
    RR += XR * XR;
    ST += XT;
    SR += XR;
  }
  for (; I < N; ++I) {
    double XT = A::at(X + I * A::Size), XR = B::at(R + I * B::Size);
    TR[0] += (XT - XR) * (XT - XR);
    RR[0] += XR * XR;
    ST[0] += XT;
    SR[0] += XR;
  }
  RatioSums S;
  S.TR = lanes::sum(TR);
  S.RR = lanes::sum(RR);
  S.ST = lanes::sum(ST);
  S.SR = lanes::sum(SR);
  S.Finite = std::isfinite(S.TR + S.RR);
  return S;
}

#ifdef EKKA_WIDE
template <typename A, typename B, typename C>
EKKA_WIDE RatioSums bytesSums3Wide(const char *X, const char *R, const char *Y, size_t N) {
  return bytesSums3<A, B, C>(X, R, Y, N);
}
template <typename A, typename B>
EKKA_WIDE RatioSums bytesSums2Wide(const char *X, const char *R, size_t N) {
  return bytesSums2<A, B>(X, R, N);
}
#endif

} // namespace

namespace {

/// \p Sums over elements [0, N), a large tensor's two halves summed on two
/// threads (the loop is bound by arithmetic, not by memory, on one core).
/// The split is fixed, so the result does not depend on timing.
template <typename Fn> RatioSums inHalves(size_t N, Fn &&Sums) {
  constexpr size_t Large = size_t(1) << 20;
  if (N < Large || std::thread::hardware_concurrency() < 2)
    return Sums(0, N);
  size_t Half = N / 2;
  RatioSums Second;
  std::thread Helper;
  try {
    Helper = std::thread([&] { Second = Sums(Half, N - Half); });
  } catch (const std::system_error &) {
    return Sums(0, N); // no thread to be had: one pass here
  }
  RatioSums First = Sums(0, Half);
  Helper.join();
  First.TR += Second.TR;
  First.TY += Second.TY;
  First.RY += Second.RY;
  First.YY += Second.YY;
  First.RR += Second.RR;
  First.ST += Second.ST;
  First.SR += Second.SR;
  First.SY += Second.SY;
  First.Finite = First.Finite && Second.Finite;
  return First;
}

} // namespace

std::optional<RatioSums> ratioSums(DType TT, llvm::StringRef XT, DType RT, llvm::StringRef XR,
                                   DType YT, llvm::StringRef YR, size_t N) {
  std::optional<RatioSums> Out;
  bool Sized = true;
  withLoader(TT, [&](auto LA) {
    using A = decltype(LA);
    Sized &= XT.size() == N * A::Size;
    withLoader(RT, [&](auto LB) {
      using B = decltype(LB);
      Sized &= XR.size() == N * B::Size;
      if (YR.empty()) {
        if (Sized)
          Out = inHalves(N, [&](size_t Begin, size_t Count) {
            const char *X = XT.data() + Begin * A::Size, *R = XR.data() + Begin * B::Size;
#ifdef EKKA_WIDE
            if (lanes::wideLanes())
              return bytesSums2Wide<A, B>(X, R, Count);
#endif
            return bytesSums2<A, B>(X, R, Count);
          });
        return;
      }
      withLoader(YT, [&](auto LC) {
        using C = decltype(LC);
        if (Sized && YR.size() == N * C::Size)
          Out = inHalves(N, [&](size_t Begin, size_t Count) {
            const char *X = XT.data() + Begin * A::Size, *R = XR.data() + Begin * B::Size,
                       *Y = YR.data() + Begin * C::Size;
#ifdef EKKA_WIDE
            if (lanes::wideLanes())
              return bytesSums3Wide<A, B, C>(X, R, Y, Count);
#endif
            return bytesSums3<A, B, C>(X, R, Y, Count);
          });
      });
    });
  });
  return Out;
}

RatioSums ratioSums(llvm::ArrayRef<double> XT, llvm::ArrayRef<double> XR,
                    llvm::ArrayRef<double> YR) {
  // The widened values are double tensors: the same kernel as for bytes.
  size_t N = std::min(XT.size(), XR.size());
  auto Bytes = [N](llvm::ArrayRef<double> V) {
    return llvm::StringRef(reinterpret_cast<const char *>(V.data()), N * sizeof(double));
  };
  bool WithY = YR.size() >= N && N > 0;
  return *ratioSums(DType::F64, Bytes(XT), DType::F64, Bytes(XR), DType::F64,
                    WithY ? Bytes(YR) : llvm::StringRef(), N);
}

std::optional<size_t> firstDifference(const std::vector<double> &A, const std::vector<double> &B) {
  size_t N = std::min(A.size(), B.size());
  for (size_t I = 0; I < N; ++I)
    if (A[I] != B[I])
      return I;
  if (A.size() != B.size())
    return N;
  return std::nullopt;
}

} // namespace ekka
