#!/usr/bin/env python3
"""ekka-diagnose's comparison rate against memcpy, in one run.

Traces a stack of wide linear layers three times (the target, the bf16-side
reference and the fp32 reference: the same float32 program, so nothing
diverges and every module call is compared), then times ekka-diagnose over
them. The rate is the captured bytes the comparison reads (the three traces'
module outputs, which it maps from the shards) per second of ekka-diagnose's
run, set against memcpy measured here. A benchmark, not a test: nothing
asserts a timing.

  utils/bench/diagnose_throughput.py [--layers N] [--tokens T] [--width W]
"""
import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time

import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import memcpy_gbps  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

PROGRAM = """
import sys, torch
torch.manual_seed(0)
layers, tokens, width = map(int, sys.argv[1:4])
model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).eval()
with torch.no_grad():
    model(torch.randn(tokens, width))
"""


def captured_bytes(trace):
    db = sqlite3.connect(os.path.join(trace, "trace.db"))
    sizes = {"F32": 4, "F64": 8, "I64": 8, "BF16": 2, "F16": 2}
    total = 0
    for dtype, shape in db.execute(
            "SELECT dtype, shape FROM tensors WHERE shard IS NOT NULL AND owner = 'module_call'"):
        total += sizes.get(dtype, 4) * int(numpy.prod([int(x) for x in shape.strip("[]").split(",")
                                                       if x]))
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--build", default=os.environ.get("EKKA_BUILD_DIR", os.path.join(ROOT, "build")))
    args = ap.parse_args()
    bin_dir = os.path.join(args.build, "bin")
    tmp = tempfile.mkdtemp(prefix="ekka-diagnose-bench-")
    program = os.path.join(tmp, "program.py")
    with open(program, "w") as f:
        f.write(PROGRAM)
    shape = [str(args.layers), str(args.tokens), str(args.width)]
    for side in ("target", "ref-bf16", "ref-fp32"):
        subprocess.run([os.path.join(bin_dir, "ekka-trace"), "-o", os.path.join(tmp, side), "--",
                        sys.executable, program] + shape, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    read = sum(captured_bytes(os.path.join(tmp, s)) for s in ("target", "ref-bf16", "ref-fp32"))
    cmd = [os.path.join(bin_dir, "ekka-diagnose"), "--target", f"{tmp}/target",
           "--reference", f"{tmp}/ref-bf16", "--reference-fp32", f"{tmp}/ref-fp32", "--json"]
    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        best = min(best, time.perf_counter() - start)
        if out.returncode != 0:
            sys.exit(f"bench: ekka-diagnose exited {out.returncode} on three equal traces")
    rate = read / best / 1e9
    peer = memcpy_gbps()
    print(f"workload: {args.layers} Linear({args.width}, {args.width}) on {args.tokens} tokens, "
          f"float32; three traces, {read / 2**20:.0f} MiB of module outputs read")
    print(f"  ekka-diagnose: {best:.2f} s (best of {args.repeats}) -> {rate:.2f} GB/s")
    print(f"  memcpy here: {peer:.2f} GB/s; diagnose / memcpy: {rate / peer:.2f}")
    if not os.environ.get("EKKA_BENCH_KEEP"):
        subprocess.run(["rm", "-rf", tmp])
    else:
        print(f"  traces kept in {tmp}")


if __name__ == "__main__":
    main()
