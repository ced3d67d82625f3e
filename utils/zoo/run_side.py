"""One side of a zoo case, the program ekka-trace runs:

  run_side.py target CASE DIR             build the reference model (seeded), save
                                          its weights to DIR/checkpoint.safetensors,
                                          load them into the engine and serve the
                                          prompt (bf16, prefill + decode); save the
                                          consumed tokens to DIR/tokens.json
  run_side.py reference CASE DIR DTYPE    run the HF model (bf16 or fp32) with those
                                          weights on those tokens in one forward

  run_side.py all CASE DIR                all three in this one process, each traced
                                          (ekka.trace.Trace) into DIR/target,
                                          DIR/reference-bf16, DIR/reference-fp32

Each takes `--device DEVICE` last (default cpu; cuda runs the engine's
CUDA kernels). A checkpoint already in DIR is used as it is.

Building the checkpoint in the target's process saves a Python start (the
model is only constructed there: nothing of it is traced, no forward runs).
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cases import BY_ID, SEED  # noqa: E402


def reference_model(case, dtype, device):
    torch.manual_seed(SEED)
    model = case.hf_model_class()(case.config()).eval()
    model.load_state_dict(load_file(os.path.join(DIR, "checkpoint.safetensors")), strict=False)
    model = model.to(device=device, dtype=dtype)
    # What the model keeps in float32 in any dtype (Ernie-4.5's router), as
    # from_pretrained does.
    keep = list(getattr(model, "_keep_in_fp32_modules_strict", None) or []) + \
        list(getattr(model, "_keep_in_fp32_modules", None) or [])
    for name, param in model.named_parameters():
        if any(k in name for k in keep):
            param.data = param.data.float()
    return model


# The decoder's linear layers, which a quantized engine quantizes.
QUANTIZED = (".self_attn.q_proj.", ".self_attn.k_proj.", ".self_attn.v_proj.",
             ".self_attn.o_proj.", ".mlp.gate_proj.", ".mlp.up_proj.", ".mlp.down_proj.")
FORMAT_MAX = {"fp8": 448.0, "fp4": 6.0}
FP4_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def on_grid(weight, fmt):
    """`weight` rounded to the quantization grid of `fmt`, per row with a
    power-of-two scale: values a correct quantized engine holds exactly."""
    w = weight.float()
    amax = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    scale = torch.exp2(torch.ceil(torch.log2(amax / FORMAT_MAX[fmt])))
    q = w / scale
    if fmt == "fp8":
        q = q.to(torch.float8_e4m3fn).float()
    else:
        q = FP4_GRID[(q.abs().unsqueeze(-1) - FP4_GRID).abs().argmin(-1)] * q.sign()
    return (q * scale).to(weight.dtype)


def save_checkpoint(case, path):
    torch.manual_seed(SEED)
    model = case.hf_model_class()(case.config())
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    for name, factor in case.scale_weights.items():
        state[name] = state[name] * factor
    if case.random_norms:
        # HF initializes every norm's weight alike (ones): moved off them,
        # a norm applied with another norm's weight shows.
        g = torch.Generator().manual_seed(SEED + 2)
        state = {k: (v + 0.3 * torch.randn(v.shape, generator=g)).to(v.dtype)
                 if k.endswith("norm.weight") else v for k, v in state.items()}
    if case.quant:
        state = {k: on_grid(v, case.quant) if k.endswith(".weight") and any(q in k for q in QUANTIZED)
                 else v for k, v in state.items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, path)


def serve(case, device, rank=0, world=1):
    """The engine serving the case's prompt on one rank of `world`."""
    if world > 1:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
        torch.distributed.init_process_group(
            "gloo", init_method="file://" + os.path.join(DIR, "gloo-store"), rank=rank,
            world_size=world)
    from zoo_engine import Engine
    checkpoint = {k: v.to(torch.bfloat16)
                  for k, v in load_file(os.path.join(DIR, "checkpoint.safetensors")).items()}
    tp_rank, pp_rank = (rank, 0) if case.tp > 1 else (0, rank)
    engine = Engine(case.config(), checkpoint, dtype=torch.bfloat16, bugs=case.bugs,
                    task=case.task, device=device, quant=case.quant, tp_rank=tp_rank,
                    tp_size=case.tp, pp_rank=pp_rank, pp_size=case.pp, options=case.options)
    if case.task in ("embed", "classify", "batch"):
        getattr(engine, case.task)(case.prompt)
        consumed, generated = case.prompt, []
    else:
        consumed, generated = engine.generate(case.prompt, case.decode)
    if rank == 0:
        with open(os.path.join(DIR, "tokens.json"), "w") as f:
            json.dump({"consumed": consumed, "generated": generated}, f)
    if world > 1:
        torch.distributed.destroy_process_group()


def main():
    global DIR
    args = sys.argv[1:]
    device = "cpu"
    if len(args) >= 2 and args[-2] == "--device":
        device = args[-1]
        args = args[:-2]
    what, case_id, DIR = args[:3]
    case = BY_ID[case_id]
    if what == "all":
        # One Python start instead of three: the sides are traced one after
        # the other, each into its own trace, as three ekka-trace runs would.
        from ekka.trace import Trace
        with Trace(os.path.join(DIR, "target"), capture_ops="^zoo::", capture_op_inputs=True,
                   force=True):
            run_target(case, device)
        # The bf16 reference with its ops' statistics: the engine's
        # components HF has no module for (rotary_emb) are checked against
        # HF's ops by them.
        for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            with Trace(os.path.join(DIR, f"reference-{name}"), force=True,
                       op_stats=name == "bf16"):
                run_reference(case, dtype, device)
        return
    if what == "target":
        run_target(case, device)
    elif what == "reference":
        run_reference(case, {"bf16": torch.bfloat16, "fp32": torch.float32}[args[3]], device)
    else:
        raise SystemExit(f"run_side.py: unknown step '{what}'")


def run_target(case, device):
    checkpoint_path = os.path.join(DIR, "checkpoint.safetensors")
    if not os.path.exists(checkpoint_path):
        save_checkpoint(case, checkpoint_path)
    world = case.tp * case.pp
    if world == 1:
        serve(case, device)
    else:
        # One process per rank, as vLLM's workers: forked here, each
        # traced into rank-N/ of the target trace.
        import multiprocessing
        fork = multiprocessing.get_context("fork")
        ranks = [fork.Process(target=serve, args=(case, device, rank, world))
                 for rank in range(world)]
        for p in ranks:
            p.start()
        for p in ranks:
            p.join()
        failed = [r for r, p in enumerate(ranks) if p.exitcode != 0]
        if failed:
            raise SystemExit(f"run_side.py: rank {failed[0]} of the engine failed")


def run_reference(case, dtype, device):
    with open(os.path.join(DIR, "tokens.json")) as f:
        tokens = json.load(f)["consumed"]
    model = reference_model(case, dtype, device)
    # A batch of prompts (an embedding case) is already a list of lists.
    batch = tokens if tokens and isinstance(tokens[0], list) else [tokens]
    width = max(len(p) for p in batch)
    with torch.no_grad():
        if all(len(p) == width for p in batch):
            model(torch.tensor(batch, device=device))
        else:
            # Prompts of different lengths: padded on the right, with the
            # attention mask, as HF batches them.
            ids = torch.tensor([p + [0] * (width - len(p)) for p in batch], device=device)
            mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in batch],
                                device=device)
            model(ids, attention_mask=mask)


if __name__ == "__main__":
    main()
