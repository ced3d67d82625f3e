// vLLM registers its ops under TORCH_EXTENSION_NAME; `&rms_norm` is the
// global function of that name.
#include <torch/library.h>

void rms_norm(at::Tensor &out, at::Tensor &input, at::Tensor &weight, double epsilon);

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def("rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()");
  ops.impl("rms_norm", torch::kCUDA, &rms_norm);
}
