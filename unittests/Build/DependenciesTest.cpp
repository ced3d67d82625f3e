//===- DependenciesTest.cpp - The build links what later issues need -----===//
#include <gtest/gtest.h>
#include <torch/torch.h>

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

TEST(Dependencies, LibTorchRecordFunctionIsAvailable) {
  // The tracer's op view is a RecordFunction observer; the API must link.
  bool Enabled = at::hasGlobalCallbacks() || !at::hasGlobalCallbacks();
  EXPECT_TRUE(Enabled);
}

#if EKKA_HAVE_CUPTI
TEST(Dependencies, CuptiHeadersDeclareTheCallbackApi) {
  // libcupti is loaded at run time; only its declarations are built against.
  EXPECT_GE(CUPTI_API_VERSION, 18);
  EXPECT_NE(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_CB_DOMAIN_DRIVER_API);
}
#endif

} // namespace
