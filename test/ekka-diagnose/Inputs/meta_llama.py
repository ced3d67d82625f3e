"""A tiny Llama written with its own module names, in the style of Meta's
reference implementation (tok_embeddings, layers.N.attention.wq,
layers.N.feed_forward.w1/w2/w3, ffn_norm, output), loaded from the
HuggingFace model that Inputs/llama.py builds (same seed and config). With
--hf it runs the HuggingFace model itself: the reference. --plant changes
one component of the custom model."""
import argparse

import torch
import transformers

parser = argparse.ArgumentParser()
parser.add_argument("--hf", action="store_true", help="run the HuggingFace reference")
parser.add_argument("--plant", choices=["none", "w3-zero", "ffn-norm-eps"], default="none")
parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
args = parser.parse_args()
dtype = getattr(torch, args.dtype)


class RMSNorm(torch.nn.Module):
    def __init__(self, weight, eps):
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(weight), eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def linear(weight):
    out = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    out.weight = torch.nn.Parameter(weight)
    return out


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(torch.nn.Module):
    def __init__(self, hf, config):
        super().__init__()
        self.wq, self.wk = linear(hf.q_proj.weight), linear(hf.k_proj.weight)
        self.wv, self.wo = linear(hf.v_proj.weight), linear(hf.o_proj.weight)
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.hidden_size // self.heads

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.head_dim ** -0.5)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(torch.nn.Module):
    def __init__(self, hf):
        super().__init__()
        self.w1, self.w2 = linear(hf.gate_proj.weight), linear(hf.down_proj.weight)
        self.w3 = linear(hf.up_proj.weight)

    def forward(self, x):
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(torch.nn.Module):
    def __init__(self, hf, config):
        super().__init__()
        eps = config.rms_norm_eps
        self.attention_norm = RMSNorm(hf.input_layernorm.weight, eps)
        self.attention = Attention(hf.self_attn, config)
        self.ffn_norm = RMSNorm(hf.post_attention_layernorm.weight, eps)
        self.feed_forward = FeedForward(hf.mlp)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(torch.nn.Module):
    def __init__(self, hf):
        super().__init__()
        config = hf.config
        self.tok_embeddings = torch.nn.Embedding.from_pretrained(
            hf.model.embed_tokens.weight, freeze=True)
        self.layers = torch.nn.ModuleList(TransformerBlock(l, config) for l in hf.model.layers)
        self.norm = RMSNorm(hf.model.norm.weight, config.rms_norm_eps)
        self.output = linear(hf.lm_head.weight)
        dim = config.hidden_size // config.num_attention_heads
        self.inv_freq = 1.0 / (config.rope_parameters["rope_theta"]
                               ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))

    def forward(self, ids):
        positions = torch.arange(ids.shape[1]).float()
        freqs = torch.outer(positions, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        x = self.tok_embeddings(ids)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))


torch.manual_seed(0)
config = transformers.LlamaConfig(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
hf = transformers.LlamaForCausalLM(config).eval().to(dtype)
ids = torch.tensor([[1, 17, 42, 9, 33, 5, 77, 21, 64, 3, 11, 8]])
with torch.no_grad():
    if args.hf:
        logits = hf(ids).logits
    else:
        model = Transformer(hf)
        if args.plant == "w3-zero":         # one projection's weight zeroed
            model.layers[1].feed_forward.w3.weight.zero_()
        elif args.plant == "ffn-norm-eps":  # one norm's epsilon changed
            model.layers[0].ffn_norm.eps = 0.5
        logits = model(ids)
print("top-1", logits[0, -1].argmax().item())
