"""The reference run that ekka-diagnose makes itself (`--reference-model
DIR`): HuggingFace Transformers' model from DIR, teacher-forced on exactly
the token ids each of the target's requests consumed, one forward per
request, in the dtype asked for. ekka-diagnose runs it under ekka-trace:

    python -m ekka.reference --model DIR --requests FILE --dtype bf16|fp32

FILE is JSON: {"requests": [{"tokens": [...], "start": 0,
"logits_positions": [...]}, ...]}. A request's first `start` tokens were
not computed by the target in any step traced (a prefix it took from its
cache): they are run first with tracing paused, and the traced forward
continues from their KV cache, so that the reference computes exactly the
positions the target did. Its logits likewise: only at `logits_positions`
(a serving engine computes each scheduled sequence's last row), through
HF's `logits_to_keep`.
"""
import argparse
import json
import sys

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class AppliedRotary(torch.nn.Module):
    """HF applies the rotary embedding with a plain function
    (`apply_rotary_pos_emb(q, k, cos, sin)`) inside its attention's
    forward, where a serving engine calls a module (vLLM's
    `self_attn.rotary_emb(positions, q, k)`). The same function, called
    through this module, so that the rotated q and k are a module call's
    output to pair with the engine's: nothing of the maths changes."""

    def __init__(self, apply):
        super().__init__()
        self.apply_rotary = apply

    def forward(self, q, k, cos, sin, *args, **kwargs):
        q, k = self.apply_rotary(q, k, cos, sin, *args, **kwargs)
        # Handed on in token-major memory ([batch, heads, tokens, dim] as a
        # view of [batch, tokens, heads, dim]), an engine's layout; the
        # values are the same (some models' rotary returns heads-major).
        return (q.transpose(1, 2).contiguous().transpose(1, 2),
                k.transpose(1, 2).contiguous().transpose(1, 2))


def _expose_rotary(model):
    """Gives each attention module of `model` whose forward calls its
    modeling file's `apply_rotary_pos_emb` a `rotary_emb` child through
    which that call goes (unless it has a `rotary_emb` already)."""
    import inspect
    import threading
    modeling = sys.modules.get(type(model).__module__)
    apply = getattr(modeling, "apply_rotary_pos_emb", None)
    if apply is None or getattr(apply, "_ekka_routed", False):
        return
    def calls_it(module):
        code = getattr(inspect.unwrap(type(module).forward), "__code__", None)
        return code is not None and "apply_rotary_pos_emb" in code.co_names

    attentions = [m for m in model.modules() if calls_it(m) and not hasattr(m, "rotary_emb")]
    if not attentions:
        return
    local = threading.local()

    def enter(module, args, kwargs=None):
        local.stack = getattr(local, "stack", []) + [module]

    def leave(module, args, output):
        local.stack = local.stack[:-1]

    for m in attentions:
        m.rotary_emb = AppliedRotary(apply)
        m.register_forward_pre_hook(enter)
        m.register_forward_hook(leave)

    def routed(q, k, cos, sin, *args, **kwargs):
        stack = getattr(local, "stack", None)
        if stack:
            return stack[-1].rotary_emb(q, k, cos, sin, *args, **kwargs)
        return apply(q, k, cos, sin, *args, **kwargs)

    routed._ekka_routed = True
    modeling.apply_rotary_pos_emb = routed


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ekka.reference", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a HuggingFace model directory")
    p.add_argument("--requests", required=True, help="JSON file of the requests' token ids")
    p.add_argument("--dtype", choices=sorted(DTYPES), required=True)
    a = p.parse_args(argv)
    try:
        with open(a.requests) as f:
            requests = json.load(f)["requests"]
    except (OSError, ValueError, KeyError) as e:
        print(f"ekka.reference: cannot read requests from '{a.requests}': {e}", file=sys.stderr)
        return 2
    import transformers
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=DTYPES[a.dtype])
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"ekka.reference: cannot load a HuggingFace model from '{a.model}': {first}",
              file=sys.stderr)
        return 2
    model.eval()
    _expose_rotary(model)
    from ekka import trace as ekka_trace
    with torch.inference_mode():
        for r in requests:
            ids = torch.tensor([r["tokens"]], dtype=torch.long)
            start = int(r.get("start", 0))
            keep = [int(p) - start for p in r.get("logits_positions", [])]
            extra = {}
            if keep and keep != list(range(ids.shape[1] - start)):
                extra["logits_to_keep"] = torch.tensor(keep, dtype=torch.long)
            if start:
                out = ekka_trace._unrecorded(model)(ids[:, :start], use_cache=True)
                cache = out.past_key_values
                pos = torch.arange(start, ids.shape[1]).unsqueeze(0)
                model(ids[:, start:], past_key_values=cache, position_ids=pos,
                      cache_position=pos[0], use_cache=True, **extra)
            else:
                model(ids, use_cache=False, **extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
