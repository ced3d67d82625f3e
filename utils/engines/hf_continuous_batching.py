#!/usr/bin/env python3
"""HuggingFace Transformers' own serving engine, as a target: continuous
batching over a paged KV cache (`model.generate_batch`, attention
`paged|eager`), two prompts of 24 and 15 tokens decoded side by side, 4
greedy tokens each. `hf_continuous_batching.py MODEL_DIR [--bug NAME]`.

A real paged-KV engine that installs with transformers alone: its steps
flatten the scheduled tokens of both requests into one forward with
position ids, as vLLM's do. The one bug it can plant, `kv-write-late`,
writes each decode step's keys and values one slot past where the step's
attention reads them (as vLLM's slot-mapping bugs did, vLLM issue 7845),
through a patch of transformers' paged cache.
"""
import argparse
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vllm"))
from serve import prompt  # noqa: E402


def kv_write_late():
    from transformers.generation.continuous_batching import cache
    update = cache.PagedAttentionCache.update

    def patched(self, key_states, value_states, layer_idx, kwargs):
        if key_states.shape[-2] <= 2 and "write_index" in kwargs:  # a decode step
            kwargs = dict(kwargs)
            kwargs["write_index"] = [w + 1 for w in kwargs["write_index"]]
        return update(self, key_states, value_states, layer_idx, kwargs)

    cache.PagedAttentionCache.update = patched


BUGS = {"kv-write-late": kv_write_late}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--bug", default="", help="one of: " + ", ".join(BUGS))
    a = p.parse_args()
    if a.bug:
        if a.bug not in BUGS:
            sys.exit(f"hf_continuous_batching.py: unknown bug '{a.bug}'")
        BUGS[a.bug]()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        a.model, dtype=torch.bfloat16, attn_implementation="paged|eager").eval()
    config = transformers.GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=-1,
                                           pad_token_id=0)
    with torch.inference_mode():
        out = model.generate_batch([prompt(24, 0), prompt(15, 1)], generation_config=config,
                                   warmup=False)
    for request, result in sorted(out.items()):
        print(request, *result.generated_tokens)


if __name__ == "__main__":
    main()
