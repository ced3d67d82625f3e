"""The zoo's serving engine: a compact implementation in the manner of vLLM,
the *target* of the silent-error zoo (../shared/ZOO.md, docs/Zoo.md).

Structure as vLLM's model code: fused QKV projection (`qkv_proj`), merged
gate/up projection (`gate_up_proj`), fused residual-add + RMSNorm returning
the (output, residual) pair, rotary embedding applied in place, a paged KV
cache written and read by the engine's own kernels (C++ custom ops,
`zoo::*`), per-layer sliding windows, a logits processor after `lm_head`,
and a weight loader that maps a HuggingFace checkpoint's names onto the
fused parameters (stacked-parameter mapping). It serves like vLLM: the
prompt as one prefill, then decode steps against the paged cache.

Bugs are switched on by name (`Engine(..., bugs={...})`); nothing else in
the engine, and nothing in Ekka, knows which one is on.
"""
from .engine import Engine, load_kernels  # noqa: F401
