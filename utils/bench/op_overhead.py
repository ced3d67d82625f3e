"""The op observer's cost per op, against torch.profiler in the same process.

A loop of `torch.add` on two 8-element CPU tensors: the op itself costs
about a microsecond, so what each tracer adds per op shows. Rounds take
turns — plain, ekka.trace.Trace(capture='none'), torch.profiler with
record_shapes — and the median of each is printed in microseconds per op
with its ratio to plain. Not a test: a timing is never asserted.

  EKKA_RUNTIME_LIB=build/lib/libekka_runtime.so PYTHONPATH=python \\
      python utils/bench/op_overhead.py [--ops N] [--rounds R]

With --only meta (or plain, profiler) it runs that one loop for --seconds,
for a profiler such as perf to attach to; --ready FILE is written when
the loop starts.
"""
import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--ops", type=int, default=100000, help="ops per round (default 100000)")
parser.add_argument("--rounds", type=int, default=5, help="rounds of each (default 5)")
parser.add_argument("--only", choices=["plain", "meta", "profiler"],
                    help="run only this loop, for --seconds")
parser.add_argument("--seconds", type=float, default=10.0)
parser.add_argument("--ready", help="a file to write when the --only loop starts")
args = parser.parse_args()

torch.set_num_threads(1)
a = torch.ones(8)
b = torch.ones(8)


class Loop(torch.nn.Module):
    """The ops run inside a module's forward: a trace starts at the first
    module call, and the ops are attributed to it."""

    def forward(self, n):
        start = time.perf_counter()
        for _ in range(n):
            torch.add(a, b)
        return 1e6 * (time.perf_counter() - start) / n


loop = Loop()


def tracer(kind, tmp):
    if kind == "meta":
        import ekka.trace
        return ekka.trace.Trace(os.path.join(tmp, "meta"), capture="none", force=True)
    if kind == "profiler":
        from torch.profiler import profile, ProfilerActivity
        return profile(activities=[ProfilerActivity.CPU], record_shapes=True)
    import contextlib
    return contextlib.nullcontext()


tmp = tempfile.mkdtemp(prefix="ekka-op-overhead-")
try:
    loop(10000)  # warm-up
    if args.only:
        with tracer(args.only, tmp):
            if args.ready:
                open(args.ready, "w").close()
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                loop(10000)
    else:
        times = {"plain": [], "meta": [], "profiler": []}
        for _ in range(args.rounds):
            for kind in times:
                with tracer(kind, tmp):
                    loop(1000)
                    times[kind].append(loop(args.ops))
        plain = statistics.median(times["plain"])
        names = {"plain": "plain", "meta": "ekka-trace --capture=none",
                 "profiler": "torch.profiler record_shapes"}
        print(f"{'':36} {'us/op':>8} {'ratio':>7}")
        for kind, values in times.items():
            m = statistics.median(values)
            print(f"  {names[kind]:34} {m:8.3f} {m / plain:7.2f}")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
