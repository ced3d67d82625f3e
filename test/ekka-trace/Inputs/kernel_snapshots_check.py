import sqlite3, sys
import torch
from safetensors.torch import load_file
work = sys.argv[1]
seen = load_file(f"{work}/seen.safetensors")
db = sqlite3.connect(f"{work}/trace/trace.db")
for kernel in ("scale", "accumulate"):
    shard, key = db.execute(
        "SELECT t.shard, t.key FROM tensors t JOIN kernels k ON k.id = t.owner_id "
        "WHERE t.owner = 'kernel' AND t.role = 'mutated' AND k.name = ?", (kernel,)).fetchone()
    got = load_file(f"{work}/trace/{shard}")[key]
    print(f"{kernel}:", "equal" if torch.equal(got, seen[f"after_{kernel}"]) else "DIFFERENT")
