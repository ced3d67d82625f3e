//===- KernelSymbolTest.cpp -----------------------------------------------===//
#include "ekka/Index/KernelSymbol.h"

#include <gtest/gtest.h>

using namespace ekka;

namespace {

TEST(KernelSymbol, MangledTemplateKernel) {
  EXPECT_EQ(kernelQualifiedName("_ZN3lib9attention6detail14prefill_kernelIfLi128EEEvPT_PKS3_j"),
            "lib::attention::detail::prefill_kernel");
}

TEST(KernelSymbol, MangledPlainKernel) {
  EXPECT_EQ(kernelQualifiedName("_Z10add_kernelPfS_i"), "add_kernel");
  EXPECT_TRUE(isMangledName("_Z10add_kernelPfS_i"));
  EXPECT_FALSE(isMangledName("triton_poi_fused_add_0"));
}

TEST(KernelSymbol, TemplateArgumentsWithinTheContext) {
  // A kernel that is a static member of a class template.
  EXPECT_EQ(kernelQualifiedName("_ZN2ns5OuterIiE6kernelEPf"), "ns::Outer::kernel");
}

TEST(KernelSymbol, DemangledSignatures) {
  EXPECT_EQ(kernelQualifiedName("void flashinfer::BatchPrefillKernel<128u, (MaskMode)0>(Params)"),
            "flashinfer::BatchPrefillKernel");
  EXPECT_EQ(kernelQualifiedName("void (anonymous namespace)::k<float>(float*)"),
            "(anonymous namespace)::k");
  EXPECT_EQ(kernelQualifiedName("ns::k"), "ns::k");
}

TEST(KernelSymbol, NvccAnonymousNamespace) {
  // nvcc names a .cu file's anonymous namespace after the file and a hash;
  // CUPTI reports it so (seen on an H200 with nvcc 13.0).
  EXPECT_EQ(kernelQualifiedName("_ZN50_GLOBAL__N__52fe86f7_17_ZooKernelsCuda_cu_f4cf3eeb26zoo_"
                                "paged_attention_kernelEPfPKfS2_S2_PKlS4_S4_lllllflb"),
            "(anonymous namespace)::zoo_paged_attention_kernel");
}

TEST(KernelSymbol, PlainNamesPassThrough) {
  EXPECT_EQ(kernelQualifiedName("triton_poi_fused_add_0"), "triton_poi_fused_add_0");
}

} // namespace
