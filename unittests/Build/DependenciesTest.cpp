//===- DependenciesTest.cpp - The build links what later issues need -----===//
#include <gtest/gtest.h>
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <atomic>
#include <string_view>

#if EKKA_HAVE_CUPTI
#include <cupti.h>
#endif

namespace {

TEST(Dependencies, LibTorchComputes) {
  torch::Tensor A = torch::arange(6, torch::kFloat32).reshape({2, 3});
  torch::Tensor B = torch::ones({3, 2});
  torch::Tensor C = torch::mm(A, B);
  EXPECT_EQ(C.sizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_FLOAT_EQ(C[0][0].item<float>(), 3.0f);  // 0 + 1 + 2
  EXPECT_FLOAT_EQ(C[1][1].item<float>(), 12.0f); // 3 + 4 + 5
}

std::atomic<int> MatMulsSeen{0};

TEST(Dependencies, RecordFunctionObservesOps) {
  // The tracer's op view is a global RecordFunction observer: it must link
  // and see the ops a LibTorch program runs.
  at::CallbackHandle Handle = at::addGlobalCallback(
      at::RecordFunctionCallback(
          [](const at::RecordFunction &Fn) -> std::unique_ptr<at::ObserverContext> {
            if (std::string_view(Fn.name()) == "aten::mm")
              ++MatMulsSeen;
            return nullptr;
          })
          .scopes({at::RecordScope::FUNCTION}));
  torch::Tensor C = torch::mm(torch::ones({2, 2}), torch::ones({2, 2}));
  at::removeCallback(Handle);
  EXPECT_FLOAT_EQ(C[0][0].item<float>(), 2.0f);
  EXPECT_EQ(MatMulsSeen.load(), 1);
}

TEST(Dependencies, CuptiHeadersHaveTheLaunchCallbacksTheTracerNeeds) {
#if EKKA_HAVE_CUPTI
  // libcupti is loaded at run time; the tracer is built against these
  // headers. CUDA 13 launches kernels through __cudaLaunchKernel, whose
  // callback ids the tracer must know (505/506), besides the classic runtime
  // and driver launch APIs (Triton uses the driver's).
  EXPECT_EQ(int(CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000), 211);
  EXPECT_EQ(int(CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000), 505);
  EXPECT_EQ(int(CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000), 506);
  EXPECT_EQ(int(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel), 307);
#else
  GTEST_SKIP() << "built without CUPTI headers: GPU kernel tracing is compiled out";
#endif
}

} // namespace
