// Custom ops registered the ways PyTorch extensions do: a schema and a CPU
// implementation in separate blocks (the zoo's kernels), vLLM's
// TORCH_LIBRARY_EXPAND with dispatch keys and `&fn`, an overload, and a
// def that carries its implementation.
#include <torch/library.h>

namespace my {
void rmsNorm(at::Tensor &out, const at::Tensor &x) {}
void pagedAttentionCuda(at::Tensor &out) {}
at::Tensor geluTanh(const at::Tensor &x) { return x; }
} // namespace my

TORCH_LIBRARY(zoo, m) {
  m.def("rms_norm(Tensor(a!) out, Tensor x) -> ()");
  m.def("paged_attention(Tensor(a!) out) -> ()");
  m.def("gelu_tanh(Tensor x) -> Tensor", my::geluTanh);
}

TORCH_LIBRARY_IMPL(zoo, CPU, m) {
  m.impl("rms_norm", my::rmsNorm);
}

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def(
      "paged_attention_v1(Tensor! out, Tensor query,"
      " int block_size) -> ()");
  ops.impl("paged_attention_v1", torch::kCUDA, &my::pagedAttentionCuda);
  ops.impl("rms_norm.out", torch::kCUDA, &my::rmsNorm);
}

// A raw-string schema, and implementations given through torch::dispatch
// (with TORCH_FN) and with a namespaced dispatch key.
namespace my {
void fusedAddRmsNorm(at::Tensor &x, at::Tensor &residual) {}
void silu(at::Tensor &out, const at::Tensor &x) {}
} // namespace my

TORCH_LIBRARY(sgl, m) {
  m.def(R"(fused_add_rmsnorm(Tensor! input, Tensor! residual) -> ())");
  m.impl("fused_add_rmsnorm", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(my::fusedAddRmsNorm)));
  m.def("silu(Tensor! out, Tensor x) -> ()", torch::dispatch(c10::DispatchKey::CPU, &my::silu));
}
