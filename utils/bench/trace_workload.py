"""The workload of utils/bench/trace_overhead.py: a HuggingFace Llama (random
weights, float32, CPU or --device cuda), timed over repeated forwards after a
warm-up. --size tiny (hidden 32, 4 tokens) makes each op's own work
negligible: what a traced forward costs per module call and per op, as on a
GPU, whose forward of this Llama is bound by launching its kernels.
Prints one line: `ms_per_forward=<float>`; with --steady, one line
`steady plain=<ms> meta=<ms> profiler=<ms>`."""
import argparse
import os
import sys
import time

import torch
import transformers

parser = argparse.ArgumentParser()
parser.add_argument("--profiler", action="store_true",
                    help="run under torch.profiler with record_shapes=True")
parser.add_argument("--iters", type=int, default=10)
parser.add_argument("--device", default="cpu")
parser.add_argument("--size", default="bench", choices=("bench", "tiny"),
                    help="bench: hidden 512, 256 tokens (default); tiny: hidden 32, 4 tokens")
parser.add_argument("--steady", type=int, default=0, metavar="ROUNDS",
                    help="in this one process, ROUNDS rounds of plain forwards, forwards "
                         "traced with metadata only (ekka.trace.Trace, capture='none') and "
                         "forwards under torch.profiler, taking turns, each after two "
                         "forwards of its own; prints the median time per forward of each")
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
hidden, tokens = (512, 256) if args.size == "bench" else (32, 4)
config = transformers.LlamaConfig(
    vocab_size=4096, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=4,
    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)
model = transformers.LlamaForCausalLM(config).eval().to(args.device)
ids = torch.randint(0, 4096, (1, tokens)).to(args.device)
# Forwards per timing in the steady state: about 0.5 s of plain forwards.
per_round = 5 if args.size == "bench" else 100


def run():
    with torch.no_grad():
        model(ids)
    if args.device != "cpu":
        torch.cuda.synchronize()


def profiler_activities():
    from torch.profiler import ProfilerActivity
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device != "cpu" else [])


run()  # warm-up
if args.steady:
    # Steady state: what a traced forward costs once the trace has started
    # and the process's heap has settled. On a CPU the program's thread's
    # own time (other load on a shared machine counts less); on a GPU the
    # wall time, as the forward waits for the device.
    import gc
    import shutil
    import statistics
    import tempfile

    import ekka.trace
    from torch.profiler import profile
    clock = time.thread_time if args.device == "cpu" else time.perf_counter
    activities = profiler_activities()
    tmp = tempfile.mkdtemp(prefix="ekka-steady-")

    def timed(n=per_round):
        # What the previous measurement left to the garbage collector (the
        # profiler's events: millions of objects) is collected first, not
        # by a collection that this one's allocations would set off.
        gc.collect()
        start = clock()
        for _ in range(n):
            run()
        return 1000 * (clock() - start) / n

    times = {"plain": [], "meta": [], "profiler": []}

    def profiled():
        with profile(activities=activities, record_shapes=True):
            timed(2)
            times["profiler"].append(timed())

    # On a GPU the profiler's rounds come last: once Kineto has held CUPTI,
    # it keeps it, and a trace after it would go without its kernels.
    for _ in range(args.steady):
        times["plain"].append(timed())
        with ekka.trace.Trace(os.path.join(tmp, "meta"), capture="none", force=True):
            timed(2)
            times["meta"].append(timed())
        if args.device == "cpu":
            profiled()
    if args.device != "cpu":
        import sqlite3
        db = sqlite3.connect(f"file:{os.path.join(tmp, 'meta', 'trace.db')}?mode=ro", uri=True)
        print("steady_gpu_kernels:", db.execute(
            "SELECT value FROM meta WHERE key = 'gpu_kernels'").fetchone()[0])
        db.close()
        for _ in range(args.steady):
            profiled()
    shutil.rmtree(tmp, ignore_errors=True)
    print("steady " + " ".join(f"{k}={statistics.median(v):.3f}" for k, v in times.items()))
    sys.exit(0)
if args.profiler:
    from torch.profiler import profile
    with profile(activities=profiler_activities(), record_shapes=True):
        start = time.perf_counter()
        for _ in range(args.iters):
            run()
        elapsed = time.perf_counter() - start
else:
    start = time.perf_counter()
    for _ in range(args.iters):
        run()
    elapsed = time.perf_counter() - start
print(f"ms_per_forward={1000 * elapsed / args.iters:.3f}")
