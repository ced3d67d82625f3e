//===- ZooKernelsCuda.cu - The zoo engine's kernels on the GPU -------------===//
//
// CUDA versions of the kernels in ZooKernels.cpp, launched through the
// plain launchers of ZooCuda.h. Simple kernels, one thread block per row,
// token or (token, head): the zoo's models are tiny, and what matters is
// that the GPU path has kernels of its own for Ekka to trace and name.
//
//===----------------------------------------------------------------------===//
#include "ZooCuda.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace {

constexpr int Threads = 128;

/// The sum of \p V over the block (blockDim.x == Threads), in every thread.
__device__ float blockSum(float V, float *Shared) {
  for (int Offset = 16; Offset > 0; Offset /= 2)
    V += __shfl_down_sync(0xffffffffu, V, Offset);
  int Lane = threadIdx.x % 32, Warp = threadIdx.x / 32;
  if (Lane == 0)
    Shared[Warp] = V;
  __syncthreads();
  float Total = 0;
  for (int W = 0; W < Threads / 32; ++W)
    Total += Shared[W];
  __syncthreads();
  return Total;
}

__device__ float blockMax(float V, float *Shared) {
  for (int Offset = 16; Offset > 0; Offset /= 2)
    V = fmaxf(V, __shfl_down_sync(0xffffffffu, V, Offset));
  int Lane = threadIdx.x % 32, Warp = threadIdx.x / 32;
  if (Lane == 0)
    Shared[Warp] = V;
  __syncthreads();
  float Max = Shared[0];
  for (int W = 1; W < Threads / 32; ++W)
    Max = fmaxf(Max, Shared[W]);
  __syncthreads();
  return Max;
}

__global__ void zoo_rms_norm_kernel(float *Y, const float *X, const float *W, int64_t N,
                                    float Eps, float Offset) {
  __shared__ float Shared[Threads / 32];
  const float *Row = X + blockIdx.x * N;
  float Sum = 0;
  for (int64_t I = threadIdx.x; I < N; I += Threads)
    Sum += Row[I] * Row[I];
  float Inv = rsqrtf(blockSum(Sum, Shared) / float(N) + Eps);
  for (int64_t I = threadIdx.x; I < N; I += Threads)
    Y[blockIdx.x * N + I] = Row[I] * Inv * (Offset + W[I]);
}

// One block per token; threads over (head, pair).
__global__ void zoo_rotary_kernel(float *X, const int64_t *Positions, int64_t Heads,
                                  int64_t HeadDim, float Theta, bool Neox) {
  int64_t Half = HeadDim / 2;
  float Position = float(Positions[blockIdx.x]);
  for (int64_t J = threadIdx.x; J < Heads * Half; J += Threads) {
    int64_t H = J / Half, I = J % Half;
    float InvFreq = powf(Theta, -float(2 * I) / float(HeadDim));
    float S, C;
    sincosf(Position * InvFreq, &S, &C);
    float *Row = X + (blockIdx.x * Heads + H) * HeadDim;
    int64_t First = Neox ? I : 2 * I, Second = Neox ? I + Half : 2 * I + 1;
    float A = Row[First], B = Row[Second];
    Row[First] = A * C - B * S;
    Row[Second] = B * C + A * S;
  }
}

__global__ void zoo_reshape_and_cache_kernel(const char *Key, const char *Value, char *KeyCache,
                                             char *ValueCache, const int64_t *SlotMapping,
                                             int64_t RowBytes) {
  int64_t Slot = SlotMapping[blockIdx.x];
  for (int64_t B = threadIdx.x; B < RowBytes; B += Threads) {
    KeyCache[Slot * RowBytes + B] = Key[blockIdx.x * RowBytes + B];
    ValueCache[Slot * RowBytes + B] = Value[blockIdx.x * RowBytes + B];
  }
}

// One block per (token, head): scores over the visible positions in shared
// memory, a softmax, then each thread one output element.
__global__ void zoo_paged_attention_kernel(float *Out, const float *Query, const float *KeyCache,
                                           const float *ValueCache, const int64_t *BlockTables,
                                           const int64_t *SeqIds, const int64_t *Positions,
                                           int64_t Heads, int64_t KvHeads, int64_t HeadDim,
                                           int64_t BlockSize, int64_t MaxBlocks, float Scale,
                                           int64_t Window, bool WholeLastPage) {
  extern __shared__ float Scores[];
  __shared__ float Shared[Threads / 32];
  int64_t T = blockIdx.x, H = blockIdx.y, KvHead = H / (Heads / KvHeads);
  const int64_t *Table = BlockTables + SeqIds[T] * MaxBlocks;
  int64_t Last = Positions[T];
  int64_t First = Window > 0 ? max(int64_t(0), Last - Window + 1) : 0;
  int64_t End = WholeLastPage ? (Last / BlockSize + 1) * BlockSize : Last + 1;
  auto Row = [&](const float *Cache, int64_t P) {
    return Cache + ((Table[P / BlockSize] * BlockSize + P % BlockSize) * KvHeads + KvHead) * HeadDim;
  };
  const float *Q = Query + (T * Heads + H) * HeadDim;
  float Max = -INFINITY;
  for (int64_t P = First + threadIdx.x; P < End; P += Threads) {
    const float *K = Row(KeyCache, P);
    float Dot = 0;
    for (int64_t D = 0; D < HeadDim; ++D)
      Dot += Q[D] * K[D];
    Scores[P - First] = Dot * Scale;
    Max = fmaxf(Max, Dot * Scale);
  }
  Max = blockMax(Max, Shared);
  float Sum = 0;
  for (int64_t P = First + threadIdx.x; P < End; P += Threads)
    Sum += (Scores[P - First] = expf(Scores[P - First] - Max));
  Sum = blockSum(Sum, Shared); // also orders the writes above before the reads below
  for (int64_t D = threadIdx.x; D < HeadDim; D += Threads) {
    float Acc = 0;
    for (int64_t P = First; P < End; ++P)
      Acc += Scores[P - First] * Row(ValueCache, P)[D];
    Out[(T * Heads + H) * HeadDim + D] = Acc / Sum;
  }
}

// One block per (token, k): the expert's activation, silu(gate) * up.
__global__ void zoo_moe_gate_up_kernel(float *Act, const float *X, const float *W13,
                                       const int64_t *Experts, int64_t Hidden, int64_t Rows13,
                                       int64_t Inter, int64_t Split) {
  int64_t Token = blockIdx.x, K = blockIdx.y, TopK = gridDim.y;
  const float *Xr = X + Token * Hidden;
  const float *W = W13 + Experts[Token * TopK + K] * Rows13 * Hidden;
  for (int64_t I = threadIdx.x; I < Inter; I += Threads) {
    float Gate = 0, Up = 0;
    for (int64_t J = 0; J < Hidden; ++J) {
      Gate += W[I * Hidden + J] * Xr[J];
      Up += W[(Split + I) * Hidden + J] * Xr[J];
    }
    Act[(Token * TopK + K) * Inter + I] = Gate / (1.0f + expf(-Gate)) * Up;
  }
}

// One block per token: the weighted sum of its experts' down projections.
__global__ void zoo_moe_down_kernel(float *Out, const float *Act, const float *W2,
                                    const int64_t *Experts, const float *Weights, int64_t TopK,
                                    int64_t Hidden, int64_t Inter) {
  int64_t Token = blockIdx.x;
  for (int64_t J = threadIdx.x; J < Hidden; J += Threads) {
    float Acc = 0;
    for (int64_t K = 0; K < TopK; ++K) {
      const float *W = W2 + (Experts[Token * TopK + K] * Hidden + J) * Inter;
      const float *A = Act + (Token * TopK + K) * Inter;
      float Dot = 0;
      for (int64_t I = 0; I < Inter; ++I)
        Dot += W[I] * A[I];
      Acc += Weights[Token * TopK + K] * Dot;
    }
    Out[Token * Hidden + J] = Acc;
  }
}

// One block per token; threads over output columns.
__global__ void zoo_quant_gemm_kernel(float *Y, const float *X, const float *Q,
                                      const float *Scales, int64_t N, int64_t K,
                                      bool HalfAccumulator) {
  const float *Xr = X + blockIdx.x * K;
  for (int64_t Col = threadIdx.x; Col < N; Col += Threads) {
    float Acc = 0;
    for (int64_t I = 0; I < K; ++I)
      Acc += Xr[I] * Q[Col * K + I];
    if (HalfAccumulator)
      Acc = __half2float(__float2half(Acc));
    Y[blockIdx.x * N + Col] = Acc * Scales[Col];
  }
}

cudaStream_t stream(void *S) { return static_cast<cudaStream_t>(S); }
int launched() { return int(cudaGetLastError()); }

} // namespace

namespace zoo::cuda {

int rmsNorm(float *Y, const float *X, const float *W, int64_t Rows, int64_t N, double Eps,
            double Offset, void *Stream) {
  if (Rows > 0)
    zoo_rms_norm_kernel<<<unsigned(Rows), Threads, 0, stream(Stream)>>>(Y, X, W, N, float(Eps),
                                                                         float(Offset));
  return launched();
}

int rotary(float *X, const int64_t *Positions, int64_t Tokens, int64_t Heads, int64_t HeadDim,
           double Theta, bool Neox, void *Stream) {
  if (Tokens > 0)
    zoo_rotary_kernel<<<unsigned(Tokens), Threads, 0, stream(Stream)>>>(X, Positions, Heads,
                                                                         HeadDim, float(Theta), Neox);
  return launched();
}

int reshapeAndCache(const void *Key, const void *Value, void *KeyCache, void *ValueCache,
                    const int64_t *SlotMapping, int64_t Tokens, int64_t RowBytes, void *Stream) {
  if (Tokens > 0)
    zoo_reshape_and_cache_kernel<<<unsigned(Tokens), Threads, 0, stream(Stream)>>>(
        static_cast<const char *>(Key), static_cast<const char *>(Value),
        static_cast<char *>(KeyCache), static_cast<char *>(ValueCache), SlotMapping, RowBytes);
  return launched();
}

int pagedAttention(float *Out, const float *Query, const float *KeyCache, const float *ValueCache,
                   const int64_t *BlockTables, const int64_t *SeqIds, const int64_t *Positions,
                   int64_t Tokens, int64_t Heads, int64_t KvHeads, int64_t HeadDim,
                   int64_t BlockSize, int64_t MaxBlocks, int64_t MaxPositions, double Scale,
                   int64_t Window, bool WholeLastPage, void *Stream) {
  if (Tokens > 0) {
    // Room for every position a token may see, the last page whole.
    size_t Shared = size_t((MaxPositions / BlockSize + 1) * BlockSize) * sizeof(float);
    zoo_paged_attention_kernel<<<dim3(unsigned(Tokens), unsigned(Heads)), Threads, Shared,
                                 stream(Stream)>>>(Out, Query, KeyCache, ValueCache, BlockTables,
                                                   SeqIds, Positions, Heads, KvHeads, HeadDim,
                                                   BlockSize, MaxBlocks, float(Scale), Window,
                                                   WholeLastPage);
  }
  return launched();
}

int fusedMoe(float *Out, float *Act, const float *X, const float *W13, const float *W2,
             const int64_t *Experts, const float *Weights, int64_t Tokens, int64_t TopK,
             int64_t Hidden, int64_t Rows13, int64_t Inter, int64_t Split, void *Stream) {
  if (Tokens == 0)
    return 0;
  zoo_moe_gate_up_kernel<<<dim3(unsigned(Tokens), unsigned(TopK)), Threads, 0, stream(Stream)>>>(
      Act, X, W13, Experts, Hidden, Rows13, Inter, Split);
  if (int Error = launched())
    return Error;
  zoo_moe_down_kernel<<<unsigned(Tokens), Threads, 0, stream(Stream)>>>(Out, Act, W2, Experts,
                                                                         Weights, TopK, Hidden, Inter);
  return launched();
}

int quantGemm(float *Y, const float *X, const float *Q, const float *Scales, int64_t Tokens,
              int64_t N, int64_t K, bool HalfAccumulator, void *Stream) {
  if (Tokens > 0)
    zoo_quant_gemm_kernel<<<unsigned(Tokens), Threads, 0, stream(Stream)>>>(Y, X, Q, Scales, N, K,
                                                                            HalfAccumulator);
  return launched();
}

} // namespace zoo::cuda
