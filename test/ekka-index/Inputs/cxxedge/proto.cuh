#pragma once
// A prototype here, the definition in kernels.cu.
__global__ void fwd_kernel(int* p);
