#!/usr/bin/env python3
"""ekka-trace's cost against a plain forward and torch.profiler, in one run.

Runs the same model and input (utils/bench/trace_workload.py) four ways —
plain, under ekka-trace keeping metadata and statistics only
(--capture=none), under ekka-trace capturing every module's outputs, and
under torch.profiler with record_shapes — and prints the time per forward and
the ratios to plain. Then the capture's write rate against memcpy measured
here. A benchmark, not a test: nothing asserts a timing.

  utils/bench/trace_overhead.py [--iters N] [--rounds R] [--device cuda] [--size tiny]
                                [--trace-dir DIR] [--ekka-trace PATH]

Each of the four runs is repeated --rounds times, interleaved, and the best
time of each kept: on a small shared machine one run alone varies by
several per cent. The traces are written under --trace-dir (default: the
temporary directory); the capture's peers are memcpy and the rate that
directory's file system takes writes at, both measured here. On a GPU the
capture's peer is also the device-to-host copy rate, since every captured
byte crosses it.

Process by process, those ten forwards include what a trace costs at its
start (the first traced forwards grow the process's heap once). Then, with
--steady R (default 10), the steady state in one process: R rounds of plain
forwards, forwards traced with metadata only (ekka.trace.Trace) and
forwards under torch.profiler, taking turns, each after two forwards of its
own; the median per forward of each, on a CPU in the program's thread's
own time.
"""
import argparse
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import file_write_gbps, memcpy_gbps  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKLOAD = os.path.join(HERE, "trace_workload.py")


def ms_per_forward(cmd):
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed:\n{out.stderr}")
    return float(re.search(r"ms_per_forward=([0-9.]+)", out.stdout).group(1))


def d2h_gbps(nbytes=256 << 20, repeats=5):
    import torch
    src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        src.cpu()
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--ekka-trace", default=os.path.join(ROOT, "build", "bin", "ekka-trace"))
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--size", default="bench", choices=("bench", "tiny"),
                    help="the Llama's size: bench (hidden 512, 256 tokens; default) or tiny "
                         "(hidden 32, 4 tokens: each op's work negligible, the per-call cost "
                         "of tracing as on a GPU, on a CPU)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trace-dir", default=None, help="where the traces go (a file system)")
    ap.add_argument("--steady", type=int, default=10, metavar="R",
                    help="rounds of the steady-state comparison in one process (0: none)")
    args = ap.parse_args()
    py = sys.executable
    tmp = tempfile.mkdtemp(prefix="ekka-trace-bench-", dir=args.trace_dir)
    work = [py, WORKLOAD, "--iters", str(args.iters), "--device", args.device,
            "--size", args.size]

    runs = {
        "plain": lambda: work,
        "meta": lambda: [args.ekka_trace, "-o", f"{tmp}/meta", "--force", "--capture=none",
                         "--"] + work,
        "capture": lambda: [args.ekka_trace, "-o", f"{tmp}/capture", "--force", "--"] + work,
        "profiler": lambda: work + ["--profiler"],
    }
    best = {name: float("inf") for name in runs}
    for round in range(max(1, args.rounds)):
        for name, cmd in runs.items():
            ms = ms_per_forward(cmd())
            best[name] = min(best[name], ms)
            # As it comes: a run cut short still shows what it measured.
            print(f"  (round {round + 1}: {name} {ms:.2f} ms/forward)", flush=True)
    plain, meta, capture, prof = (best[n] for n in ("plain", "meta", "capture", "profiler"))

    db = sqlite3.connect(f"{tmp}/capture/trace.db")
    rows = db.execute("SELECT dtype, shape FROM tensors WHERE shard IS NOT NULL").fetchall()
    sizes = {"F32": 4, "I64": 8, "BF16": 2, "F16": 2}
    captured = sum(sizes.get(d, 4) * numpy.prod([int(x) for x in s.strip("[]").split(",") if x])
                   for d, s in rows)
    forwards = args.iters + 1
    per_forward_bytes = captured / forwards
    extra_s = max(capture - meta, 1e-6) / 1000
    write_gbps = per_forward_bytes / extra_s / 1e9
    mem = memcpy_gbps()
    # As much as one capture run wrote: a file system that takes a burst
    # into its cache at memory speed may slow down once it must write back.
    disk = file_write_gbps(tmp, nbytes=max(int(captured), 64 << 20))

    shape = "hidden 512, 4 layers, 256 tokens" if args.size == "bench" else \
        "hidden 32, 4 layers, 4 tokens"
    print(f"workload: HF Llama, {shape}, {args.device} float32, "
          f"1 CPU thread; {args.iters} forwards after a warm-up; best of {args.rounds} rounds")
    print(f"  {'':34}{'ms/forward':>11}{'ratio':>8}")
    for name, v in [("plain", plain), ("ekka-trace --capture=none", meta),
                    ("ekka-trace (capture modules)", capture),
                    ("torch.profiler record_shapes", prof)]:
        print(f"  {name:34}{v:>11.2f}{v / plain:>8.2f}")
    if capture <= meta:
        # The writer's thread kept up on another core: the capture cost the
        # program nothing measurable.
        print(f"  captured per forward: {per_forward_bytes / 2**20:.1f} MiB; no extra time per "
              f"forward over --capture=none (within noise)")
        print(f"  memcpy here: {mem:.2f} GB/s; writes into {os.path.dirname(tmp)}: {disk:.2f} GB/s")
    else:
        print(f"  captured per forward: {per_forward_bytes / 2**20:.1f} MiB; extra time per "
              f"forward over --capture=none: {extra_s * 1000:.2f} ms -> {write_gbps:.2f} GB/s")
        print(f"  memcpy here: {mem:.2f} GB/s; capture / memcpy: {write_gbps / mem:.2f}")
        print(f"  writes into {os.path.dirname(tmp)}: {disk:.2f} GB/s; capture / that: "
              f"{write_gbps / disk:.2f}")
    if args.steady > 0:
        env = dict(os.environ)
        env.setdefault("EKKA_RUNTIME_LIB", os.path.join(ROOT, "build", "lib", "libekka_runtime.so"))
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(ROOT, "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        out = subprocess.run(work + ["--steady", str(args.steady)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        found = re.search(r"steady plain=([0-9.]+) meta=([0-9.]+) profiler=([0-9.]+)", out.stdout)
        if out.returncode != 0 or not found:
            sys.exit(f"bench: the steady-state run failed:\n{out.stderr}")
        s_plain, s_meta, s_prof = (float(found.group(i)) for i in (1, 2, 3))
        clock = "the program's thread's time" if args.device == "cpu" else "wall time"
        print(f"steady state, one process, median of {args.steady} rounds ({clock}):")
        kernels = re.search(r"steady_gpu_kernels: (.*)", out.stdout)
        if kernels:
            print(f"  (the traced rounds' GPU kernels: {kernels.group(1)}; the profiler's rounds "
                  "after them)")
        for name, v in [("plain", s_plain), ("ekka.trace.Trace(capture='none')", s_meta),
                        ("torch.profiler record_shapes", s_prof)]:
            print(f"  {name:34}{v:>11.2f}{v / s_plain:>8.2f}")
    if args.device != "cpu":
        d2h = d2h_gbps()
        print(f"  device-to-host copy here: {d2h:.2f} GB/s; capture / that: {write_gbps / d2h:.2f}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
