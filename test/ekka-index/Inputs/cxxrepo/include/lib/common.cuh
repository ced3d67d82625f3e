#pragma once
#include <cstdint>
#include <cuda_fp16.h>
#include "not/there.h"

namespace lib {
namespace attention {
namespace detail {

template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(128)
    prefill_kernel(T* out, const T* q, uint32_t n) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = q[i];
}

__global__ void decode_kernel(half* out, int n) {
  out[0] = out[1];
}

}  // namespace detail
}  // namespace attention

struct KernelBase {
  virtual ~KernelBase() = default;
  virtual void launch() = 0;
};

template <typename T>
class TypedKernel : public KernelBase {
 public:
  void launch() override {}
  T scale() const { return T(1); }
};

#define EKKA_DEFINE_FILL(NAME, T) \
  __global__ void NAME(T* x, T v) { x[threadIdx.x] = v; }

EKKA_DEFINE_FILL(fill_f32, float)
EKKA_DEFINE_FILL(fill_i32, int)

}  // namespace lib
