//===- ZooCuda.h - The zoo engine's CUDA kernels, as launchers ------------===//
//
// The CUDA versions of the zoo engine's kernels (ZooKernelsCuda.cu), called
// by the CUDA implementations of the `zoo::` ops in ZooKernels.cpp. Plain
// launchers over device pointers, so that only ZooKernels.cpp sees LibTorch
// and only ZooKernelsCuda.cu is compiled by nvcc. They compute in float, as
// the CPU versions do; `Stream` is a cudaStream_t. Each returns the launch's
// cudaError_t (0: launched).
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_ZOO_CUDA_H
#define EKKA_ZOO_CUDA_H

#include <cstdint>

namespace zoo::cuda {

/// Y[r] = X[r] / rms(X[r]) * (Offset + W), for each of \p Rows rows of \p N.
int rmsNorm(float *Y, const float *X, const float *W, int64_t Rows, int64_t N, double Eps,
            double Offset, void *Stream);

/// Rotates X [Tokens, Heads, HeadDim] in place by its tokens' positions.
int rotary(float *X, const int64_t *Positions, int64_t Tokens, int64_t Heads, int64_t HeadDim,
           double Theta, bool Neox, void *Stream);

/// Copies each token's row of \p RowBytes bytes of Key and Value into the
/// caches' slot SlotMapping[t] (any dtype: a copy of bytes).
int reshapeAndCache(const void *Key, const void *Value, void *KeyCache, void *ValueCache,
                    const int64_t *SlotMapping, int64_t Tokens, int64_t RowBytes, void *Stream);

/// Paged attention over float caches [blocks, BlockSize, KvHeads, HeadDim];
/// see the CPU version in ZooKernels.cpp. \p WholeLastPage: attend to the
/// whole last page, filled or not (the bug `paged-attn-last-page`).
int pagedAttention(float *Out, const float *Query, const float *KeyCache, const float *ValueCache,
                   const int64_t *BlockTables, const int64_t *SeqIds, const int64_t *Positions,
                   int64_t Tokens, int64_t Heads, int64_t KvHeads, int64_t HeadDim,
                   int64_t BlockSize, int64_t MaxBlocks, int64_t MaxPositions, double Scale,
                   int64_t Window, bool WholeLastPage, void *Stream);

/// The experts of a fused MoE, in two kernels: Act[t, k] = silu(gate) * up
/// of expert Experts[t, k], where [gate; up] = W13[e] X[t] (W13 [E, Rows13,
/// Hidden]) is split at row \p Split; then Out[t] = sum_k Weights[t, k] *
/// W2[e] Act[t, k] (W2 [E, Hidden, Inter]).
int fusedMoe(float *Out, float *Act, const float *X, const float *W13, const float *W2,
             const int64_t *Experts, const float *Weights, int64_t Tokens, int64_t TopK,
             int64_t Hidden, int64_t Rows13, int64_t Inter, int64_t Split, void *Stream);

/// Y[t, n] = (sum_k X[t, k] Q[n, k]) * Scales[n], accumulated in fp32 over
/// the unscaled weight values \p Q; \p HalfAccumulator rounds the sum to
/// fp16 before the scale (the bug `fp4-gemm-overflow`).
int quantGemm(float *Y, const float *X, const float *Q, const float *Scales, int64_t Tokens,
              int64_t N, int64_t K, bool HalfAccumulator, void *Stream);

} // namespace zoo::cuda

#endif
