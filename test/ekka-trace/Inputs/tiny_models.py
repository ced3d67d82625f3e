"""Tiny HuggingFace models with seeded random weights: `gemma3` (sliding
and full attention layers) or `qwen2_moe` (routed and shared experts). Runs
one forward, or two with --steps 2 (a second forward over the same prompt)."""
import argparse

import torch
import transformers

parser = argparse.ArgumentParser()
parser.add_argument("kind", choices=["gemma3", "qwen2_moe"])
parser.add_argument("--steps", type=int, default=1)
args = parser.parse_args()

torch.manual_seed(0)
common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
if args.kind == "gemma3":
    config = transformers.Gemma3TextConfig(
        head_dim=16, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], **common)
    model = transformers.Gemma3ForCausalLM(config)
else:
    config = transformers.Qwen2MoeConfig(
        moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=4,
        num_experts_per_tok=2, **common)
    model = transformers.Qwen2MoeForCausalLM(config)
model.eval()
with torch.no_grad():
    for _ in range(args.steps):
        logits = model(torch.arange(1, 13).unsqueeze(0)).logits
print(args.kind, tuple(logits.shape))
