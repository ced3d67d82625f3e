"""Writes seed shards for ekka-fuzz-safetensors: tensors of the dtypes a
trace holds, written by the safetensors package (as a trace's shards are
read by it), one file per case. Usage: seed_safetensors.py DIR"""
import os
import sys

import torch
from safetensors.torch import save_file

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
cases = {
    "f32": {"t1": torch.arange(6, dtype=torch.float32).reshape(2, 3)},
    "bf16": {"t2": torch.ones(4, dtype=torch.bfloat16), "t3": torch.zeros(0, 3)},
    "mixed": {"a": torch.tensor([1, 2], dtype=torch.int64), "b": torch.tensor(True),
              "c": torch.full((2, 2), float("nan"), dtype=torch.float16)},
    "fp8": {"q": torch.ones(3, dtype=torch.float8_e4m3fn)},
}
for name, tensors in cases.items():
    save_file(tensors, os.path.join(out, name + ".safetensors"), metadata={"ekka": "seed"})
