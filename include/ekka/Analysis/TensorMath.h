//===- TensorMath.h - Comparing captured tensors in double precision -*- C++ -*-===//
#ifndef EKKA_ANALYSIS_TENSORMATH_H
#define EKKA_ANALYSIS_TENSORMATH_H

#include "ekka/Trace/TraceFormat.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <optional>
#include <vector>

namespace ekka {

/// A captured tensor's elements widened to double (the floating types, fp8
/// included, and the integer types); a complex tensor's parts, real and
/// imaginary interleaved (two values per element); nullopt for a type that
/// is not numeric here.
std::optional<std::vector<double>> toDoubles(DType Type, llvm::StringRef Bytes);

/// The unit roundoff of a floating type (2^-24 for F32, 2^-8 for BF16, ...;
/// a complex type's parts'); 0 for integers, which compare exactly.
double unitRoundoff(DType Type);

/// ‖A − B‖₂ and ‖A‖₂, accumulated in double. A and B have the same size.
/// Non-finite elements: equal NaNs or infinities on both sides agree and
/// add nothing; a NaN or infinity on one side only makes the distance
/// infinite. The norm counts finite elements.
double distance(llvm::ArrayRef<double> A, llvm::ArrayRef<double> B);
double norm(llvm::ArrayRef<double> A);

/// The sums an error ratio needs, from one pass over the target's values
/// XT, the reference's XR and (optional) the FP32 reference's YR, all of
/// one size (YR empty: none): with YR, Σ(XT−YR)², Σ(XR−YR)² and ΣYR²; without, Σ(XT−XR)² and
/// ΣXR². Finite is false when any value is not (the sums are then to be
/// computed element by element, as distance() does). ST, SR and SY are
/// the plain sums ΣXT, ΣXR and ΣYR, which a reader checks against the
/// statistics recorded with the bytes.
struct RatioSums {
  double TR = 0, TY = 0, RY = 0, YY = 0, RR = 0;
  double ST = 0, SR = 0, SY = 0;
  bool Finite = true;
};
RatioSums ratioSums(llvm::ArrayRef<double> XT, llvm::ArrayRef<double> XR,
                    llvm::ArrayRef<double> YR);
/// The sums of two parts, as one: a part's sums are the whole's when
/// added up (finite where both are).
inline RatioSums &operator+=(RatioSums &A, const RatioSums &B) {
  A.TR += B.TR, A.TY += B.TY, A.RY += B.RY, A.YY += B.YY, A.RR += B.RR;
  A.ST += B.ST, A.SR += B.SR, A.SY += B.SY;
  A.Finite &= B.Finite;
  return A;
}

/// The same sums straight from captured bytes, without widened copies:
/// XT of dtype TT, XR of RT and, unless \p YR is empty, YR of YT, each
/// holding \p N elements. None for a dtype other than F32, F64, F16 and
/// BF16, or bytes of another size. With YR, Σ(XT−XR)² and ΣXR² are not
/// summed (R against the FP32 reference does not need them).
std::optional<RatioSums> ratioSums(DType TT, llvm::StringRef XT, DType RT, llvm::StringRef XR,
                                   DType YT, llvm::StringRef YR, size_t N);

/// The first index at which A and B differ (or the shorter length when one
/// is a prefix of the other); nullopt when equal.
std::optional<size_t> firstDifference(const std::vector<double> &A, const std::vector<double> &B);

} // namespace ekka

#endif
