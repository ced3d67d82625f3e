"""One side of a zoo case, the program ekka-trace runs:

  run_side.py target CASE DIR             build the reference model (seeded), save
                                          its weights to DIR/checkpoint.safetensors,
                                          load them into the engine and serve the
                                          prompt (bf16, prefill + decode); save the
                                          consumed tokens to DIR/tokens.json
  run_side.py reference CASE DIR DTYPE    run the HF model (bf16 or fp32) with those
                                          weights on those tokens in one forward

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


def reference_model(case, dtype):
    torch.manual_seed(SEED)
    model = case.hf_model_class()(case.config()).eval()
    model.load_state_dict(load_file(os.path.join(DIR, "checkpoint.safetensors")), strict=False)
    model = model.to(dtype)
    # What the model keeps in float32 in any dtype (Ernie-4.5's router), as
    # from_pretrained does.
    keep = list(getattr(model, "_keep_in_fp32_modules_strict", None) or []) + \
        list(getattr(model, "_keep_in_fp32_modules", None) or [])
    for name, param in model.named_parameters():
        if any(k in name for k in keep):
            param.data = param.data.float()
    return model


def main():
    global DIR
    what, case_id, DIR = sys.argv[1:4]
    case = BY_ID[case_id]
    if what == "target":
        torch.manual_seed(SEED)
        model = case.hf_model_class()(case.config())
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if getattr(model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file(state, os.path.join(DIR, "checkpoint.safetensors"))
        del model
        from zoo_engine import Engine
        checkpoint = {k: v.to(torch.bfloat16)
                      for k, v in load_file(os.path.join(DIR, "checkpoint.safetensors")).items()}
        engine = Engine(case.config(), checkpoint, dtype=torch.bfloat16, bugs=case.bugs,
                        task=case.task)
        if case.task == "embed":
            engine.embed(case.prompt)
            consumed, generated = case.prompt, []
        else:
            consumed, generated = engine.generate(case.prompt, case.decode)
        with open(os.path.join(DIR, "tokens.json"), "w") as f:
            json.dump({"consumed": consumed, "generated": generated}, f)
    elif what == "reference":
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[sys.argv[4]]
        with open(os.path.join(DIR, "tokens.json")) as f:
            tokens = json.load(f)["consumed"]
        model = reference_model(case, dtype)
        # A batch of prompts (an embedding case) is already a list of lists.
        batch = tokens if tokens and isinstance(tokens[0], list) else [tokens]
        with torch.no_grad():
            model(torch.tensor(batch))
    else:
        raise SystemExit(f"run_side.py: unknown step '{what}'")


if __name__ == "__main__":
    main()
