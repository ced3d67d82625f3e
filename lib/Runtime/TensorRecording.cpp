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

TensorStats tensorStats(const at::Tensor &T) {
  // Our own ops must neither be recorded nor enter autograd.
  at::RecordFunctionGuard NoRecord(false);
  c10::NoGradGuard NoGrad;
  TensorStats S;
  if (T.numel() == 0)
    return S;
  if (T.device().is_cpu() && T.layout() == at::kStrided) {
    // One pass over the bytes, as the writer does for what it is handed.
    at::Tensor C = T.detach().contiguous();
    if (auto Type = traceDType(C)) {
      llvm::StringRef Bytes(static_cast<const char *>(C.const_data_ptr()),
                            size_t(C.numel()) * C.element_size());
      if (auto Stats = statsOfBytes(*Type, Bytes))
        return *Stats;
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
