"""Corrupts a copy of a trace in one way, as a disk, a crash or a careless
edit could: `corrupt.py KIND DIR`. Each kind must make ekka-diagnose fail
with one error line, never crash, hang or answer from what is left."""
import json
import os
import sqlite3
import struct
import sys

kind, trace = sys.argv[1], sys.argv[2]
db = sqlite3.connect(os.path.join(trace, "trace.db"))
shard = os.path.join(trace, "tensors-0000.safetensors")


def header():
    with open(shard, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        return size, json.loads(f.read(size))


def write_header(entries, size):
    with open(shard, "rb") as f:
        data = f.read()[8 + size:]
    text = json.dumps(entries).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(shard, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


if kind == "deep-shape":      # a shape nested past any stack's depth
    db.execute("UPDATE tensors SET shape = ? WHERE id = (SELECT min(id) FROM tensors)",
               ("[" * 100000,))
elif kind == "parent-cycle":  # a module call its own parent
    db.execute("UPDATE module_calls SET parent_id = id WHERE path = 'model.layers.0'")
elif kind == "dtype":         # a row that says another dtype than its shard
    db.execute("UPDATE tensors SET dtype = 'I32' WHERE dtype = 'F32' AND shard IS NOT NULL")
elif kind == "overlap":       # every shard entry reading the first bytes
    size, entries = header()
    for key, entry in entries.items():
        if key != "__metadata__":
            begin, end = entry["data_offsets"]
            entry["data_offsets"] = [0, end - begin]
    write_header(entries, size)
elif kind in ("bytes", "bytes-input"):  # one F32 value of a captured tensor changed
    # The first (the root's input) or the last module input (lm_head's,
    # compared straight from the bytes, never widened to values).
    key, = db.execute("SELECT key FROM tensors WHERE dtype = 'F32' AND shard IS NOT NULL " +
                      ("AND role = 'input' ORDER BY id DESC " if kind == "bytes-input"
                       else "ORDER BY id ") + "LIMIT 1").fetchone()
    size, entries = header()
    begin = 8 + size + entries[key]["data_offsets"][0]
    with open(shard, "r+b") as f:
        f.seek(begin)
        value, = struct.unpack("<f", f.read(4))
        f.seek(begin)
        f.write(struct.pack("<f", value + 1000.0))
elif kind == "device":        # a shard that is a device, read without end
    os.remove(shard)
    os.symlink("/dev/zero", shard)
elif kind == "outside":       # a shard named outside the trace
    db.execute("UPDATE tensors SET shard = '../' || shard WHERE shard IS NOT NULL")
else:
    sys.exit("unknown kind " + kind)
db.commit()
