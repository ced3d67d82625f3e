"""A tiny HuggingFace Llama (seeded random weights), optionally with one
planted change, running one prompt. The reference and the target of the
ekka-diagnose tests are this script with and without a plant."""
import argparse

import torch
import transformers

parser = argparse.ArgumentParser()
parser.add_argument("--plant", choices=["none", "act", "zero-weight", "eps", "drop-first-token"],
                    default="none")
parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
args = parser.parse_args()

torch.manual_seed(0)
config = transformers.LlamaConfig(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = transformers.LlamaForCausalLM(config).eval().to(getattr(torch, args.dtype))
layers = model.model.layers
if args.plant == "act":             # the MLP activation of layer 1 swapped
    layers[1].mlp.act_fn = torch.nn.GELU()
elif args.plant == "zero-weight":   # one projection's weight zeroed
    with torch.no_grad():
        layers[0].self_attn.k_proj.weight.zero_()
elif args.plant == "eps":           # one norm's epsilon changed
    layers[2].post_attention_layernorm.variance_epsilon = 0.5
ids = torch.tensor([[1, 17, 42, 9, 33, 5, 77, 21, 64, 3, 11, 8]])
if args.plant == "drop-first-token":
    ids = ids[:, 1:]
with torch.no_grad():
    logits = model(ids).logits
print("top-1", logits[0, -1].argmax().item())
