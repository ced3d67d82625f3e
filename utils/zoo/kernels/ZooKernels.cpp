//===- ZooKernels.cpp - The zoo engine's kernels as PyTorch custom ops ----===//
//
// The serving engine of the silent-error zoo (utils/zoo) runs its hot paths
// through these ops, as vLLM runs its own through `_C`: RMSNorm, fused
// residual-add + RMSNorm (in place, returning the pair through its
// arguments), rotary embedding applied in place, writing keys and values
// into a paged cache, paged attention over it, the experts of a fused MoE,
// a fused q/k-norm + rope, and the GEMM of FP8/FP4-quantized linears. Each
// op has one implementation for the CPU and, where the CUDA toolkit was
// found at build time (ZOO_WITH_CUDA), the GPU: the loops here, or the
// kernels of ZooKernelsCuda.cu for CUDA tensors. They compute in
// float and write the tensor's own dtype.
//
// Bug switches (`zoo::set_bugs`) plant the kernel-level silent errors of
// ../shared/ZOO.md. Nothing outside these switches knows about them.
//
//===----------------------------------------------------------------------===//
#include <torch/library.h>
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#ifdef ZOO_WITH_CUDA
#include "ZooCuda.h"
#include <c10/cuda/CUDAStream.h>
#endif

namespace {

#ifdef ZOO_WITH_CUDA
/// The stream the op's caller computes on, for a kernel on \p T's device.
void *streamOf(const at::Tensor &T) {
  return c10::cuda::getCurrentCUDAStream(T.device().index()).stream();
}
void launched(int Error, const char *Kernel) {
  TORCH_CHECK(Error == 0, "zoo: launching ", Kernel, " failed: CUDA error ", Error);
}
#endif

/// Makes the op's tensors' device the current one (a GPU's, for its stream).
struct DeviceGuard : c10::OptionalDeviceGuard {
  explicit DeviceGuard(at::Device D) : c10::OptionalDeviceGuard(D) {
#ifndef ZOO_WITH_CUDA
    TORCH_CHECK(!D.is_cuda(), "zoo: the kernels were built without CUDA (no nvcc at build time)");
#endif
  }
};

std::set<std::string> &bugs() {
  static std::set<std::string> B;
  return B;
}
bool bug(const char *Name) { return bugs().count(Name) != 0; }

void setBugs(std::string List) {
  bugs().clear();
  std::stringstream In(List);
  std::string Item;
  while (std::getline(In, Item, ','))
    if (!Item.empty())
      bugs().insert(Item);
}

/// y = x / rms(x) * (offset + w), over the last dimension, in float.
void rmsNormRow(const float *X, const float *W, float *Y, int64_t N, double Eps, double Offset) {
  double Sum = 0;
  for (int64_t I = 0; I < N; ++I)
    Sum += double(X[I]) * X[I];
  float Inv = float(1.0 / std::sqrt(Sum / N + Eps));
  for (int64_t I = 0; I < N; ++I)
    Y[I] = X[I] * Inv * float(Offset + W[I]);
}

// out = rms_norm(input) * (offset + weight)
void rmsNorm(at::Tensor Out, const at::Tensor &Input, const at::Tensor &Weight, double Eps,
             double Offset) {
  DeviceGuard Guard(Input.device());
  at::Tensor X = Input.to(at::kFloat).contiguous();
  at::Tensor W = Weight.to(at::kFloat).contiguous();
  int64_t N = X.size(-1), Rows = X.numel() / N;
  at::Tensor Y = at::empty_like(X);
#ifdef ZOO_WITH_CUDA
  if (X.is_cuda()) {
    launched(zoo::cuda::rmsNorm(Y.data_ptr<float>(), X.data_ptr<float>(), W.data_ptr<float>(),
                                Rows, N, Eps, Offset, streamOf(X)),
             "zoo_rms_norm_kernel");
    Out.copy_(Y.view(Out.sizes()));
    return;
  }
#endif
  for (int64_t R = 0; R < Rows; ++R)
    rmsNormRow(X.data_ptr<float>() + R * N, W.data_ptr<float>(), Y.data_ptr<float>() + R * N, N,
               Eps, Offset);
  Out.copy_(Y.view(Out.sizes()));
}

// residual += input (in the residual's dtype, as vLLM does); input = norm(residual).
void fusedAddRmsNorm(at::Tensor Input, at::Tensor Residual, const at::Tensor &Weight, double Eps,
                     double Offset) {
  if (bug("norm-residual-stale")) {
    // The planted bug: the sum is normalized but never stored back into the
    // residual, which keeps its old value for the next layer.
    at::Tensor Sum = Residual + Input;
    rmsNorm(Input, Sum, Weight, Eps, Offset);
    return;
  }
  Residual.add_(Input);
  rmsNorm(Input, Residual, Weight, Eps, Offset);
}

// Rotary embedding applied in place to query [T, Hq*D] and key [T, Hk*D]:
// neox style (the two halves of each head rotate together) or interleaved
// (GPT-J style: element pairs 2i, 2i+1).
void rotaryEmbedding(const at::Tensor &Positions, at::Tensor Query, at::Tensor Key, int64_t HeadDim,
                     double Theta, bool Neox) {
  DeviceGuard Guard(Query.device());
  auto Apply = [&](at::Tensor T) {
    int64_t Tokens = T.size(0);
    at::Tensor F = T.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true)
                       .reshape({Tokens, -1, HeadDim})
                       .contiguous();
    int64_t Heads = F.size(1), Half = HeadDim / 2;
    float *P = F.data_ptr<float>();
    at::Tensor Pos = Positions.to(at::kLong).contiguous();
#ifdef ZOO_WITH_CUDA
    if (F.is_cuda()) {
      launched(zoo::cuda::rotary(P, Pos.data_ptr<int64_t>(), Tokens, Heads, HeadDim, Theta, Neox,
                                 streamOf(F)),
               "zoo_rotary_kernel");
      T.copy_(F.view(T.sizes()));
      return;
    }
#endif
    for (int64_t Tk = 0; Tk < Tokens; ++Tk) {
      double Position = double(Pos.data_ptr<int64_t>()[Tk]);
      for (int64_t I = 0; I < Half; ++I) {
        double InvFreq = 1.0 / std::pow(Theta, double(2 * I) / double(HeadDim));
        float C = float(std::cos(Position * InvFreq)), S = float(std::sin(Position * InvFreq));
        for (int64_t H = 0; H < Heads; ++H) {
          float *Row = P + (Tk * Heads + H) * HeadDim;
          int64_t First = Neox ? I : 2 * I, Second = Neox ? I + Half : 2 * I + 1;
          float A = Row[First], B = Row[Second];
          Row[First] = A * C - B * S;
          Row[Second] = B * C + A * S;
        }
      }
    }
    T.copy_(F.view(T.sizes()));
  };
  Apply(Query);
  Apply(Key);
}

// vLLM's fused q/k-norm + rope (Qwen3): each head of query [T, Hq*D] and
// key [T, Hk*D] RMS-normalized with its own weight, then rotated, in place.
// One op where the unfused path makes three module calls (q_norm, k_norm,
// rotary_emb), called by the attention block itself.
void fusedQkNormRope(at::Tensor Query, at::Tensor Key, const at::Tensor &QWeight,
                     const at::Tensor &KWeight, const at::Tensor &Positions, double Eps,
                     double Offset, int64_t HeadDim, double Theta, bool Neox) {
  DeviceGuard Guard(Query.device());
  auto NormHeads = [&](at::Tensor T, const at::Tensor &W) {
    at::Tensor Heads = T.view({T.size(0), -1, HeadDim});
    rmsNorm(Heads, Heads, W, Eps, Offset);
  };
  NormHeads(Query, QWeight);
  // The planted bug: the key heads are normalized with the query norm's
  // weight.
  NormHeads(Key, bug("fused-qknorm-kweight") ? QWeight : KWeight);
  rotaryEmbedding(Positions, Query, Key, HeadDim, Theta, Neox);
}

// Writes key/value [T, Hk, D] into the paged caches [blocks, block_size, Hk, D]
// at slot_mapping[t] = block * block_size + offset.
void reshapeAndCache(const at::Tensor &Key, const at::Tensor &Value, at::Tensor KeyCache,
                     at::Tensor ValueCache, const at::Tensor &SlotMapping) {
  DeviceGuard Guard(Key.device());
  int64_t BlockSize = KeyCache.size(1);
  at::Tensor Slots = SlotMapping.to(at::kLong).contiguous();
  if (bug("kv-cache-write-slot") && Slots.numel() > 0) {
    // The planted bug: the write's last token goes one slot past its own.
    Slots = Slots.clone();
    Slots[-1] += 1;
  }
#ifdef ZOO_WITH_CUDA
  if (Key.is_cuda()) {
    TORCH_CHECK(KeyCache.is_contiguous() && ValueCache.is_contiguous() &&
                    Key.scalar_type() == KeyCache.scalar_type() &&
                    Value.scalar_type() == ValueCache.scalar_type(),
                "zoo::reshape_and_cache: contiguous caches of the keys' dtype expected");
    at::Tensor K = Key.contiguous(), V = Value.contiguous();
    int64_t Tokens = K.size(0);
    launched(zoo::cuda::reshapeAndCache(K.data_ptr(), V.data_ptr(), KeyCache.data_ptr(),
                                        ValueCache.data_ptr(), Slots.data_ptr<int64_t>(), Tokens,
                                        Tokens ? K.numel() / Tokens * K.element_size() : 0,
                                        streamOf(K)),
             "zoo_reshape_and_cache_kernel");
    return;
  }
#endif
  for (int64_t T = 0; T < Key.size(0); ++T) {
    int64_t Slot = Slots.data_ptr<int64_t>()[T];
    KeyCache[Slot / BlockSize][Slot % BlockSize].copy_(Key[T]);
    ValueCache[Slot / BlockSize][Slot % BlockSize].copy_(Value[T]);
  }
}

// out[t] = softmax(q[t] . K^T * scale) V over the cached positions the token
// may see: positions <= positions[t], and > positions[t] - window when
// window > 0. Token t belongs to sequence seq_ids[t], whose pages are
// block_tables[seq_ids[t]]; query heads share key heads in groups (GQA).
void pagedAttention(at::Tensor Out, const at::Tensor &Query, const at::Tensor &KeyCache,
                    const at::Tensor &ValueCache, const at::Tensor &BlockTables,
                    const at::Tensor &SeqIds, const at::Tensor &Positions, double Scale,
                    int64_t Window) {
  DeviceGuard Guard(Query.device());
  int64_t Tokens = Query.size(0), Heads = Query.size(1), HeadDim = Query.size(2);
  int64_t BlockSize = KeyCache.size(1), KvHeads = KeyCache.size(2);
  int64_t Group = Heads / KvHeads;
  at::Tensor Q = Query.to(at::kFloat).contiguous();
  at::Tensor K = KeyCache.to(at::kFloat).contiguous();
  at::Tensor V = ValueCache.to(at::kFloat).contiguous();
  at::Tensor Blocks = BlockTables.to(at::kLong).contiguous();
  at::Tensor Seqs = SeqIds.to(at::kLong).contiguous();
  int64_t MaxBlocks = Blocks.size(-1);
  at::Tensor Pos = Positions.to(at::kLong).contiguous();
  at::Tensor O = at::zeros({Tokens, Heads, HeadDim}, Q.options());
#ifdef ZOO_WITH_CUDA
  if (Q.is_cuda()) {
    int64_t MaxPosition = Tokens ? Pos.max().item<int64_t>() : 0;
    launched(zoo::cuda::pagedAttention(
                 O.data_ptr<float>(), Q.data_ptr<float>(), K.data_ptr<float>(), V.data_ptr<float>(),
                 Blocks.data_ptr<int64_t>(), Seqs.data_ptr<int64_t>(), Pos.data_ptr<int64_t>(),
                 Tokens, Heads, KvHeads, HeadDim, BlockSize, MaxBlocks, MaxPosition, Scale, Window,
                 bug("paged-attn-last-page"), streamOf(Q)),
             "zoo_paged_attention_kernel");
    Out.copy_(O.view(Out.sizes()));
    return;
  }
#endif
  const float *Qp = Q.data_ptr<float>(), *Kp = K.data_ptr<float>(), *Vp = V.data_ptr<float>();
  float *Op = O.data_ptr<float>();
  const int64_t *Table = nullptr; // the current token's sequence's pages
  auto CacheRow = [&](const float *Cache, int64_t Position, int64_t KvHead) {
    int64_t Block = Table[Position / BlockSize];
    return Cache + ((Block * BlockSize + Position % BlockSize) * KvHeads + KvHead) * HeadDim;
  };
  std::vector<float> Scores;
  for (int64_t T = 0; T < Tokens; ++T) {
    Table = Blocks.data_ptr<int64_t>() + Seqs.data_ptr<int64_t>()[T] * MaxBlocks;
    int64_t Last = Pos.data_ptr<int64_t>()[T];
    int64_t First = Window > 0 ? std::max<int64_t>(0, Last - Window + 1) : 0;
    int64_t End = Last + 1;
    if (bug("paged-attn-last-page"))
      End = (Last / BlockSize + 1) * BlockSize; // the whole last page, filled or not
    for (int64_t H = 0; H < Heads; ++H) {
      const float *Qr = Qp + (T * Heads + H) * HeadDim;
      Scores.assign(End - First, 0.0f);
      float Max = -std::numeric_limits<float>::infinity();
      for (int64_t P = First; P < End; ++P) {
        const float *Kr = CacheRow(Kp, P, H / Group);
        double Dot = 0;
        for (int64_t D = 0; D < HeadDim; ++D)
          Dot += double(Qr[D]) * Kr[D];
        Scores[P - First] = float(Dot * Scale);
        Max = std::max(Max, Scores[P - First]);
      }
      double Sum = 0;
      for (float &S : Scores)
        Sum += (S = std::exp(S - Max));
      float *Or = Op + (T * Heads + H) * HeadDim;
      for (int64_t P = First; P < End; ++P) {
        const float *Vr = CacheRow(Vp, P, H / Group);
        float Wt = float(Scores[P - First] / Sum);
        for (int64_t D = 0; D < HeadDim; ++D)
          Or[D] += Wt * Vr[D];
      }
    }
  }
  Out.copy_(O.view(Out.sizes()));
}

// Fused mixture of experts: out = sum over each token's top-k experts of
// weight * w2[e] (silu(gate) * up), where [gate; up] = w13[e] x is split at
// `split` rows (the expert's intermediate size). Routing: softmax of
// router_logits in float, top-k, optionally renormalized. out may be
// hidden_states itself (vLLM's in-place variant).
// With a correction bias (Ernie-4.5), the experts are chosen by
// probability + bias, weighted by probability, and renormalized with the sum
// clamped at norm_min. The probabilities are computed in the router logits'
// dtype's precision as given (the router's own business).
void fusedMoe(at::Tensor Out, const at::Tensor &Hidden, const at::Tensor &W13, const at::Tensor &W2,
              const at::Tensor &RouterLogits, int64_t TopK, bool Renormalize, int64_t Split,
              const std::optional<at::Tensor> &CorrectionBias, double NormMin) {
  DeviceGuard Guard(Hidden.device());
  at::Tensor X = Hidden.to(at::kFloat).contiguous();
  at::Tensor Probs = at::softmax(RouterLogits.to(at::kFloat), -1);
  at::Tensor Weights, Experts;
  if (CorrectionBias) {
    at::Tensor Biased = Probs.to(RouterLogits.scalar_type()) + CorrectionBias->to(RouterLogits.scalar_type()).view({-1});
    Experts = std::get<1>(at::topk(Biased.to(at::kFloat), TopK, -1));
    Weights = at::gather(Probs, -1, Experts);
    Weights = Weights / at::clamp_min(Weights.sum(-1, true), NormMin);
  } else {
    std::tie(Weights, Experts) = at::topk(Probs, TopK, -1);
    if (Renormalize)
      Weights = Weights / Weights.sum(-1, true);
  }
  at::Tensor Y = at::zeros_like(X);
  int64_t Inter = W2.size(2);
#ifdef ZOO_WITH_CUDA
  if (X.is_cuda()) {
    int64_t Tokens = X.size(0), Hidden = X.size(1);
    at::Tensor Act = at::empty({Tokens, TopK, Inter}, X.options());
    at::Tensor F13 = W13.to(at::kFloat).contiguous(), F2 = W2.to(at::kFloat).contiguous();
    at::Tensor E = Experts.to(at::kLong).contiguous(), Wt = Weights.to(at::kFloat).contiguous();
    launched(zoo::cuda::fusedMoe(Y.data_ptr<float>(), Act.data_ptr<float>(), X.data_ptr<float>(),
                                 F13.data_ptr<float>(), F2.data_ptr<float>(),
                                 E.data_ptr<int64_t>(), Wt.data_ptr<float>(), Tokens, TopK, Hidden,
                                 F13.size(1), Inter, Split, streamOf(X)),
             "zoo_moe_gate_up_kernel / zoo_moe_down_kernel");
    Out.copy_(Y.view(Out.sizes()));
    return;
  }
#endif
  for (int64_t T = 0; T < X.size(0); ++T)
    for (int64_t K = 0; K < TopK; ++K) {
      int64_t E = Experts[T][K].item<int64_t>();
      at::Tensor H = at::matmul(W13[E].to(at::kFloat), X[T]);
      at::Tensor Gate = H.narrow(0, 0, Inter), Up = H.narrow(0, Split, Inter);
      at::Tensor A = at::silu(Gate) * Up;
      Y[T] += Weights[T][K].item<float>() * at::matmul(W2[E].to(at::kFloat), A);
    }
  Out.copy_(Y.view(Out.sizes()));
}

// The weights of a quantized GEMM as the float values of their codes (not
// yet scaled): float8 e4m3 as stored, or FP4 e2m1 codes two per byte (even
// columns in the low nibble, the sign in each code's bit 3).
at::Tensor quantizedValues(const at::Tensor &QWeight, const std::string &Format) {
  if (Format == "fp8")
    return QWeight.to(at::kFloat);
  TORCH_CHECK(Format == "fp4", "zoo::quant_gemm: unknown format '", Format, "'");
  at::Tensor Grid = at::tensor({0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f},
                               at::TensorOptions().device(QWeight.device()));
  at::Tensor Bytes = QWeight.to(at::kLong);
  at::Tensor Codes = at::stack({Bytes.bitwise_and(15), Bytes.bitwise_right_shift(4)}, -1)
                         .flatten(-2);
  return Grid.index({Codes});
}

// out = (input . q^T) * scale + bias, where q are the weight codes' values
// and scale one float per output row: the products are accumulated in fp32
// over the unscaled codes, then scaled (as FP4/FP8 GEMMs with a global scale
// do). The planted bug `fp4-gemm-overflow` casts the fp32 accumulator to
// fp16 before the scale: large activations overflow to infinity.
void quantGemm(at::Tensor Out, const at::Tensor &Input, const at::Tensor &QWeight,
               const at::Tensor &Scales, const std::optional<at::Tensor> &Bias,
               std::string Format) {
  DeviceGuard Guard(Input.device());
  int64_t K = Input.size(-1);
  at::Tensor X = Input.to(at::kFloat).reshape({-1, K}).contiguous();
  at::Tensor Q = quantizedValues(QWeight, Format).contiguous();
  TORCH_CHECK(Q.size(1) == K, "zoo::quant_gemm: weight of ", Q.size(1), " columns for input of ", K);
  at::Tensor S = Scales.to(at::kFloat).contiguous();
  bool Overflow = Format == "fp4" && bug("fp4-gemm-overflow");
  at::Tensor Y;
#ifdef ZOO_WITH_CUDA
  if (X.is_cuda()) {
    Y = at::empty({X.size(0), Q.size(0)}, X.options());
    launched(zoo::cuda::quantGemm(Y.data_ptr<float>(), X.data_ptr<float>(), Q.data_ptr<float>(),
                                  S.data_ptr<float>(), X.size(0), Q.size(0), K, Overflow,
                                  streamOf(X)),
             "zoo_quant_gemm_kernel");
  }
#endif
  if (!Y.defined()) {
    at::Tensor Acc = at::matmul(X, Q.t());
    if (Overflow)
      Acc = Acc.to(at::kHalf).to(at::kFloat);
    Y = Acc * S;
  }
  if (Bias)
    Y = Y + Bias->to(at::kFloat);
  Out.copy_(Y.view(Out.sizes()));
}

} // namespace

TORCH_LIBRARY(zoo, m) {
  m.def("set_bugs(str bugs) -> ()", setBugs);
  m.def("rms_norm(Tensor(a!) out, Tensor input, Tensor weight, float eps, float offset) -> ()");
  m.def("fused_add_rms_norm(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float eps, "
        "float offset) -> ()");
  m.def("rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!) key, int head_dim, "
        "float theta, bool neox) -> ()");
  m.def("reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, "
        "Tensor(b!) value_cache, Tensor slot_mapping) -> ()");
  m.def("paged_attention(Tensor(a!) out, Tensor query, Tensor key_cache, Tensor value_cache, "
        "Tensor block_tables, Tensor seq_ids, Tensor positions, float scale, int window) -> ()");
}

TORCH_LIBRARY_FRAGMENT(zoo, m) {
  m.def("fused_moe(Tensor(a!) out, Tensor hidden_states, Tensor w13, Tensor w2, "
        "Tensor router_logits, int top_k, bool renormalize, int split, "
        "Tensor? correction_bias=None, float norm_min=0.0) -> ()");
  m.def("quant_gemm(Tensor(a!) out, Tensor input, Tensor qweight, Tensor scales, Tensor? bias, "
        "str format) -> ()");
  m.def("fused_qk_norm_rope(Tensor(a!) query, Tensor(b!) key, Tensor q_weight, Tensor k_weight, "
        "Tensor positions, float eps, float offset, int head_dim, float theta, bool neox) -> ()");
}

// One implementation per op for every device (each sends CUDA tensors to
// its kernels in ZooKernelsCuda.cu, where they were built).
TORCH_LIBRARY_IMPL(zoo, CompositeExplicitAutograd, m) {
  m.impl("fused_moe", fusedMoe);
  m.impl("rms_norm", rmsNorm);
  m.impl("fused_add_rms_norm", fusedAddRmsNorm);
  m.impl("rotary_embedding", rotaryEmbedding);
  m.impl("reshape_and_cache", reshapeAndCache);
  m.impl("paged_attention", pagedAttention);
  m.impl("quant_gemm", quantGemm);
  m.impl("fused_qk_norm_rope", fusedQkNormRope);
}
