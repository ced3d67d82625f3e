"""A tiny HuggingFace Llama run two ways over one 12-token sequence: `oneshot`
(a single forward, as a reference runs) or `serve` (a prefill of 8 tokens,
then 4 decode steps against the KV cache, as a serving engine runs).
--bug makes layer 1's attention wrong in decode steps only; --skip makes layer
1's MLP, in decode steps, use a down projection of zeros without calling its
down_proj module (a decode path built with weights never loaded)."""
import argparse

import torch
import transformers

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["oneshot", "serve"])
parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
parser.add_argument("--bug", action="store_true")
parser.add_argument("--skip", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
config = transformers.LlamaConfig(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = transformers.LlamaForCausalLM(config).eval().to(getattr(torch, args.dtype))
if args.bug:
    attn = model.model.layers[1].self_attn
    original = attn.forward

    def decode_bug(*a, **k):
        out = original(*a, **k)
        hidden = k.get("hidden_states", a[0] if a else None)
        if hidden.shape[1] == 1:
            out = (out[0] * 1.5,) + tuple(out[1:])
        return out

    attn.forward = decode_bug
if args.skip:
    mlp = model.model.layers[1].mlp
    prefill = mlp.forward

    def decode_skip(x):
        if x.shape[1] > 1:
            return prefill(x)
        inner = mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)
        return torch.nn.functional.linear(inner, torch.zeros_like(mlp.down_proj.weight))

    mlp.forward = decode_skip
ids = torch.tensor([[1, 17, 42, 9, 33, 5, 77, 21, 64, 3, 11, 8]])
with torch.no_grad():
    if args.mode == "oneshot":
        model(ids)
    else:
        out = model(ids[:, :8], use_cache=True)
        past = out.past_key_values
        for t in range(8, 12):
            out = model(ids[:, t:t + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
print(args.mode, "done")
