//===- TraceFormat.cpp ----------------------------------------------------===//
#include "ekka/Trace/TraceFormat.h"
#include "ekka/Support/Lanes.h"

#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

using namespace llvm;

namespace ekka {

StringRef traceSchema() {
  return R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS module_calls(
  id INTEGER PRIMARY KEY,
  parent_id INTEGER,
  seq INTEGER NOT NULL,
  step INTEGER NOT NULL,
  path TEXT NOT NULL,
  class_name TEXT NOT NULL,
  class_qualname TEXT NOT NULL,
  source_file TEXT,
  source_line INTEGER);
CREATE TABLE IF NOT EXISTS ops(
  id INTEGER PRIMARY KEY,
  module_call_id INTEGER,
  seq INTEGER NOT NULL,
  name TEXT NOT NULL,
  schema TEXT);
CREATE TABLE IF NOT EXISTS kernels(
  id INTEGER PRIMARY KEY,
  op_id INTEGER,
  module_call_id INTEGER,
  seq INTEGER NOT NULL,
  name TEXT NOT NULL,
  grid TEXT NOT NULL,
  block TEXT NOT NULL,
  shared_mem INTEGER NOT NULL,
  stream INTEGER NOT NULL,
  correlation_id INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS tensors(
  id INTEGER PRIMARY KEY,
  owner TEXT NOT NULL,
  owner_id INTEGER NOT NULL,
  role TEXT NOT NULL,
  idx INTEGER NOT NULL,
  dtype TEXT NOT NULL,
  shape TEXT NOT NULL,
  strides TEXT NOT NULL,
  device TEXT NOT NULL,
  sum REAL, sumsq REAL, min REAL, max REAL,
  nan_count INTEGER, inf_count INTEGER,
  shard TEXT,
  key TEXT,
  source_id INTEGER,
  layout TEXT);
CREATE TABLE IF NOT EXISTS spans(
  owner TEXT NOT NULL,
  owner_id INTEGER NOT NULL,
  thread INTEGER NOT NULL,
  start_ns INTEGER NOT NULL,
  end_ns INTEGER NOT NULL);
)sql";
}

StringRef traceIndexes() {
  return R"sql(
CREATE INDEX IF NOT EXISTS tensors_owner ON tensors(owner, owner_id);
CREATE INDEX IF NOT EXISTS ops_module_call ON ops(module_call_id);
CREATE INDEX IF NOT EXISTS kernels_op ON kernels(op_id);
)sql";
}

StringRef dtypeName(DType T) {
  switch (T) {
  case DType::Bool: return "BOOL";
  case DType::U8: return "U8";
  case DType::I8: return "I8";
  case DType::I16: return "I16";
  case DType::U16: return "U16";
  case DType::I32: return "I32";
  case DType::U32: return "U32";
  case DType::I64: return "I64";
  case DType::U64: return "U64";
  case DType::F16: return "F16";
  case DType::BF16: return "BF16";
  case DType::F32: return "F32";
  case DType::F64: return "F64";
  case DType::F8E4M3: return "F8_E4M3";
  case DType::F8E5M2: return "F8_E5M2";
  case DType::C32: return "C32";
  case DType::C64: return "C64";
  case DType::C128: return "C128";
  case DType::F8E4M3FNUZ: return "F8_E4M3FNUZ";
  case DType::F8E5M2FNUZ: return "F8_E5M2FNUZ";
  case DType::F8E8M0: return "F8_E8M0";
  case DType::F4: return "F4";
  }
  return "?";
}

std::optional<DType> parseDType(StringRef Name) {
  // dtypeName is the one list of names (its switch covers every type);
  // F4 is the last type.
  for (int I = 0; I <= int(DType::F4); ++I)
    if (dtypeName(DType(I)) == Name)
      return DType(I);
  return std::nullopt;
}

unsigned dtypeBits(DType T) {
  switch (T) {
  case DType::Bool:
  case DType::U8:
  case DType::I8:
  case DType::F8E4M3:
  case DType::F8E5M2:
  case DType::F8E4M3FNUZ:
  case DType::F8E5M2FNUZ:
  case DType::F8E8M0:
    return 8;
  case DType::F4:
    return 4;
  case DType::I16:
  case DType::U16:
  case DType::F16:
  case DType::BF16:
    return 16;
  case DType::I32:
  case DType::U32:
  case DType::F32:
  case DType::C32:
    return 32;
  case DType::I64:
  case DType::U64:
  case DType::F64:
  case DType::C64:
    return 64;
  case DType::C128:
    return 128;
  }
  return 8;
}

std::optional<uint64_t> dtypeBytes(DType T, uint64_t Elements) {
  uint64_t Bits;
  if (__builtin_mul_overflow(Elements, uint64_t(dtypeBits(T)), &Bits))
    return std::nullopt;
  return Bits / 8 + (Bits % 8 != 0);
}

bool storableDType(DType T) { return T != DType::C32 && T != DType::C128; }

DType partType(DType T) {
  switch (T) {
  case DType::C32: return DType::F16;
  case DType::C64: return DType::F32;
  case DType::C128: return DType::F64;
  default: return T;
  }
}

std::string shardFileName(unsigned Index) {
  std::string Name;
  raw_string_ostream(Name) << format("tensors-%04u.safetensors", Index);
  return Name;
}

namespace {

/// What a small float's codes mean beyond the finite values.
enum class Specials {
  IEEE, ///< the top exponent is infinity (mantissa 0) or NaN
  FN,   ///< only all ones is NaN; the top exponent holds finite values
  FNUZ, ///< only negative zero's code is NaN; the bias is one more
  None, ///< every code is finite (e2m1)
};

/// A small binary float of \p ExpBits exponent and \p MantBits mantissa
/// bits, sign first, bias 2^(ExpBits-1) - 1 (2^(ExpBits-1) for FNUZ).
template <int ExpBits, int MantBits, Specials Kind> double minifloatToDouble(uint32_t Bits) {
  constexpr int Bias = (1 << (ExpBits - 1)) - (Kind == Specials::FNUZ ? 0 : 1);
  constexpr int Top = (1 << ExpBits) - 1;
  constexpr uint32_t MantMask = (1u << MantBits) - 1;
  constexpr uint32_t SignBit = 1u << (ExpBits + MantBits);
  const double NaN = std::numeric_limits<double>::quiet_NaN();
  Bits &= (SignBit << 1) - 1;
  int Exp = (Bits >> MantBits) & Top;
  uint32_t Mant = Bits & MantMask;
  if (Kind == Specials::IEEE && Exp == Top)
    return Mant ? NaN : (Bits & SignBit ? -1 : 1) * std::numeric_limits<double>::infinity();
  if (Kind == Specials::FN && Exp == Top && Mant == MantMask)
    return NaN;
  if (Kind == Specials::FNUZ && Bits == SignBit)
    return NaN;
  double V = Exp == 0 ? std::ldexp(double(Mant), 1 - Bias - MantBits)
                      : std::ldexp(double(Mant | (MantMask + 1)), Exp - Bias - MantBits);
  return Bits & SignBit ? -V : V;
}

} // namespace

double halfToDouble(uint16_t H) { return minifloatToDouble<5, 10, Specials::IEEE>(H); }
double float8e4m3ToDouble(uint8_t B) { return minifloatToDouble<4, 3, Specials::FN>(B); }
double float8e5m2ToDouble(uint8_t B) { return minifloatToDouble<5, 2, Specials::IEEE>(B); }
double float8e4m3fnuzToDouble(uint8_t B) { return minifloatToDouble<4, 3, Specials::FNUZ>(B); }
double float8e5m2fnuzToDouble(uint8_t B) { return minifloatToDouble<5, 2, Specials::FNUZ>(B); }
double float4e2m1ToDouble(uint8_t B) { return minifloatToDouble<2, 1, Specials::None>(B); }

double float8e8m0ToDouble(uint8_t B) {
  // No sign, no mantissa: 2^(B - 127); all ones is NaN.
  return B == 0xFF ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(1.0, int(B) - 127);
}

unsigned valuesOfByte(DType T, uint8_t Byte, double Out[2]) {
  switch (T) {
  case DType::F4:
    Out[0] = float4e2m1ToDouble(Byte & 0xF);
    Out[1] = float4e2m1ToDouble(Byte >> 4);
    return 2;
  case DType::F8E4M3: Out[0] = float8e4m3ToDouble(Byte); return 1;
  case DType::F8E5M2: Out[0] = float8e5m2ToDouble(Byte); return 1;
  case DType::F8E4M3FNUZ: Out[0] = float8e4m3fnuzToDouble(Byte); return 1;
  case DType::F8E5M2FNUZ: Out[0] = float8e5m2fnuzToDouble(Byte); return 1;
  case DType::F8E8M0: Out[0] = float8e8m0ToDouble(Byte); return 1;
  case DType::U8: case DType::Bool: Out[0] = Byte; return 1;
  case DType::I8: Out[0] = int8_t(Byte); return 1;
  default: return 0;
  }
}

double bfloat16ToDouble(uint16_t B) {
  uint32_t Bits = uint32_t(B) << 16;
  float F;
  std::memcpy(&F, &Bits, 4);
  return F;
}

namespace {

/// The running sum, sum of squares, min and max of a chain of four lanes
/// (ekka/Support/Lanes.h). Min and max skip NaNs (a comparison with one is
/// false); the sums take them in.
struct Running {
  lanes::Double4 Sum, SumSq, Min, Max;

  static Running start() {
    const double Inf = std::numeric_limits<double>::infinity();
    Running R;
    R.Sum = R.SumSq = lanes::Double4{0, 0, 0, 0};
    R.Min = lanes::Double4{Inf, Inf, Inf, Inf};
    R.Max = -R.Min;
    return R;
  }
  void add(const lanes::Double4 &V) {
    Sum += V;
    SumSq += V * V;
    Min = V < Min ? V : Min;
    Max = V > Max ? V : Max;
  }
  /// The last \p N < 4 elements in the first lanes: the others add nothing.
  template <typename L> lanes::Double4 addTail(const char *P, size_t N) {
    lanes::Double4 V = {0, 0, 0, 0};
    lanes::Int4 Used = {0, 0, 0, 0};
    for (size_t J = 0; J < N; ++J) {
      V[J] = L::at(P + J * L::Size);
      Used[J] = -1;
    }
    Sum += V;
    SumSq += V * V;
    Min = (Used & (V < Min)) ? V : Min;
    Max = (Used & (V > Max)) ? V : Max;
    return V;
  }
  void merge(const Running &O) {
    Sum += O.Sum;
    SumSq += O.SumSq;
    Min = O.Min < Min ? O.Min : Min;
    Max = O.Max > Max ? O.Max : Max;
  }
  void into(TensorStats &S) const {
    S.Sum = lanes::sum(Sum);
    S.SumSq = lanes::sum(SumSq);
    S.Min = std::min(std::min(Min[0], Min[1]), std::min(Min[2], Min[3]));
    S.Max = std::max(std::max(Max[0], Max[1]), std::max(Max[2], Max[3]));
  }
};

/// The common case in one pass: two chains of four lanes (eight elements
/// a step, so that the additions' latency overlaps), no counting. A NaN or
/// an infinity makes a sum NaN or infinite, so finite sums prove there is
/// none; otherwise false, and the counting pass runs.
template <typename L> bool statsWithoutSpecials(const char *P, size_t N, TensorStats &S) {
  Running A = Running::start(), B = Running::start();
  size_t I = 0;
  for (; I + 8 <= N; I += 8) {
    A.add(L::at4(P + I * L::Size));
    B.add(L::at4(P + (I + 4) * L::Size));
  }
  if (I + 4 <= N) {
    A.add(L::at4(P + I * L::Size));
    I += 4;
  }
  if (I < N)
    B.addTail<L>(P + I * L::Size, N - I);
  A.merge(B);
  A.into(S);
  return std::isfinite(S.Sum) && std::isfinite(S.SumSq);
}

/// One pass in four lanes that also counts NaNs and infinities (a
/// comparison's lanes are -1 where true).
template <typename L> TensorStats statsCounting(const char *P, size_t N) {
  using lanes::Double4;
  using lanes::Int4;
  const double Inf = std::numeric_limits<double>::infinity();
  const Double4 PosInf = {Inf, Inf, Inf, Inf}, NegInf = -PosInf;
  Running R = Running::start();
  Int4 Nan = {0, 0, 0, 0}, Infs = {0, 0, 0, 0};
  auto Count = [&](const Double4 &V) {
    Nan -= V != V;
    Infs -= (V == PosInf) | (V == NegInf);
  };
  size_t I = 0;
  for (; I + 4 <= N; I += 4) {
    Double4 V = L::at4(P + I * L::Size);
    R.add(V);
    Count(V);
  }
  if (I < N)
    Count(R.addTail<L>(P + I * L::Size, N - I)); // unused lanes hold 0
  TensorStats S;
  R.into(S);
  for (int J = 0; J < 4; ++J) {
    S.NanCount += Nan[J];
    S.InfCount += Infs[J];
  }
  if (S.NanCount == int64_t(N))
    S.Min = S.Max = std::numeric_limits<double>::quiet_NaN();
  return S;
}

/// A tensor's statistics from its bytes, widened by loader \p L.
template <typename L> TensorStats statsOf(StringRef Bytes) {
  const char *P = Bytes.data();
  size_t N = Bytes.size() / L::Size;
  TensorStats S;
  if (N == 0 || statsWithoutSpecials<L>(P, N, S))
    return S;
  return statsCounting<L>(P, N);
}

#ifdef EKKA_WIDE
template <typename L> EKKA_WIDE TensorStats statsOfWide(StringRef Bytes) {
  return statsOf<L>(Bytes);
}
#endif

template <typename L> TensorStats statsWith(StringRef Bytes) {
#ifdef EKKA_WIDE
  if (lanes::wideLanes())
    return statsOfWide<L>(Bytes);
#endif
  return statsOf<L>(Bytes);
}

} // namespace

std::optional<TensorStats> statsOfBytes(DType Type, StringRef Bytes) {
  using lanes::LoadAs;
  using lanes::LoadBy;
  // A complex tensor's: those of its parts, real and imaginary together.
  switch (partType(Type)) {
  case DType::F32: return statsWith<LoadAs<float>>(Bytes);
  case DType::F64: return statsWith<LoadAs<double>>(Bytes);
  case DType::F16: return statsWith<LoadBy<uint16_t, halfToDouble>>(Bytes);
  case DType::BF16: return statsWith<lanes::LoadBF16>(Bytes);
  case DType::F8E4M3: return statsWith<LoadBy<uint8_t, float8e4m3ToDouble>>(Bytes);
  case DType::F8E5M2: return statsWith<LoadBy<uint8_t, float8e5m2ToDouble>>(Bytes);
  case DType::F8E4M3FNUZ: return statsWith<LoadBy<uint8_t, float8e4m3fnuzToDouble>>(Bytes);
  case DType::F8E5M2FNUZ: return statsWith<LoadBy<uint8_t, float8e5m2fnuzToDouble>>(Bytes);
  case DType::F8E8M0: return statsWith<LoadBy<uint8_t, float8e8m0ToDouble>>(Bytes);
  case DType::F4: {
    // Two to a byte: counted by byte, then summed by value.
    int64_t Counts[256] = {};
    for (char C : Bytes)
      ++Counts[uint8_t(C)];
    return statsOfByteCounts(Type, Counts);
  }
  case DType::I64: return statsWith<LoadAs<int64_t>>(Bytes);
  case DType::I32: return statsWith<LoadAs<int32_t>>(Bytes);
  case DType::I16: return statsWith<LoadAs<int16_t>>(Bytes);
  case DType::I8: return statsWith<LoadAs<int8_t>>(Bytes);
  case DType::U8:
  case DType::Bool: return statsWith<LoadAs<uint8_t>>(Bytes);
  case DType::U16: return statsWith<LoadAs<uint16_t>>(Bytes);
  case DType::U32: return statsWith<LoadAs<uint32_t>>(Bytes);
  case DType::U64: return statsWith<LoadAs<uint64_t>>(Bytes);
  default: return std::nullopt;
  }
}

std::optional<TensorStats> statsOfByteCounts(DType Type, const int64_t *Counts) {
  double Probe[2];
  if (!valuesOfByte(Type, 0, Probe))
    return std::nullopt;
  const double Inf = std::numeric_limits<double>::infinity();
  TensorStats S;
  S.Min = Inf;
  S.Max = -Inf;
  int64_t Values = 0;
  for (unsigned B = 0; B < 256; ++B) {
    if (!Counts[B])
      continue;
    double V[2];
    unsigned N = valuesOfByte(Type, uint8_t(B), V);
    for (unsigned I = 0; I < N; ++I) {
      Values += Counts[B];
      double C = double(Counts[B]);
      S.Sum += C * V[I];
      S.SumSq += C * V[I] * V[I];
      if (std::isnan(V[I])) {
        S.NanCount += Counts[B];
        continue;
      }
      if (std::isinf(V[I]))
        S.InfCount += Counts[B];
      S.Min = std::min(S.Min, V[I]);
      S.Max = std::max(S.Max, V[I]);
    }
  }
  if (Values == 0)
    return TensorStats();
  if (S.NanCount == Values)
    S.Min = S.Max = std::numeric_limits<double>::quiet_NaN();
  return S;
}

StringRef ownerName(TensorOwner O) {
  switch (O) {
  case TensorOwner::ModuleCall: return "module_call";
  case TensorOwner::Op: return "op";
  case TensorOwner::Kernel: return "kernel";
  }
  return "?";
}

std::optional<TensorOwner> parseOwner(StringRef Name) {
  return StringSwitch<std::optional<TensorOwner>>(Name)
      .Case("module_call", TensorOwner::ModuleCall)
      .Case("op", TensorOwner::Op)
      .Case("kernel", TensorOwner::Kernel)
      .Default(std::nullopt);
}

} // namespace ekka
