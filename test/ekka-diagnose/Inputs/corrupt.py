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
elif kind == "device":        # a shard that is a FIFO, read without end
    os.remove(shard)
    os.mkfifo(shard)
elif kind == "outside":       # a shard named outside the trace
    db.execute("UPDATE tensors SET shard = '../' || shard WHERE shard IS NOT NULL")
elif kind == "control-shard":  # a shard name that would retitle a terminal
    db.execute("UPDATE tensors SET shard = 'evil' || char(27) || ']0;pwned' || char(7) || "
               "'.safetensors' WHERE shard IS NOT NULL")
elif kind == "absolute":      # a shard named by an absolute path
    db.execute("UPDATE tensors SET shard = ? || '/' || shard WHERE shard IS NOT NULL",
               (os.path.abspath(trace),))
elif kind == "symlink-out":   # the shard a symlink to a file outside the trace
    os.rename(shard, trace + ".outside")
    os.symlink(os.path.abspath(trace + ".outside"), shard)
elif kind == "symlink-in":    # the shard a symlink to another file of the trace
    os.rename(shard, os.path.join(trace, "moved.safetensors"))
    os.symlink("moved.safetensors", shard)
elif kind == "db-symlink-out":  # trace.db a symlink to a database outside
    db.close()
    db_path = os.path.join(trace, "trace.db")
    os.rename(db_path, trace + ".db")
    os.symlink(os.path.abspath(trace + ".db"), db_path)
    sys.exit(0)
elif kind in ("wal-symlink-out", "wal-symlink-nowhere", "wal-fifo"):
    # SQLite's write-ahead log beside trace.db, which it reads: a symlink
    # to a file outside, a symlink to nothing, a FIFO.
    db.close()
    wal = os.path.join(trace, "trace.db-wal")
    if kind == "wal-symlink-out":
        with open(trace + ".outside-wal", "wb") as f:
            f.write(b"not the trace's" * 100)
        os.symlink(os.path.abspath(trace + ".outside-wal"), wal)
    elif kind == "wal-symlink-nowhere":
        os.symlink(os.path.abspath(trace + ".outside-wal"), wal)
    else:
        os.mkfifo(wal)
    sys.exit(0)
elif kind == "shm-symlink-out":
    # A trace left in WAL mode, its last rows in trace.db-wal, and the
    # log's index, which SQLite opens to read and write it, a symlink to a
    # file outside.
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("INSERT INTO meta(key, value) VALUES ('left_in_wal', 'yes')")
    db.commit()
    shm = os.path.join(trace, "trace.db-shm")
    os.rename(shm, trace + ".outside-shm")
    os.symlink(os.path.abspath(trace + ".outside-shm"), shm)
    os._exit(0)             # no close: the log stays, as a killed writer leaves it
elif kind == "offsets-past-end":  # an entry's bytes said to run past the file
    size, entries = header()
    key = next(k for k in entries if k != "__metadata__")
    entries[key]["data_offsets"][1] += 1 << 40
    write_header(entries, size)
elif kind == "shape":         # a row that says another shape than its shard
    db.execute("UPDATE tensors SET shape = '[1, 1]' WHERE id = (SELECT min(id) FROM tensors "
               "WHERE dtype = 'F32' AND shard IS NOT NULL)")
elif kind == "malformed":     # a page of the tensors table overwritten
    root, page_size = db.execute("SELECT rootpage, (SELECT page_size FROM pragma_page_size()) "
                                 "FROM sqlite_master WHERE name = 'tensors'").fetchone()
    db.close()
    with open(os.path.join(trace, "trace.db"), "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xee" * 64)
    sys.exit(0)
elif kind == "orphan-tensor":  # a tensor of a module call that does not exist
    db.execute("UPDATE tensors SET owner_id = 999999 WHERE id = (SELECT min(id) FROM tensors "
               "WHERE owner = 'module_call')")
elif kind == "orphan-op":     # an op of a module call that does not exist
    db.execute("UPDATE ops SET module_call_id = 999999 WHERE id = (SELECT max(id) FROM ops)")
elif kind == "orphan-kernel":  # a kernel of an op that does not exist
    db.execute("INSERT INTO kernels(op_id, module_call_id, seq, name, grid, block, shared_mem, "
               "stream, correlation_id) VALUES (999999, NULL, 0, 'k', '[1,1,1]', '[1,1,1]', 0, "
               "0, 1)")
elif kind == "later-source":  # a module input said to repeat a later tensor
    db.execute("UPDATE tensors SET source_id = (SELECT max(id) FROM tensors) WHERE id = "
               "(SELECT min(id) FROM tensors)")
elif kind.startswith("format-"):  # another format's version in meta
    version = kind[len("format-"):]
    if version == "1.0":      # and what 1.0 lacked: later columns and tables
        db.executescript("ALTER TABLE tensors DROP COLUMN source_id; "
                         "ALTER TABLE tensors DROP COLUMN layout; DROP TABLE spans;")
    db.execute("UPDATE meta SET value = ? WHERE key = 'format'", ("ekka-trace " + version,))
else:
    sys.exit("unknown kind " + kind)
db.commit()
