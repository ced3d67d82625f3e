#!/usr/bin/env python3
"""A real-vLLM diagnosis's wall time against a plain vLLM run, in one run.

On the tiny Llama of test/vllm (utils/vllm/tiny_model.py), serving one
prompt of 24 tokens and 4 greedy tokens with vLLM's CPU build: the plain
run (serve.py alone), then the user's two commands, timed each: ekka-trace
over the same run, and ekka-diagnose --reference-model (which runs and
traces HuggingFace's reference twice, bf16 and fp32, then compares). Each
is run --repeat times and the median printed, with its ratio to the plain
run. A benchmark, not a test: nothing asserts a timing.

  utils/bench/vllm_diagnosis.py [--build DIR] [--arch llama] [--repeat 3]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def timed(cmd):
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--arch", default="llama")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    with open(os.path.join(a.build, "vllm-python")) as f:
        vllm_python = f.read().strip()
    bin_dir = os.path.join(a.build, "bin")
    work = tempfile.mkdtemp(prefix="ekka-bench-vllm-")
    try:
        model = os.path.join(work, "model")
        subprocess.run([sys.executable, os.path.join(ROOT, "utils", "vllm", "tiny_model.py"),
                        a.arch, model], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        serve = [vllm_python, os.path.join(ROOT, "utils", "vllm", "serve.py"), model]
        trace = os.path.join(work, "vllm.trace")
        plain, traced, diagnosed = [], [], []
        for _ in range(a.repeat):
            plain.append(timed(serve))
            traced.append(timed([os.path.join(bin_dir, "ekka-trace"), "-o", trace, "--force",
                                 "--"] + serve))
            shutil.rmtree(trace + ".reference", ignore_errors=True)
            diagnosed.append(timed([os.path.join(bin_dir, "ekka-diagnose"), "--target", trace,
                                    "--reference-model", model]))
        base = statistics.median(plain)
        rows = [("plain vLLM run (serve.py)", base),
                ("ekka-trace over it", statistics.median(traced)),
                ("ekka-diagnose --reference-model (2 reference runs + diagnosis)",
                 statistics.median(diagnosed))]
        total = rows[1][1] + rows[2][1]
        print(f"real vLLM ({a.arch}, {os.cpu_count()} cores), median of {a.repeat}:")
        for name, t in rows:
            print(f"  {name:64s} {t:6.1f} s  {t / base:5.2f}x the plain run")
        print(f"  {'the whole diagnosis (trace + diagnose)':64s} {total:6.1f} s  "
              f"{total / base:5.2f}x the plain run")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
