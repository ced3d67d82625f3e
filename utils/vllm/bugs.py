"""Silent bugs planted in the real vLLM, each after a real vLLM issue
(docs/Zoo.md, "The real vLLM", names it): through vLLM's own knobs
(`hf_overrides`, engine arguments) or a patch of one of its functions,
applied before the engine is built. Each is a mechanism, not the issue's
code. `plant(name, engine)` edits the engine arguments or patches vLLM.

The accepted root cause of each is in the test that runs it
(test/vllm/bug-*.test); nothing here is seen by Ekka.
"""


def _override(engine, **values):
    engine.setdefault("hf_overrides", {}).update(values)


def _rope_theta(engine):
    # The rotary base is read from the wrong key: vLLM serves theta 1e6
    # where the checkpoint says 10000.
    _override(engine, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})


def _rope_style(engine):
    # GPT-J style (interleaved pairs) where the model rotates halves (neox).
    from vllm.model_executor.layers.rotary_embedding import base
    init = base.RotaryEmbeddingBase.__init__

    def patched(self, *args, **kwargs):
        if "is_neox_style" in kwargs:
            kwargs["is_neox_style"] = False
        else:
            args = args[:4] + (False,) + args[5:]
        init(self, *args, **kwargs)

    base.RotaryEmbeddingBase.__init__ = patched


def _rms_eps(engine):
    # The norm's epsilon read from another key: 1e-2 for the model's 1e-6.
    _override(engine, rms_norm_eps=1e-2)


def _remap_shards(cls, remap):
    """Patches both of `cls`'s weight loaders (v2 for vLLM's parameter
    classes) to load each shard where `remap` says."""
    for name in ("weight_loader", "weight_loader_v2"):
        load = getattr(cls, name, None)
        if load is None:
            continue

        def patched(self, param, loaded_weight, loaded_shard_id=None, _load=load):
            return _load(self, param, loaded_weight, remap.get(loaded_shard_id, loaded_shard_id))

        setattr(cls, name, patched)


def _gate_up_swapped(engine):
    # The stacked-parameter mapping loads gate_proj into up's half and up
    # into gate's.
    from vllm.model_executor.layers import linear
    _remap_shards(linear.MergedColumnParallelLinear, {0: 1, 1: 0})


def _kv_swapped(engine):
    # The fused QKV loader puts k_proj's rows where v's go and v's where k's.
    from vllm.model_executor.layers import linear
    _remap_shards(linear.QKVParallelLinear, {"k": "v", "v": "k"})


def _sliding_window_ignored(engine):
    # The window is taken from a key the config does not have: every
    # sliding layer attends to the whole sequence.
    _override(engine, sliding_window=4096)


def _softcap_missing(engine):
    # The final logit soft cap is not applied.
    _override(engine, final_logit_softcapping=None)


def _moe_topk_not_renormalized(engine):
    # The chosen experts' weights are not renormalized to sum to one.
    _override(engine, norm_topk_prob=False)


def _greedy_not_argmax(engine):
    # Greedy decoding (temperature 0) takes the runner-up token.
    from vllm.v1.sample import sampler

    def second(logits):
        return logits.topk(2, dim=-1).indices[:, 1].contiguous().view(-1)

    sampler.Sampler.greedy_sample = staticmethod(second)


def _kv_slot_shifted(engine):
    # Decode steps write the new token's keys and values one slot past
    # where its attention reads them.
    from vllm.v1.attention.backends import cpu_attn
    update = cpu_attn.CPUAttentionBackendImpl.do_kv_cache_update

    def patched(self, layer, key, value, kv_cache, slot_mapping):
        if key.shape[0] == 1:  # a decode step of one sequence
            slot_mapping = slot_mapping + 1
        return update(self, layer, key, value, kv_cache, slot_mapping)

    cpu_attn.CPUAttentionBackendImpl.do_kv_cache_update = patched


def _embed_scale_missing(engine):
    # Gemma's sqrt(hidden) embedding normalizer is left at 1.
    from vllm.model_executor.models import gemma3
    init = gemma3.Gemma3Model.__init__

    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.normalizer.fill_(1.0)

    gemma3.Gemma3Model.__init__ = patched


def _k_norm_from_q(engine):
    # The loader gives each layer's k_norm the q_norm's weight.
    from vllm.model_executor.models import qwen3
    load = qwen3.Qwen3ForCausalLM.load_weights

    def patched(self, weights):
        weights = list(weights)
        q = {n.replace("q_norm", "k_norm"): w for n, w in weights if n.endswith("q_norm.weight")}
        return load(self, [(n, q.get(n, w)) for n, w in weights])

    qwen3.Qwen3ForCausalLM.load_weights = patched


def _act_gelu(engine):
    # The gated MLP's activation computed as GELU for the model's SiLU.
    import torch
    from vllm.model_executor.layers import activation

    def gelu_and_mul(self, x):
        d = x.shape[-1] // 2
        return torch.nn.functional.gelu(x[..., :d]) * x[..., d:]

    for name in ("forward_native", "forward_cpu"):
        setattr(activation.SiluAndMul, name, gelu_and_mul)


BUGS = {
    "rope-theta": _rope_theta,
    "rope-style": _rope_style,
    "rms-eps": _rms_eps,
    "gate-up-swapped": _gate_up_swapped,
    "kv-swapped": _kv_swapped,
    "sliding-window-ignored": _sliding_window_ignored,
    "softcap-missing": _softcap_missing,
    "moe-topk-not-renormalized": _moe_topk_not_renormalized,
    "greedy-not-argmax": _greedy_not_argmax,
    "kv-slot-shifted": _kv_slot_shifted,
    "embed-scale-missing": _embed_scale_missing,
    "k-norm-from-q": _k_norm_from_q,
    "act-gelu": _act_gelu,
}


def plant(name, engine):
    BUGS[name](engine)
