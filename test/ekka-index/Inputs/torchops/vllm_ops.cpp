// Registrations the way current vLLM writes them: a sub-library named by
// pasting a suffix onto TORCH_EXTENSION_NAME, the stable ABI's blocks with
// TORCH_BOX, ops that carry tags, a template instantiation and a lambda.
#include <torch/library.h>

#define _CONCAT(A, B) A##B
#define CONCAT(A, B) _CONCAT(A, B)
#define TORCH_LIBRARY_EXPAND(NAME, MODULE) TORCH_LIBRARY(NAME, MODULE)

void reshape_and_cache(at::Tensor &key, at::Tensor &value) {}
void stable_op(at::Tensor &out) {}
void cutlass_scaled_mm(at::Tensor &out) {}
template <typename T> at::Tensor tmpl_op(const at::Tensor &x) { return x; }

TORCH_LIBRARY_EXPAND(CONCAT(TORCH_EXTENSION_NAME, _cache_ops), cache_ops) {
  cache_ops.def("reshape_and_cache(Tensor key, Tensor value) -> ()");
  cache_ops.impl("reshape_and_cache", torch::kCUDA, &reshape_and_cache);
}

STABLE_TORCH_LIBRARY_FRAGMENT(_C, s) {
  s.def("stable_op(Tensor! out) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(_C, CUDA, s) {
  s.impl("stable_op", TORCH_BOX(&stable_op));
}

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  std::vector<at::Tag> stride_tag = {at::Tag::needs_fixed_stride_order};
  ops.def("cutlass_scaled_mm(Tensor! out) -> ()", {stride_tag});
  ops.impl("cutlass_scaled_mm", torch::kCUDA, &cutlass_scaled_mm);
  ops.def("tmpl_op(Tensor x) -> Tensor");
  ops.impl("tmpl_op", torch::kCPU, &tmpl_op<float>);
  ops.def("identity(Tensor x) -> Tensor");
  ops.impl("identity", torch::kCPU, [](const at::Tensor& x){ return x; });
}
// A C++ function of the name of an op registered from Python: not its
// implementation (attention_layer.py registers the Python function).
void unified_attention(at::Tensor &out) {}
