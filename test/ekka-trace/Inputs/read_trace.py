"""Opens a trace with the standard sqlite3 module and safetensors only, as
docs/TraceFormat.md shows (safetensors' torch loader, which has every dtype a
trace holds, bfloat16 included), and checks the root module's captured
output against what the program saved."""
import sqlite3
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file


def tensor(path, key):
    with safe_open(path, framework="pt") as f:
        return f.get_tensor(key)


trace, own = sys.argv[1], sys.argv[2]
db = sqlite3.connect(f"file:{trace}/trace.db?mode=ro", uri=True)
print("format", db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()[0])
shard, key, dtype = db.execute(
    "SELECT t.shard, t.key, t.dtype FROM tensors t JOIN module_calls m ON m.id = t.owner_id "
    "WHERE t.owner = 'module_call' AND t.role = 'output' AND m.parent_id IS NULL "
    "ORDER BY t.idx LIMIT 1").fetchone()
captured = tensor(f"{trace}/{shard}", key)
mine = load_file(own)["logits"]
same = captured.dtype == mine.dtype and torch.equal(captured, mine)
print("root output", tuple(captured.shape), dtype, "bitwise equal" if same else "DIFFERENT")
# Every captured tensor's statistics agree with its bytes.
bad = 0
for shard, key, s in db.execute("SELECT shard, key, sum FROM tensors WHERE shard IS NOT NULL"):
    t = tensor(f"{trace}/{shard}", key).to(torch.float64)
    if s is not None and not torch.isclose(t.sum(), torch.tensor(s, dtype=torch.float64),
                                           rtol=1e-9, atol=1e-9):
        bad += 1
print("statistics that disagree with the bytes:", bad)
for row in db.execute("SELECT path, class_name FROM module_calls WHERE path LIKE 'model.layers.1%' ORDER BY seq"):
    print("call", *row)
