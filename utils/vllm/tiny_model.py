#!/usr/bin/env python3
"""Saves a tiny HuggingFace model with random weights, for the real-vLLM
suite (test/vllm): `tiny_model.py ARCH DIR [--seed N]`.

Each architecture is one that vLLM serves on CPU, made as small as its CPU
attention allows (head_dim 64: it refuses 16), in bfloat16 on disk as a real
checkpoint would be. The weights are random but seeded, and scaled so that
activations stay in a range where bf16 noise is what it is for a trained
model: a random Llama of std 0.02 gives logits of a few units.
"""
import argparse
import os
import sys

import torch

COMMON = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, num_hidden_layers=3,
              vocab_size=1024, max_position_embeddings=256, rms_norm_eps=1e-6,
              tie_word_embeddings=False, initializer_range=0.05)


def config(arch):
    import transformers as tf
    if arch == "llama":
        return tf.LlamaConfig(**COMMON)
    if arch == "qwen3":
        return tf.Qwen3Config(**COMMON)
    if arch == "gemma3":
        # Sliding window on every layer but the last (pattern 3), a final
        # logit soft cap (small enough to bend this model's logits) and
        # Gemma's scaled embedding: what vLLM must reproduce.
        return tf.Gemma3TextConfig(**dict(COMMON, sliding_window=8,
                                          layer_types=["sliding_attention", "sliding_attention",
                                                       "full_attention"],
                                          final_logit_softcapping=3.0,
                                          query_pre_attn_scalar=64,
                                          hidden_activation="gelu_pytorch_tanh"))
    if arch == "qwen3_moe":
        return tf.Qwen3MoeConfig(**dict(COMMON, num_experts=4, num_experts_per_tok=2,
                                        moe_intermediate_size=128, decoder_sparse_step=1,
                                        norm_topk_prob=True, mlp_only_layers=[]))
    if arch == "qwen2_moe":
        # A shared expert beside the routed ones, with its own sigmoid gate:
        # vLLM's layers one level deeper (mlp.shared_expert.act_fn).
        return tf.Qwen2MoeConfig(**dict(COMMON, num_experts=4, num_experts_per_tok=2,
                                        moe_intermediate_size=128,
                                        shared_expert_intermediate_size=256,
                                        decoder_sparse_step=1, norm_topk_prob=False,
                                        mlp_only_layers=[]))
    if arch == "phi3":
        c = dict(COMMON)
        c.pop("head_dim")
        return tf.Phi3Config(**dict(c, pad_token_id=0))
    raise SystemExit(f"tiny_model.py: unknown architecture '{arch}' "
                     "(llama, qwen3, gemma3, qwen3_moe, qwen2_moe, phi3)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("arch")
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    import transformers as tf
    torch.manual_seed(a.seed)
    cfg = config(a.arch)
    cfg.dtype = torch.bfloat16
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # Norm weights start at one (zero for Gemma's 1 + w): random ones, so
    # that a loader that swaps two norms' weights is seen.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    model.to(torch.bfloat16).save_pretrained(a.dir)


if __name__ == "__main__":
    sys.exit(main())
