#!/usr/bin/env python3
"""ekka-diagnose's peak memory on traces of a gigabyte and more.

Traces a deep stack of linear layers and GELUs three times through
ekka-trace (the reference; the same program again, a clean target; and a
target whose layer --bug-layer adds a small bias: a planted silent error),
each over --steps forward passes, so that every trace holds
--layers x 2 x --steps module outputs of tokens x width float32 values.
Then runs ekka-diagnose on each target against the reference, and reports
for each its wall time and peak memory, both read from /proc every 10 ms:
the kernel's high-water mark of the resident set (VmHWM: anonymous memory
and the shards' mapped pages together) and the peak of its anonymous part alone
(RssAnon: what the diagnosis allocates, as opposed to shard pages the kernel
can drop at any time). The memory ratios are against the bytes of the two
traces; the time ratio against reading those bytes once (the peer).
A benchmark, not a test: nothing asserts a figure. It checks only that the
pair names the planted layer and that the clean pair reads clean.

  utils/bench/diagnose_scale.py [--layers N] [--tokens T] [--width W]
                                [--steps S] [--bug-layer K] [--keep DIR]

The defaults write three traces of 1.37 GB each (half a minute here).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

PROGRAM = """
import sys, torch
layers, tokens, width, steps, bug = map(int, sys.argv[1:6])
torch.manual_seed(0)
blocks = []
for _ in range(layers):
    blocks += [torch.nn.Linear(width, width), torch.nn.GELU()]
model = torch.nn.Sequential(*blocks).eval()
if bug >= 0:
    # The planted silent error: one linear layer's bias off by a little.
    with torch.no_grad():
        model[2 * bug].bias += 0.05
with torch.no_grad():
    for step in range(steps):
        torch.manual_seed(100 + step)
        model(torch.randn(tokens, width) * 0.5)
"""


def dir_bytes(path):
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(dirpath, f))
    return total


def read_all(paths):
    """Seconds to read every byte under paths once, in 16 MiB reads: the peer,
    the floor for anything that looks at every value of the traces."""
    start = time.perf_counter()
    for path in paths:
        for dirpath, _, files in os.walk(path):
            for name in files:
                with open(os.path.join(dirpath, name), "rb", buffering=0) as f:
                    while f.read(16 << 20):
                        pass
    return time.perf_counter() - start


def status_kib(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def measured(cmd):
    """Runs cmd; returns (exit code, stdout, seconds, VmHWM MiB, peak RssAnon MiB)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peak = {"anon": 0, "hwm": 0}
    done = threading.Event()

    def sample():
        while not done.is_set():
            anon = status_kib(proc.pid, "RssAnon")
            hwm = status_kib(proc.pid, "VmHWM")
            if anon is not None:
                peak["anon"] = max(peak["anon"], anon)
            if hwm is not None:
                peak["hwm"] = max(peak["hwm"], hwm)
            done.wait(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    out = proc.stdout.read()
    # Not the ended process's ru_maxrss: Linux counts in it the resident set
    # of this Python (with torch) that forked it. VmHWM only grows, so the
    # samples miss at most what the last 10 ms added.
    proc.wait()
    elapsed = time.perf_counter() - start
    done.set()
    sampler.join()
    return proc.returncode, out, elapsed, peak["hwm"] / 1024, peak["anon"] / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--bug-layer", type=int, default=57)
    ap.add_argument("--keep", help="write the traces here and keep them")
    ap.add_argument("--build", default=os.environ.get("EKKA_BUILD_DIR", os.path.join(ROOT, "build")))
    args = ap.parse_args()
    if not 0 <= args.bug_layer < args.layers:
        sys.exit("bench: --bug-layer must name one of the --layers")
    if subprocess.run([sys.executable, "-c", "import torch"], stderr=subprocess.DEVNULL).returncode:
        sys.exit("bench: run this with the Python that has torch "
                 "(~/.cache/ekka/venv/bin/python utils/bench/diagnose_scale.py)")
    bin_dir = os.path.join(args.build, "bin")
    tmp = args.keep or tempfile.mkdtemp(prefix="ekka-diagnose-scale-")
    os.makedirs(tmp, exist_ok=True)
    program = os.path.join(tmp, "program.py")
    with open(program, "w") as f:
        f.write(PROGRAM)
    traces = {}
    for side, bug in (("reference", -1), ("clean", -1), ("target", args.bug_layer)):
        traces[side] = os.path.join(tmp, side + ".trace")
        t = time.perf_counter()
        run = subprocess.run([os.path.join(bin_dir, "ekka-trace"), "-o", traces[side], "--force",
                              "--", sys.executable, program, str(args.layers), str(args.tokens),
                              str(args.width), str(args.steps), str(bug)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if run.returncode:
            sys.exit(f"bench: tracing the {side} failed (exit {run.returncode}):\n"
                     + run.stderr[-2000:])
        print(f"traced the {side}: {dir_bytes(traces[side]) / 1e9:.2f} GB in "
              f"{time.perf_counter() - t:.0f} s", flush=True)
    pair_bytes = dir_bytes(traces["reference"]) + dir_bytes(traces["target"])
    print(f"workload: {args.layers} x (Linear({args.width}, {args.width}), GELU) on "
          f"{args.tokens} tokens, float32, {args.steps} forward passes; "
          f"{pair_bytes / 1e9:.2f} GB in the two traces")

    peer = read_all([traces["reference"], traces["target"]])
    print(f"  peer: reading the two traces once takes {peer:.1f} s")

    diagnose = os.path.join(bin_dir, "ekka-diagnose")
    runs = (("planted bug", traces["target"], 1), ("clean pair", traces["clean"], 0))
    for what, target, want in runs:
        rc, out, secs, hwm, anon = measured(
            [diagnose, "--target", target, "--reference", traces["reference"], "--json"])
        if rc != want:
            sys.exit(f"bench: ekka-diagnose exited {rc} on the {what} (expected {want})")
        named = ""
        if want == 1:
            suspects = json.loads(out).get("suspects", [])
            first = suspects[0]["component"] if suspects else "nothing"
            if first != str(2 * args.bug_layer):
                sys.exit(f"bench: the {what} named {first}, not the planted "
                         f"{2 * args.bug_layer}")
            named = f", names component {first}"
        print(f"  {what}: {secs:.1f} s ({secs / peer:.1f}x the read){named}; peak RSS {hwm:.0f} MiB "
              f"({hwm * 2**20 / pair_bytes:.3f} of the traces), of it anonymous at most "
              f"{anon:.0f} MiB ({anon * 2**20 / pair_bytes:.3f})", flush=True)
    if not args.keep:
        shutil.rmtree(tmp)
    else:
        print(f"  traces kept in {tmp}")


if __name__ == "__main__":
    main()
