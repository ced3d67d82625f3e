//===- TensorRecording.cpp ------------------------------------------------===//
#include "TensorRecording.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace ekka {

std::optional<DType> traceDType(const at::Tensor &T) {
  switch (T.scalar_type()) {
  case at::kBool: return DType::Bool;
  case at::kByte: return DType::U8;
  case at::kChar: return DType::I8;
  case at::kShort: return DType::I16;
  case at::kInt: return DType::I32;
  case at::kLong: return DType::I64;
  case at::kHalf: return DType::F16;
  case at::kBFloat16: return DType::BF16;
  case at::kFloat: return DType::F32;
  case at::kDouble: return DType::F64;
  case at::kFloat8_e4m3fn: return DType::F8E4M3;
  case at::kFloat8_e5m2: return DType::F8E5M2;
  default: return std::nullopt;
  }
}

bool describeTensor(const at::Tensor &T, TensorRecord &R) {
  auto Type = traceDType(T);
  if (!Type || T.is_sparse() || T.is_quantized() || T.is_nested())
    return false;
  R.Type = *Type;
  R.Shape.assign(T.sizes().begin(), T.sizes().end());
  if (T.layout() == at::kStrided)
    R.Strides.assign(T.strides().begin(), T.strides().end());
  R.Device = T.device().str();
  return true;
}

namespace {

/// One pass over a CPU tensor's elements, accumulating in double: several
/// times cheaper than the eight ATen reductions it replaces, which matters
/// because every module output of every step goes through here.
template <typename T> TensorStats statsOfElements(const T *P, int64_t N) {
  // Four independent lanes keep the floating-point dependency chains short;
  // no branches in the loop. Min and max skip NaNs (comparisons with NaN are
  // false); the sums include them, as the NaN count says.
  constexpr int L = 4;
  double Sum[L] = {}, SumSq[L] = {};
  double Min[L], Max[L];
  int64_t Nan[L] = {}, Inf[L] = {};
  for (int J = 0; J < L; ++J) {
    Min[J] = std::numeric_limits<double>::infinity();
    Max[J] = -std::numeric_limits<double>::infinity();
  }
  auto Step = [&](int J, double V) {
    Sum[J] += V;
    SumSq[J] += V * V;
    Min[J] = V < Min[J] ? V : Min[J];
    Max[J] = V > Max[J] ? V : Max[J];
    Nan[J] += V != V;
    Inf[J] += std::abs(V) == std::numeric_limits<double>::infinity();
  };
  int64_t I = 0;
  for (; I + L <= N; I += L)
    for (int J = 0; J < L; ++J)
      Step(J, static_cast<double>(P[I + J]));
  for (; I < N; ++I)
    Step(0, static_cast<double>(P[I]));
  TensorStats S;
  S.Min = std::numeric_limits<double>::infinity();
  S.Max = -S.Min;
  for (int J = 0; J < L; ++J) {
    S.Sum += Sum[J];
    S.SumSq += SumSq[J];
    S.Min = std::min(S.Min, Min[J]);
    S.Max = std::max(S.Max, Max[J]);
    S.NanCount += Nan[J];
    S.InfCount += Inf[J];
  }
  if (S.NanCount == N)
    S.Min = S.Max = std::numeric_limits<double>::quiet_NaN();
  return S;
}

} // namespace

TensorStats tensorStats(const at::Tensor &T) {
  // Our own ops must neither be recorded nor enter autograd.
  at::RecordFunctionGuard NoRecord(false);
  c10::NoGradGuard NoGrad;
  TensorStats S;
  if (T.numel() == 0)
    return S;
  if (T.device().is_cpu() && T.layout() == at::kStrided) {
    at::Tensor C = T.detach().contiguous();
    switch (C.scalar_type()) {
    case at::kFloat: return statsOfElements(C.const_data_ptr<float>(), C.numel());
    case at::kDouble: return statsOfElements(C.const_data_ptr<double>(), C.numel());
    case at::kHalf: return statsOfElements(C.const_data_ptr<at::Half>(), C.numel());
    case at::kBFloat16: return statsOfElements(C.const_data_ptr<at::BFloat16>(), C.numel());
    case at::kLong: return statsOfElements(C.const_data_ptr<int64_t>(), C.numel());
    case at::kInt: return statsOfElements(C.const_data_ptr<int32_t>(), C.numel());
    case at::kShort: return statsOfElements(C.const_data_ptr<int16_t>(), C.numel());
    case at::kChar: return statsOfElements(C.const_data_ptr<int8_t>(), C.numel());
    case at::kByte: return statsOfElements(C.const_data_ptr<uint8_t>(), C.numel());
    case at::kBool: return statsOfElements(C.const_data_ptr<bool>(), C.numel());
    default: break;
    }
  }
  // On a GPU, or an element type the loop does not know: reductions there,
  // brought back in one transfer.
  at::Tensor X = T.detach().to(at::kDouble);
  at::Tensor All = at::stack({X.sum(), (X * X).sum(), X.min(), X.max(),
                              X.isnan().sum().to(at::kDouble), X.isinf().sum().to(at::kDouble)})
                       .cpu();
  const double *V = All.const_data_ptr<double>();
  S.Sum = V[0];
  S.SumSq = V[1];
  S.Min = V[2];
  S.Max = V[3];
  S.NanCount = int64_t(V[4]);
  S.InfCount = int64_t(V[5]);
  return S;
}

std::string tensorBytes(const at::Tensor &T) {
  at::RecordFunctionGuard NoRecord(false);
  c10::NoGradGuard NoGrad;
  at::Tensor C = T.detach().to(at::kCPU).contiguous();
  const char *P = static_cast<const char *>(C.data_ptr());
  return std::string(P, P + C.numel() * C.element_size());
}

} // namespace ekka
