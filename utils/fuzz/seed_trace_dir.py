"""Writes seed inputs for ekka-fuzz-trace_dir: real traces, recorded by the
built ekka-trace from a tiny torch program, each packed with its shards
into the target's container (trace_dir_fuzzer.h: "\\0EKKA:" NAME "\\n"
CONTENT, one after another). Usage: seed_trace_dir.py EKKA_TRACE PYTHON DIR

Each trace.db is rewritten with 512-byte pages (VACUUM): the same tables
and rows in a few KiB rather than 64, so that libFuzzer's mutations land
on rows and schema more than on free space. The seeds: a trace with op
inputs and statistics captured; the same with GPU kernels' rows added (no
GPU here to record them); a two-rank run (rank-0/, rank-1/, their start
markers); one left in WAL mode without its -wal (what the reader opens
immutable); and one whose last rows are still in trace.db-wal."""
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile

ekka_trace, python, out = sys.argv[1:4]
os.makedirs(out, exist_ok=True)
MARKER = b"\0EKKA:"

PROGRAM = """
import torch
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
x = torch.randn(2, 4)
with torch.no_grad():
    m(x)
    m.to(torch.bfloat16)(x.to(torch.bfloat16))
"""


def trace(work, name, *options, env=None):
    subprocess.run([ekka_trace, "-o", os.path.join(work, name), *options, "--",
                    python, os.path.join(work, "prog.py")],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env=dict(os.environ, **(env or {})))
    return os.path.join(work, name)


def compact(db, wal=False):
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA journal_mode=DELETE")
    con.execute("PRAGMA page_size=512")
    con.execute("VACUUM")
    if wal:
        con.execute("PRAGMA journal_mode=WAL")
    con.close()


def pack(name, files):
    """files: (name in the trace, path) pairs."""
    with open(os.path.join(out, name), "wb") as f:
        for inner, path in files:
            with open(path, "rb") as data:
                f.write(MARKER + inner.encode() + b"\n" + data.read())


def files_of(directory, prefix=""):
    return [(prefix + n, os.path.join(directory, n)) for n in sorted(os.listdir(directory))
            if os.path.isfile(os.path.join(directory, n))]


with tempfile.TemporaryDirectory() as work:
    with open(os.path.join(work, "prog.py"), "w") as f:
        f.write(PROGRAM)

    ops = trace(work, "ops", "--capture-ops", "aten::(addmm|relu)", "--capture-op-inputs",
                "--op-stats")
    compact(os.path.join(ops, "trace.db"))
    pack("ops", files_of(ops))

    # GPU kernels' rows, as CUPTI's callbacks would have left them under ops.
    kernels = os.path.join(work, "kernels")
    shutil.copytree(ops, kernels)
    con = sqlite3.connect(os.path.join(kernels, "trace.db"), isolation_level=None)
    rows = con.execute("SELECT id, module_call_id, seq FROM ops ORDER BY seq LIMIT 3").fetchall()
    for i, (op, call, seq) in enumerate(rows):
        con.execute("INSERT INTO kernels(op_id, module_call_id, seq, name, grid, block, "
                    "shared_mem, stream, correlation_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (op, call, seq, "_Z6kernelPfi" if i else "void at::native::f<float>()",
                     "[4,1,1]", "[128,1,1]", 1024 * i, 7, 100 + i))
    con.close()
    compact(os.path.join(kernels, "trace.db"))
    pack("kernels", files_of(kernels))

    ranks = []
    for rank in (0, 1):
        base = trace(work, f"ranks{rank}", "--capture-modules", "^0$",
                     env={"RANK": str(rank), "WORLD_SIZE": "2"})
        own = os.path.join(base, f"rank-{rank}")
        compact(os.path.join(own, "trace.db"))
        ranks += files_of(own, f"rank-{rank}/")
    pack("ranks", ranks)

    plain = trace(work, "plain", "--capture", "none")
    compact(os.path.join(plain, "trace.db"), wal=True)
    pack("wal-mode", files_of(plain))

    # A trace not closed: its last rows in trace.db-wal, copied while open.
    open_wal = os.path.join(work, "open-wal")
    shutil.copytree(plain, open_wal)
    con = sqlite3.connect(os.path.join(open_wal, "trace.db"), isolation_level=None)
    con.execute("PRAGMA wal_autocheckpoint=0")
    con.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('framework', 'seed')")
    copy = os.path.join(work, "open-wal-copy")
    os.makedirs(copy)
    for n in ("trace.db", "trace.db-wal"):
        shutil.copy(os.path.join(open_wal, n), os.path.join(copy, n))
    con.close()
    pack("open-wal", files_of(copy))
