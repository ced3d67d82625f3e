"""The engine's model: decoder-only transformers (Llama and Gemma-3 style)
with vLLM's module structure and names. Tensors are token-major:
[tokens, hidden], one sequence at a time."""
import math

import torch
from torch import nn


class Arch:
    """What differs between the supported families, read off a HF config."""

    def __init__(self, hf_config, quant=None, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                 options=None):
        c = hf_config
        # The engine's own switches, as a server's flags: fused_qk_norm_rope,
        # vocab_parallel.
        self.options = dict(options or {})
        # Weight quantization of the decoder's linear layers: None, fp8, fp4.
        self.quant = quant
        # Tensor parallelism (vLLM's): each rank holds its share of the
        # attention heads and of the MLP's intermediate size; the counts
        # below are the rank's own.
        self.tp_rank, self.tp_size = tp_rank, tp_size
        # Pipeline parallelism: this stage's share of the layers; the first
        # stage embeds, the last one norms and projects.
        self.pp_rank, self.pp_size = pp_rank, pp_size
        per_stage = -(-c.num_hidden_layers // pp_size)
        self.stage_layers = range(pp_rank * per_stage,
                                  min(c.num_hidden_layers, (pp_rank + 1) * per_stage))
        self.first_stage, self.last_stage = pp_rank == 0, pp_rank == pp_size - 1
        self.family = ("gemma3" if c.model_type.startswith("gemma3") else
                       c.model_type if c.model_type in ("qwen2_moe", "qwen3", "qwen3_moe",
                                                        "ernie4_5_moe")
                       else "llama")
        self.num_labels = getattr(c, "num_labels", 0)
        # Rotary: neox style (halves) or interleaved pairs (Ernie-4.5).
        self.rope_neox = self.family != "ernie4_5_moe"
        self.vocab_size = c.vocab_size
        self.hidden_size = c.hidden_size
        self.num_layers = c.num_hidden_layers
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        for count in (c.num_attention_heads, c.num_key_value_heads, c.intermediate_size):
            if count % tp_size:
                raise SystemExit(f"zoo: {count} heads or columns do not split over {tp_size} ranks")
        self.intermediate_size = c.intermediate_size // tp_size
        self.num_heads = c.num_attention_heads // tp_size
        self.num_kv_heads = c.num_key_value_heads // tp_size
        self.eps = c.rms_norm_eps
        self.tie_word_embeddings = bool(getattr(c, "tie_word_embeddings", False))
        # vLLM's VocabParallelEmbedding: under tensor parallelism each rank
        # holds an equal share of the vocabulary padded to a multiple of 64.
        self.vocab_parallel = tp_size > 1 and bool(self.options.get("vocab_parallel"))
        if self.vocab_parallel and self.tie_word_embeddings:
            raise SystemExit("zoo: a vocab-parallel embedding is for an untied head only")
        self.vocab_shard = -(-c.vocab_size // 64) * 64 // tp_size
        rope = getattr(c, "rope_parameters", None) or {}
        if self.family == "gemma3":
            self.norm_offset = 1.0  # Gemma's norms scale by (1 + weight)
            self.layer_types = list(c.layer_types)
            self.sliding_window = c.sliding_window
            self.rope_theta = {t: rope[t]["rope_theta"] for t in rope}
            self.scale = c.query_pre_attn_scalar ** -0.5
            self.activation = "gelu_tanh"
            self.embed_scale = c.hidden_size ** 0.5
            self.qk_norm = True
            # Gemma's final logit soft cap (none in Gemma-3's default config).
            self.final_softcap = getattr(c, "final_logit_softcapping", None)
        else:
            self.norm_offset = 0.0
            self.layer_types = ["full_attention"] * self.num_layers
            self.sliding_window = 0
            theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
            self.rope_theta = {"full_attention": theta}
            self.scale = self.head_dim ** -0.5
            self.activation = "silu"
            self.embed_scale = None
            self.qk_norm = self.family in ("qwen3", "qwen3_moe")
            self.final_softcap = None
        self.qkv_bias = bool(getattr(c, "qkv_bias", False) or getattr(c, "attention_bias", False))
        # Mixture of experts (Qwen2-MoE, Qwen3-MoE): which layers, how many
        # experts, each token's top k, the experts' and the shared expert's
        # intermediate sizes.
        self.num_experts = getattr(c, "num_experts", 0) or 0
        self.top_k = getattr(c, "num_experts_per_tok", 0)
        self.moe_intermediate_size = getattr(c, "moe_intermediate_size", 0)
        self.shared_intermediate_size = getattr(c, "shared_expert_intermediate_size", 0) or 0
        self.norm_topk_prob = bool(getattr(c, "norm_topk_prob", False))
        step = getattr(c, "decoder_sparse_step", 1) or 1
        dense = set(getattr(c, "mlp_only_layers", []) or [])
        self.moe_layers = {i for i in range(self.num_layers)
                           if self.num_experts and i not in dense and (i + 1) % step == 0}
        if self.num_experts and tp_size > 1:
            raise SystemExit("zoo: tensor parallelism is for dense models only")
        # Ernie-4.5: an fp32 router whose choice adds a correction bias.
        self.router_correction = self.family == "ernie4_5_moe"
        self.norm_min = getattr(c, "moe_norm_min", 0.0) if self.router_correction else 0.0
        if self.router_correction:
            self.norm_topk_prob = True
            self.shared_intermediate_size = 0
            self.moe_layers = {i for i in range(self.num_layers)
                               if (i + 1) % c.moe_layer_interval == 0
                               and c.moe_layer_start_index <= i <= c.moe_layer_end_index}


class RMSNorm(nn.Module):
    """RMSNorm; called with a residual, the fused add + norm: returns
    (norm(x + residual), x + residual), both written in place. `inplace`
    (without a residual) writes the norm over x."""

    def __init__(self, size, eps, offset):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size) if offset else torch.ones(size))
        self.eps, self.offset = eps, offset

    def forward(self, x, residual=None, inplace=False):
        if residual is None:
            out = x if inplace else torch.empty_like(x)
            torch.ops.zoo.rms_norm(out, x, self.weight, self.eps, self.offset)
            return out
        torch.ops.zoo.fused_add_rms_norm(x, residual, self.weight, self.eps, self.offset)
        return x, residual


class HeadNorm(RMSNorm):
    """Gemma-3's and Qwen3's q_norm/k_norm: RMSNorm over each head of
    [tokens, heads*dim]."""

    def __init__(self, head_dim, eps, offset, bugs, tp_size=1):
        super().__init__(head_dim, eps, offset)
        self.head_dim, self.bugs = head_dim, bugs
        # The planted bug: under tensor parallelism the norm runs over the
        # rank's heads flattened together (heads * dim), not head by head.
        self.flattened = "qk-norm-tp" in bugs and tp_size > 1

    def forward(self, x):
        if self.flattened:
            flat = x.reshape(x.shape[0], -1)
            weight = self.weight.repeat(flat.shape[-1] // self.head_dim)
            out = torch.empty_like(flat)
            torch.ops.zoo.rms_norm(out, flat, weight, self.eps, self.offset)
            return out.view_as(x)
        shaped = x.view(x.shape[0], -1, self.head_dim)
        out = torch.empty_like(shaped)
        torch.ops.zoo.rms_norm(out, shaped, self.weight, self.eps, self.offset)
        return out.view_as(x)


# The largest magnitude of each weight format, for the per-row scales.
QUANT_MAX = {"fp8": 448.0, "fp4": 6.0}
# FP4 (e2m1) magnitudes, by the code's low three bits; the fourth is the sign.
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def power_of_two_scales(weight, fmt):
    """Per output row: the smallest power of two s with max|w| / s within
    the format's range (a power of two keeps a quantized value exact in
    bf16). frexp, not log2: exact at powers of two."""
    amax = weight.abs().amax(dim=1).float().clamp_min(1e-30) / QUANT_MAX[fmt]
    mantissa, exponent = torch.frexp(amax)
    exponent = torch.where(mantissa == 0.5, exponent - 1, exponent)
    return torch.ldexp(torch.ones_like(amax), exponent)


def fp4_codes(q):
    """The nearest e2m1 code of each value (sign in bit 3), two per byte:
    even columns in the low nibble."""
    grid = torch.tensor(FP4_VALUES, device=q.device)
    codes = (q.abs().unsqueeze(-1) - grid).abs().argmin(dim=-1).to(torch.uint8)
    codes |= (q < 0).to(torch.uint8) << 3
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


class Linear(nn.Module):
    """A linear layer (vLLM's Column/RowParallelLinear on one rank). With
    `quant` ("fp8" or "fp4"), weights are quantized after loading (per
    output row, power-of-two scales, as vLLM's online quantization does for
    a 16-bit checkpoint) and run by the engine's own GEMM kernel
    (`zoo::quant_gemm`, dequantizing on the fly, accumulating in fp32)."""

    def __init__(self, in_features, out_features, bias=False, quant=None, reduce=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.quant = quant
        # Row-parallel (vLLM's RowParallelLinear under tensor parallelism):
        # each rank multiplies its share of the input features, and `reduce`
        # sums the partial products over the ranks.
        self.reduce = reduce
        if quant:
            self.allocate_quantized()

    def allocate_quantized(self):
        """What the kernel reads: allocated zero (again after the module is
        moved or cast: they keep their own dtypes), filled by quantize()."""
        out_features, in_features = self.weight.shape
        packed = in_features if self.quant == "fp8" else in_features // 2
        dtype = torch.float8_e4m3fn if self.quant == "fp8" else torch.uint8
        device = self.weight.device
        self.register_buffer("qweight", torch.zeros(out_features, packed, dtype=dtype,
                                                    device=device))
        self.register_buffer("weight_scale", torch.ones(out_features, device=device))

    def quantize(self):
        """Online quantization of the loaded 16-bit weight."""
        with torch.no_grad():
            w = self.weight.float()
            scale = power_of_two_scales(w, self.quant)
            q = w / scale.unsqueeze(1)
            self.qweight.copy_(q.to(torch.float8_e4m3fn) if self.quant == "fp8" else fp4_codes(q))
            self.weight_scale.copy_(scale)

    def forward(self, x):
        if self.reduce is not None:
            # The partial products in fp32, summed over the ranks, rounded
            # once: as one rank's matmul would round its fp32 accumulator.
            partial = torch.nn.functional.linear(x.float(), self.weight.float())
            out = self.reduce(partial).to(x.dtype)
            return out + self.bias if self.bias is not None else out
        if not self.quant:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        out = torch.empty(*x.shape[:-1], self.qweight.shape[0], dtype=x.dtype, device=x.device)
        torch.ops.zoo.quant_gemm(out, x, self.qweight, self.weight_scale, self.bias, self.quant)
        return out


def all_reduce(arch, bugs, layer):
    """The sum over the tensor-parallel ranks of a row-parallel layer's
    partial products (None without tensor parallelism)."""
    if arch.tp_size == 1:
        return None
    if layer == "down_proj" and "tp-mlp-reduce" in bugs:
        # The planted bug: the MLP's down projection is built with the
        # all-reduce switched off (an argument passed in the wrong place).
        return lambda partial: partial

    def reduce(partial):
        torch.distributed.all_reduce(partial)
        return partial
    return reduce


class RotaryEmbedding(nn.Module):
    """Applies rotary position embedding to q and k in place."""

    def __init__(self, head_dim, theta, neox=True):
        super().__init__()
        self.head_dim, self.theta, self.neox = head_dim, theta, neox

    def forward(self, positions, q, k):
        torch.ops.zoo.rotary_embedding(positions, q, k, self.head_dim, self.theta, self.neox)
        return q, k


class PagedAttention(nn.Module):
    """Writes this step's keys and values into the paged cache, then
    attends over the cache (the engine's own kernels)."""

    def __init__(self, num_heads, num_kv_heads, head_dim, scale, window):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale, self.window = scale, window
        self.kv_cache = None  # (key_cache, value_cache), set by the engine

    def forward(self, q, k, v, meta):
        t = q.shape[0]
        key_cache, value_cache = self.kv_cache
        torch.ops.zoo.reshape_and_cache(k.view(t, self.num_kv_heads, self.head_dim),
                                        v.view(t, self.num_kv_heads, self.head_dim),
                                        key_cache, value_cache, meta.slot_mapping)
        if getattr(meta, "attn_masks", None) is not None:
            return self.masked(q, k, v, meta.attn_masks)
        out = torch.empty(t, self.num_heads, self.head_dim, dtype=q.dtype, device=q.device)
        torch.ops.zoo.paged_attention(out, q.view(t, self.num_heads, self.head_dim), key_cache,
                                      value_cache, meta.block_tables, meta.seq_ids,
                                      meta.positions, self.scale, self.window)
        return out.view(t, self.num_heads * self.head_dim)

    def masked(self, q, k, v, masks):
        """The torch-native backend (SGLang's, for a prefill batch): each
        request's queries attend over this forward's keys through the
        request's boolean mask (rows: its tokens; columns: all tokens)."""
        t, h, d = q.shape[0], self.num_heads, self.head_dim
        group = self.num_heads // self.num_kv_heads
        qh = q.view(t, h, d).transpose(0, 1)
        kh = k.view(t, self.num_kv_heads, d).repeat_interleave(group, dim=1).transpose(0, 1)
        vh = v.view(t, self.num_kv_heads, d).repeat_interleave(group, dim=1).transpose(0, 1)
        out = torch.empty(t, h, d, dtype=q.dtype, device=q.device)
        for start, end, mask in masks:
            rows = torch.nn.functional.scaled_dot_product_attention(
                qh[:, start:end], kh, vh, attn_mask=mask, scale=self.scale)
            out[start:end] = rows.transpose(0, 1)
        return out.view(t, h * d)


class Attention(nn.Module):
    def __init__(self, arch, layer, bugs):
        super().__init__()
        a = arch
        self.q_size = a.num_heads * a.head_dim
        self.kv_size = a.num_kv_heads * a.head_dim
        self.qkv_proj = Linear(a.hidden_size, self.q_size + 2 * self.kv_size, bias=a.qkv_bias,
                               quant=a.quant)
        if a.qk_norm:
            self.q_norm = HeadNorm(a.head_dim, a.eps, a.norm_offset, bugs, a.tp_size)
            self.k_norm = HeadNorm(a.head_dim, a.eps, a.norm_offset, bugs, a.tp_size)
        layer_type = a.layer_types[layer]
        sliding = layer_type == "sliding_attention"
        # The per-layer window as the model's config gives it.
        window = a.sliding_window if sliding else 0
        if "swa-all-layers" in bugs:
            # The per-layer choice is read from a config key that no longer
            # exists: every layer falls back to the sliding window.
            window = a.sliding_window
        if "swa-size-unset" in bugs:
            window = 0  # the backend is created without the window
        theta = a.rope_theta.get(layer_type, next(iter(a.rope_theta.values())))
        if "rope-theta-default" in bugs:
            # The planted bug: the rope base is read from a config key that
            # no longer exists, so the default (10000) stands in for the
            # model's own (Llama-3's 500000).
            theta = 10000.0
        neox = a.rope_neox
        if "rope-style-neox" in bugs:
            # The planted bug: the rotary style is hard-coded to neox's
            # (halves) for every model, where Ernie-4.5 rotates interleaved
            # pairs.
            neox = True
        self.rotary_emb = RotaryEmbedding(a.head_dim, theta, neox)
        self.attn = PagedAttention(a.num_heads, a.num_kv_heads, a.head_dim, a.scale, window)
        self.o_proj = Linear(self.q_size, a.hidden_size, quant=a.quant,
                             reduce=all_reduce(a, bugs, "o_proj"))
        self.qk_norm = a.qk_norm
        # vLLM's fused q/k-norm + rope (Qwen3): one op, called by the
        # attention itself, in place of the q_norm, k_norm and rotary_emb
        # calls; those modules keep the weights and the rope's settings.
        self.fused_qk_norm_rope = a.qk_norm and bool(a.options.get("fused_qk_norm_rope"))

    def forward(self, positions, hidden_states, meta):
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = q.contiguous(), k.contiguous()
        if self.fused_qk_norm_rope:
            rope = self.rotary_emb
            torch.ops.zoo.fused_qk_norm_rope(q, k, self.q_norm.weight, self.k_norm.weight,
                                             positions, self.q_norm.eps, self.q_norm.offset,
                                             rope.head_dim, rope.theta, rope.neox)
            return self.o_proj(self.attn(q, k, v.contiguous(), meta))
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v.contiguous(), meta))


class ActAndMul(nn.Module):
    """act(x[..., :d]) * x[..., d:] (vLLM's SiluAndMul / GeluAndMul)."""

    def __init__(self, activation):
        super().__init__()
        self.activation = activation

    def forward(self, x):
        d = x.shape[-1] // 2
        gate, up = x[..., :d], x[..., d:]
        if self.activation == "silu":
            return torch.nn.functional.silu(gate) * up
        return torch.nn.functional.gelu(gate, approximate="tanh") * up


class MLP(nn.Module):
    def __init__(self, arch, bugs, intermediate_size=None):
        super().__init__()
        intermediate_size = intermediate_size or arch.intermediate_size
        self.gate_up_proj = Linear(arch.hidden_size, 2 * intermediate_size, quant=arch.quant)
        self.act_fn = ActAndMul(arch.activation)
        self.down_proj = Linear(intermediate_size, arch.hidden_size, quant=arch.quant,
                                reduce=all_reduce(arch, bugs, "down_proj"))
        self.bugs = bugs

    def forward(self, x):
        out = torch.empty_like(x)
        result = self.down_proj(self.act_fn(self.gate_up_proj(x)))
        if "output-not-written" in self.bugs and x.shape[0] > 1:
            # The prefill path computes its result and returns the
            # pre-allocated buffer without copying into it.
            return out.zero_()
        out.copy_(result)
        return out


class FusedMoE(nn.Module):
    """The experts as stacked weights (w13 = [gate; up] per expert, w2),
    run by the fused kernel `zoo::fused_moe` with the router's logits."""

    def __init__(self, arch, bugs):
        super().__init__()
        e, h, i = arch.num_experts, arch.hidden_size, arch.moe_intermediate_size
        self.w13_weight = nn.Parameter(torch.empty(e, 2 * i, h))
        self.w2_weight = nn.Parameter(torch.empty(e, h, i))
        self.top_k, self.renormalize = arch.top_k, arch.norm_topk_prob
        self.intermediate_size = i
        if "moe-intermediate" in bugs:
            # The stacked w13 is split at a wrong intermediate size.
            self.intermediate_size = i // 2
        self.inplace = "moe-inplace-shared" in bugs

    def forward(self, hidden_states, router_logits, correction_bias=None, norm_min=0.0):
        # The planted bug writes the result over the input it was given.
        out = hidden_states if self.inplace else torch.empty_like(hidden_states)
        torch.ops.zoo.fused_moe(out, hidden_states, self.w13_weight, self.w2_weight, router_logits,
                                self.top_k, self.renormalize, self.intermediate_size,
                                correction_bias, norm_min)
        return out


class MoeStatics(nn.Module):
    """Holds Ernie-4.5's expert-choice correction bias (a parameter only)."""

    def __init__(self, num_experts):
        super().__init__()
        self.e_score_correction_bias = nn.Parameter(torch.zeros(1, num_experts))


class Router(nn.Module):
    """Ernie-4.5's router: logits in float32 from float32 weights (the
    weights stay float32 in a 16-bit model), and the correction bias."""

    def __init__(self, arch, bugs):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(arch.num_experts, arch.hidden_size))
        self.moe_statics = MoeStatics(arch.num_experts)
        # The planted bug runs the router and its bias in the model's dtype.
        self.keep_fp32 = "router-dtype" not in bugs

    def forward(self, hidden_states):
        if self.keep_fp32:
            return torch.nn.functional.linear(hidden_states.float(), self.weight.float())
        return torch.nn.functional.linear(hidden_states, self.weight.to(hidden_states.dtype))


class SparseMoeBlock(nn.Module):
    """Router, fused experts and (Qwen2-MoE) a gated shared expert."""

    def __init__(self, arch, bugs):
        super().__init__()
        self.correction = arch.router_correction
        self.norm_min = arch.norm_min
        self.gate = Router(arch, bugs) if self.correction else Linear(arch.hidden_size,
                                                                      arch.num_experts)
        self.experts = FusedMoE(arch, bugs)
        self.shared = bool(arch.shared_intermediate_size)
        if self.shared:
            self.shared_expert = MLP(arch, frozenset(), arch.shared_intermediate_size)
            self.shared_expert_gate = Linear(arch.hidden_size, 1)
        self.bugs = bugs

    def forward(self, hidden_states):
        router_logits = self.gate(hidden_states)
        if self.correction:
            bias = self.gate.moe_statics.e_score_correction_bias.to(router_logits.dtype)
            routed = self.experts(hidden_states, router_logits, bias, self.norm_min)
        else:
            routed = self.experts(hidden_states, router_logits)
        if not self.shared:
            return routed
        shared = self.shared_expert(hidden_states)
        if "shared-gate-softmax" in self.bugs:
            # The planted bug: the shared expert's gate is normalized as a
            # router's logits are, a softmax over its single logit: always 1.
            return routed + torch.softmax(self.shared_expert_gate(hidden_states), dim=-1) * shared
        shared = torch.sigmoid(self.shared_expert_gate(hidden_states)) * shared
        return routed + shared


class DecoderLayer(nn.Module):
    def __init__(self, arch, layer, bugs):
        super().__init__()
        a = arch
        self.gemma = a.family == "gemma3"
        self.input_layernorm = RMSNorm(a.hidden_size, a.eps, a.norm_offset)
        self.self_attn = Attention(a, layer, bugs)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.eps, a.norm_offset)
        if self.gemma:
            self.pre_feedforward_layernorm = RMSNorm(a.hidden_size, a.eps, a.norm_offset)
            self.post_feedforward_layernorm = RMSNorm(a.hidden_size, a.eps, a.norm_offset)
        self.mlp = SparseMoeBlock(a, bugs) if layer in a.moe_layers else MLP(a, bugs)
        self.residual_alias = "residual-alias-inplace" in bugs

    def forward(self, hidden_states, residual, positions, meta):
        if residual is None and self.residual_alias:
            # The planted bug: the first layer's norm runs in place, but the
            # residual still aliases its input (the clone was dropped), so
            # the residual becomes the normed embedding.
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states, inplace=True)
        elif residual is None:
            residual = hidden_states.clone()
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, meta)
        if self.gemma:
            hidden_states = self.post_attention_layernorm(hidden_states)
            hidden_states, residual = self.pre_feedforward_layernorm(hidden_states, residual)
            hidden_states = self.post_feedforward_layernorm(self.mlp(hidden_states))
        else:
            hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
            hidden_states = self.mlp(hidden_states)
        return hidden_states, residual


class Embedding(nn.Module):
    """The token embedding; vocab-parallel (Arch.vocab_parallel), this
    rank's rows of the padded vocabulary: each rank embeds the ids in its
    share, zero elsewhere, and the ranks' sum is every id's row."""

    def __init__(self, arch, bugs=frozenset()):
        super().__init__()
        self.vocab_parallel = arch.vocab_parallel
        rows = arch.vocab_shard if self.vocab_parallel else arch.vocab_size
        self.start = arch.tp_rank * rows if self.vocab_parallel else 0
        self.weight = nn.Parameter(torch.empty(rows, arch.hidden_size))
        self.scale = arch.embed_scale
        if "embed-scale-missing" in bugs:
            # The planted bug: Gemma's sqrt(hidden) normalizer of the
            # embedding is not applied.
            self.scale = None

    def forward(self, ids):
        if self.vocab_parallel:
            rows = self.weight.shape[0]
            own = (ids >= self.start) & (ids < self.start + rows)
            x = torch.nn.functional.embedding(torch.where(own, ids - self.start, 0), self.weight)
            partial = x.float() * own.unsqueeze(-1)
            torch.distributed.all_reduce(partial)
            x = partial.to(self.weight.dtype)
        else:
            x = torch.nn.functional.embedding(ids, self.weight)
        if self.scale is not None:
            x = x * torch.tensor(self.scale, dtype=x.dtype, device=x.device)
        return x


class MissingLayer(nn.Module):
    """A part another pipeline stage holds (vLLM's PPMissingLayer)."""


class Model(nn.Module):
    """The decoder. Under pipeline parallelism a stage runs its own layers:
    the first embeds the tokens, the others take the previous stage's
    (hidden states, residual) and return their own; the last one norms."""

    def __init__(self, arch, bugs):
        super().__init__()
        a = arch
        self.arch = a
        self.embed_tokens = Embedding(a, bugs) if a.first_stage else MissingLayer()
        self.layers = nn.ModuleList(DecoderLayer(a, i, bugs) if i in a.stage_layers
                                    else MissingLayer() for i in range(a.num_layers))
        self.norm = (RMSNorm(a.hidden_size, a.eps, a.norm_offset) if a.last_stage
                     else MissingLayer())
        self.skip_final_norm = "final-norm-skipped" in bugs

    def forward(self, ids, positions, meta, intermediate=None):
        if self.arch.first_stage:
            hidden_states, residual = self.embed_tokens(ids), None
        else:
            hidden_states, residual = intermediate
        for i in self.arch.stage_layers:
            hidden_states, residual = self.layers[i](hidden_states, residual,
                                                     positions=positions, meta=meta)
        if not self.arch.last_stage:
            return hidden_states, residual
        if self.skip_final_norm:
            # The planted bug: the final norm is skipped; the last layer's
            # output is added to the residual by hand and goes to the head
            # unnormalized.
            return hidden_states + residual
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LogitsProcessor(nn.Module):
    """Logits of the positions the engine samples from (here: every
    position, as the reference computes them), in float32; soft-capped
    (cap * tanh(logits / cap)) where the model has a final cap."""

    def __init__(self, softcap=None):
        super().__init__()
        self.softcap = softcap

    def forward(self, logits):
        logits = logits.float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


class ForCausalLM(nn.Module):
    def __init__(self, arch, bugs=frozenset()):
        super().__init__()
        self.arch = arch
        self.model = Model(arch, bugs)
        if arch.last_stage:
            self.lm_head = Linear(arch.hidden_size, arch.vocab_size)
            softcap = arch.final_softcap
            if "softcap-key-wrong" in bugs:
                # The planted bug: the cap is read from a config key the
                # model's config does not have, so none is applied.
                softcap = None
            self.logits_processor = LogitsProcessor(softcap)

    def forward(self, ids, positions, meta, intermediate=None):
        """The logits; on a stage before the last, what it hands on."""
        hidden = self.model(ids, positions, meta=meta, intermediate=intermediate)
        if not self.arch.last_stage:
            return hidden
        return self.logits_processor(self.lm_head(hidden))


class MeanPooler(nn.Module):
    """Mean of each sequence's hidden states over its tokens, as vLLM's
    pooler computes it for a flattened batch: differences of a cumulative
    sum at the sequences' boundaries, in float32."""

    def __init__(self, bugs):
        super().__init__()
        self.bugs = bugs

    def forward(self, hidden_states, prompt_lens):
        dtype = hidden_states.dtype if "pool-cumsum-bf16" in self.bugs else torch.float32
        # The planted bug keeps the cumulative sum over the whole flattened
        # batch in the model's 16-bit dtype.
        cumsum = torch.cumsum(hidden_states.to(dtype), dim=0)
        ends = torch.cumsum(prompt_lens, dim=0) - 1
        starts = ends - prompt_lens
        zero = torch.zeros_like(cumsum[:1])
        padded = torch.cat([zero, cumsum])
        sums = padded[ends + 1] - padded[starts + 1]
        return sums.float() / prompt_lens.unsqueeze(-1).float()


class ForSequenceClassification(nn.Module):
    """A decoder with a score head (vLLM's *ForSequenceClassification): the
    head scores every token's hidden state; the last token's scores are the
    sequence's."""

    def __init__(self, arch, bugs=frozenset()):
        super().__init__()
        self.arch = arch
        self.model = Model(arch, bugs)
        self.score = Linear(arch.hidden_size, arch.num_labels)

    def forward(self, ids, positions, meta):
        return self.score(self.model(ids, positions, meta=meta))


class ForEmbedding(nn.Module):
    """A decoder as an embedding model: the last hidden states, mean-pooled."""

    def __init__(self, arch, bugs=frozenset()):
        super().__init__()
        self.arch = arch
        self.model = Model(arch, bugs)
        self.pooler = MeanPooler(bugs)

    def forward(self, ids, positions, prompt_lens, meta):
        return self.pooler(self.model(ids, positions, meta=meta), prompt_lens)
