// Another function of the same name, in a namespace: not what `&rms_norm`
// names.
namespace vllm {
namespace cpu {
void rms_norm(float *out, const float *input) {}
} // namespace cpu
} // namespace vllm
