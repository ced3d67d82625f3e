"""Opens a trace with the standard sqlite3 module and safetensors only, and
checks the root module's captured output against what the program saved."""
import sqlite3
import sys

import numpy
from safetensors.numpy import load_file

trace, own = sys.argv[1], sys.argv[2]
db = sqlite3.connect(f"file:{trace}/trace.db?mode=ro", uri=True)
print("format", db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()[0])
shard, key = db.execute(
    "SELECT t.shard, t.key FROM tensors t JOIN module_calls m ON m.id = t.owner_id "
    "WHERE t.owner = 'module_call' AND t.role = 'output' AND m.parent_id IS NULL "
    "ORDER BY t.idx LIMIT 1").fetchone()
captured = load_file(f"{trace}/{shard}")[key]
mine = load_file(own)["logits"]
print("root output", captured.shape, "bitwise equal" if numpy.array_equal(captured, mine) else "DIFFERENT")
# Every captured tensor's statistics agree with its bytes.
bad = 0
for shard, key, s in db.execute("SELECT shard, key, sum FROM tensors WHERE shard IS NOT NULL"):
    t = load_file(f"{trace}/{shard}")[key].astype(numpy.float64)
    if s is not None and not numpy.isclose(t.sum(), s, rtol=1e-9, atol=1e-9):
        bad += 1
print("statistics that disagree with the bytes:", bad)
for row in db.execute("SELECT path, class_name FROM module_calls WHERE path LIKE 'model.layers.1%' ORDER BY seq"):
    print("call", *row)
