"""Instructions a forward costs the program's thread: plain, with two
global module hooks that do nothing, traced by ekka-trace with metadata
only, and under torch.profiler with record_shapes, counted by valgrind's
callgrind.

Wall-clock ratios on a busy or small machine swing by more than a change
to the tracer moves them (the tiny model's plain forward took 1.6 to 3.7
ms from one round to the next on a 2-core VM). An instruction count is
the same from run to run (within 0.01 %), so it tells two builds apart
where a timing cannot; it is not time (Python's interpreter and the
runtime differ in instructions per cycle), and it counts the program's
thread only: the trace writer's thread, which runs beside it, is not
counted (callgrind's collection is switched on while
`itertools.starmap` runs the forwards, on that thread).

The model is trace_workload.py's Llama, `--size tiny` by default (hidden
32, 4 tokens: each op's own work is small, as on a GPU, where a forward
is bound by launches). Each variant runs in its own process under
valgrind: about a minute each with the default 10 forwards, after 3 not
counted. Not a test: nothing is asserted.

  EKKA_RUNTIME_LIB=build/lib/libekka_runtime.so PYTHONPATH=python \\
      python utils/bench/trace_instructions.py [--forwards N] [--size bench]

With --writer it counts the trace writer's thread instead: the
instructions `TraceWriter::run` takes (SQLite's inserts, the shards) for
the rows of a metadata-only trace of the same forwards, per row.

With --launches it counts what recording a kernel launch costs the
program's thread, without a GPU: `ekka::recordKernelLaunch` (the record
CUPTI's launch callback makes) over simulated launches
(`torch.ops.ekka.simulated_launch`, a long mangled name) under one module
call, per launch.

Needs valgrind (Debian: `apt-get install valgrind`).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

VARIANTS = ("plain", "hooks", "meta", "profiler")
TABLES = ("module_calls", "ops", "kernels", "tensors")

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--forwards", type=int, default=10, help="forwards counted (default 10)")
parser.add_argument("--size", default="tiny", choices=("tiny", "bench"),
                    help="tiny: hidden 32, 4 tokens (default); bench: hidden 512, 256 tokens")
parser.add_argument("--writer", action="store_true",
                    help="count the trace writer's thread, per row written, instead")
parser.add_argument("--launches", action="store_true",
                    help="count recordKernelLaunch's instructions per simulated kernel launch")
parser.add_argument("--variant", choices=VARIANTS + ("writer", "launches"),
                    help=argparse.SUPPRESS)  # one, in-process
args = parser.parse_args()


# A kernel's mangled name as CUPTI reports it, of a usual length.
KERNEL = ("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1"
          "EEEEviT0_T1_")


def run_launches():
    """Simulated kernel launches under one module call of a trace (which
    starts at the first module call): 100 first, then args.forwards * 500
    while starmap runs them."""
    import itertools

    import torch

    import ekka.trace

    launches = args.forwards * 500

    class Launcher(torch.nn.Module):
        def forward(self, n, counted):
            launch = torch.ops.ekka.simulated_launch.default
            if counted:
                list(itertools.starmap(launch, [(KERNEL, [])] * n))
            else:
                for _ in range(n):
                    launch(KERNEL, [])
            return torch.zeros(1)

    tmp = tempfile.mkdtemp(prefix="ekka-bench-")
    try:
        with ekka.trace.Trace(os.path.join(tmp, "launches"), capture="none"):
            Launcher()(100, False)
            Launcher()(launches, True)
        print("launches=%d" % launches)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_variant(variant):
    """Runs the forwards of one variant in this process (under valgrind)."""
    if variant == "launches":
        return run_launches()
    import itertools

    import torch
    import transformers

    torch.manual_seed(0)
    torch.set_num_threads(1)
    hidden, tokens = (512, 256) if args.size == "bench" else (32, 4)
    config = transformers.LlamaConfig(
        vocab_size=4096, hidden_size=hidden, intermediate_size=3 * hidden,
        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
        max_position_embeddings=512)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 4096, (1, tokens))

    def forward():
        with torch.no_grad():
            model(ids)

    def counted():
        for _ in range(3):
            forward()
        # callgrind collects while starmap_next runs: these forwards only.
        list(itertools.starmap(forward, [()] * args.forwards))

    if variant == "plain":
        counted()
    elif variant == "hooks":
        from torch.nn.modules.module import (register_module_forward_hook,
                                             register_module_forward_pre_hook)
        register_module_forward_pre_hook(lambda module, args_: None)
        register_module_forward_hook(lambda module, args_, kwargs, output: None,
                                     with_kwargs=True, always_call=True)
        counted()
    elif variant in ("meta", "writer"):
        import sqlite3

        import ekka.trace
        tmp = tempfile.mkdtemp(prefix="ekka-bench-")
        try:
            with ekka.trace.Trace(os.path.join(tmp, "meta"), capture="none"):
                counted()
            if variant == "writer":  # the rows its thread wrote
                db = sqlite3.connect(os.path.join(tmp, "meta", "trace.db"))
                print("rows=%d" % sum(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                                      for table in TABLES))
                db.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    else:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
            counted()


if args.variant:
    run_variant(args.variant)
    sys.exit(0)

if shutil.which("valgrind") is None:
    print("trace_instructions.py: error: valgrind is not installed (apt-get install valgrind)",
          file=sys.stderr)
    sys.exit(2)
if not os.environ.get("EKKA_RUNTIME_LIB"):
    print("trace_instructions.py: error: set EKKA_RUNTIME_LIB to build/lib/libekka_runtime.so",
          file=sys.stderr)
    sys.exit(2)

def under_callgrind(variant, collect):
    """Runs one variant in its own process under callgrind, collecting
    while `collect` runs: (the instructions collected, its stdout)."""
    with tempfile.TemporaryDirectory(prefix="ekka-callgrind-") as out:
        command = ["valgrind", "--tool=callgrind", f"--toggle-collect={collect}",
                   f"--callgrind-out-file={out}/{variant}.out", sys.executable, __file__,
                   "--variant", variant, "--forwards", str(args.forwards), "--size", args.size]
        done = subprocess.run(command, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or not found:
        print(f"trace_instructions.py: error: the {variant} run failed:\n"
              f"{done.stderr[-2000:]}", file=sys.stderr)
        sys.exit(2)
    return int(found.group(1)), done.stdout


def printed_count(stdout, key, missing):
    """The `key=N` a variant's run printed (N > 0); exits where it did not."""
    found = re.search(rf"{key}=(\d+)", stdout)
    if not found or not int(found.group(1)):
        print(f"trace_instructions.py: error: {missing}", file=sys.stderr)
        sys.exit(2)
    return int(found.group(1))


if args.launches:
    print("simulated kernel launches under callgrind ...", file=sys.stderr, flush=True)
    instructions, stdout = under_callgrind("launches", "ekka::recordKernelLaunch*")
    launches = printed_count(stdout, "launches", "no launch was simulated")
    # The 100 launches before the counted ones are counted too.
    print(f"recordKernelLaunch (the program's thread): {instructions / (launches + 100):.0f} "
          f"instructions a launch, over {launches + 100} simulated launches")
    sys.exit(0)

if args.writer:
    print(f"the writer's thread: {args.forwards + 3} forwards under callgrind ...",
          file=sys.stderr, flush=True)
    instructions, stdout = under_callgrind("writer", "ekka::TraceWriter::run()")
    rows = printed_count(stdout, "rows", "the writer's run wrote no rows")
    print(f"the trace writer's thread ({args.size} Llama, metadata only): {rows} rows, "
          f"{instructions / 1e6:.1f}M instructions, {instructions / rows:.0f} a row")
    sys.exit(0)

counts = {}
for variant in VARIANTS:
    print(f"{variant}: {args.forwards} forwards under callgrind ...", file=sys.stderr,
          flush=True)
    counts[variant] = under_callgrind(variant, "starmap_next")[0] / args.forwards

plain = counts["plain"]
print(f"instructions per forward ({args.size} Llama, the program's thread):")
for variant in VARIANTS:
    print(f"  {variant:9s} {counts[variant] / 1e6:8.2f} M  {counts[variant] / plain:5.2f}x plain")
print(f"meta/profiler={counts['meta'] / counts['profiler']:.3f} "
      f"meta_over_hooks={(counts['meta'] - counts['hooks']) / 1e6:.2f}M "
      f"profiler_over_plain={(counts['profiler'] - plain) / 1e6:.2f}M")
