#!/usr/bin/env python3
"""Serves a model with the real vLLM, offline, as a user's script would:
`serve.py MODEL_DIR [--config NAME] [--bug NAME] [--max-tokens N]`.

The test suite's target program (test/vllm): run under `ekka-trace
--framework vllm`, in the vLLM environment that utils/vllm/install makes.
A configuration is a way of serving (chunked prefill, prefix caching, a
batch, seeded sampling); a bug is a silent error planted through vLLM's own
knobs (`hf_overrides`, engine arguments) or a patch of one of its functions
(utils/vllm/bugs.py), each after a real vLLM issue (docs/Zoo.md, "The real
vLLM"). Prints each request's prompt and generated token ids.
"""
import argparse
import os
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bugs  # noqa: E402

CONFIGS = ("plain", "chunked", "prefix", "batch", "sampled")


def prompt(n, seed):
    """n token ids of a fixed pseudo-random sequence (ids 1..1000)."""
    x, out = seed * 7919 + 17, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(1 + x % 1000)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--config", choices=CONFIGS, default="plain")
    p.add_argument("--bug", default="", help="one of: " + ", ".join(bugs.BUGS))
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=24)
    a = p.parse_args()
    if a.bug and a.bug not in bugs.BUGS:
        sys.exit(f"serve.py: unknown bug '{a.bug}' (one of: {', '.join(bugs.BUGS)})")

    from vllm import LLM, SamplingParams
    engine = dict(model=a.model, skip_tokenizer_init=True, enforce_eager=True,
                  dtype="bfloat16", max_model_len=128, seed=0)
    if a.config == "chunked":
        # A prompt longer than the step's token budget is prefilled in chunks.
        engine.update(enable_chunked_prefill=True, max_num_batched_tokens=16,
                      max_num_seqs=4)
    if a.config == "prefix":
        # Blocks of 32 tokens (the least vLLM's CPU attention takes): the
        # shared 32 are one full block, cached.
        engine.update(enable_prefix_caching=True, block_size=32)
    if a.bug:
        bugs.plant(a.bug, engine)
    llm = LLM(**engine)

    sampling = SamplingParams(max_tokens=a.max_tokens, temperature=0, ignore_eos=True)
    if a.config == "sampled":
        sampling = SamplingParams(max_tokens=a.max_tokens, temperature=0.8, top_p=0.95,
                                  seed=1234, ignore_eos=True)
    prompts = [prompt(a.prompt_len, 0)]
    if a.config == "batch":
        prompts = [prompt(a.prompt_len, 0), prompt(a.prompt_len - 9, 1),
                   prompt(a.prompt_len + 5, 2)]
    if a.config == "chunked":
        prompts = [prompt(a.prompt_len + 16, 0)]
    runs = [prompts]
    if a.config == "prefix":
        # A second request that shares the first one's first 32 tokens (one
        # KV block): served after it, so its prefix comes from the cache.
        prompts = [prompt(a.prompt_len + 16, 0)]
        runs = [prompts, [prompts[0][:32] + prompt(8, 3)]]
    for batch in runs:
        outs = llm.generate([{"prompt_token_ids": ids} for ids in batch], sampling,
                            use_tqdm=False)
        for o in outs:
            print("prompt", *o.prompt_token_ids)
            print("generated", *o.outputs[0].token_ids)


if __name__ == "__main__":
    main()
