"""Prints, for each trace named, how module b's input relates to module a's
output: `DIR source=a` (the dataflow record, with no statistics or bytes of
its own) or `DIR own ratio=R captured=C` (its own statistics: the ratio of
its sum to a's output's, and whether its bytes were captured)."""
import os
import sqlite3
import sys

QUERY = ("SELECT t.id, t.source_id, t.sum, t.shard FROM tensors t "
         "JOIN module_calls m ON m.id = t.owner_id "
         "WHERE t.owner = 'module_call' AND m.path = ? AND t.role = ?")
for trace in sys.argv[1:]:
    db = sqlite3.connect(f"file:{trace}/trace.db?mode=ro", uri=True)
    a_id, _, a_sum, _ = db.execute(QUERY, ("a", "output")).fetchone()
    _, source, b_sum, shard = db.execute(QUERY, ("b", "input")).fetchone()
    name = os.path.basename(trace)
    if source is not None:
        whose = "a" if source == a_id else source
        print(f"{name} source={whose} sum={b_sum} captured={shard is not None}")
    else:
        print(f"{name} own ratio={b_sum / a_sum:.4f} captured={shard is not None}")
