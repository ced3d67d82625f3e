"""Counts the module calls of a tiny Llama's second forward that the
shim's Python hooks (_before and _after) handled: with the binding's hooks
in C, the root's entry only (its call is no call inside an open one); with
EKKA_FAST_HOOKS=0, every call. Run under ekka-trace."""
import torch
import transformers
from torch.nn.modules.module import register_module_forward_pre_hook

import ekka.trace as shim

torch.manual_seed(0)
config = transformers.LlamaConfig(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = transformers.LlamaForCausalLM(config).eval()
ids = torch.arange(1, 9).unsqueeze(0)
with torch.no_grad():
    model(ids)  # the first: classes not seen yet go through Python

counts = {"before": 0, "after": 0, "calls": 0}


def counting(name):
    original = getattr(shim, name)

    def counted(*args, **kwargs):
        counts[name[1:]] += 1
        return original(*args, **kwargs)
    setattr(shim, name, counted)


counting("_before")
counting("_after")


def count_call(module, args):
    counts["calls"] += 1


register_module_forward_pre_hook(count_call)
with torch.no_grad():
    model(ids)
print(f"python before={counts['before']} after={counts['after']} calls={counts['calls']}")
