"""The silent-error zoo's runner (utils/zoo/zoo is its entry point).

  zoo list                     the cases, with their source and ground truth
  zoo run CASE [--work DIR]    trace the reference (bf16 and fp32) and the
                               engine with the case's bug, run ekka-diagnose,
                               and show its report next to the ground truth
  zoo bench [--json FILE]      every case; a table and the totals: top-1,
                               top-3 and kernel-level accuracy, false alarms
                               on clean pairs, seconds per case
  zoo trace CASE --work DIR    only the tracing of `run` (on a machine with a
                               GPU, say, with --device cuda)
  zoo diagnose CASE --work DIR only the diagnosis of `run`, over traces that
                               `zoo trace` left in DIR (brought from there)

`--device cuda` (run, bench, trace) runs all three sides on the GPU: the
engine with its kernels' CUDA versions, traced with CUPTI. The three sides
run in one Python process, each traced into its own trace
(`ekka.trace.Trace`); `--separate` runs them as three ekka-trace runs.

Ekka sees what a user's run would give it: three traces and the code index
of the engine (utils/zoo); the ground truth is read here only, to score.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from cases import CASES, BY_ID, EXTRA_CASES  # noqa: E402

BUILD = os.environ.get("EKKA_BUILD_DIR", os.path.join(ROOT, "build"))
BIN = os.path.join(BUILD, "bin")


def die(message):
    """One clear line (or the failing step's output) and exit code 2."""
    print(message, file=sys.stderr)
    sys.exit(2)


def tool(name):
    return os.path.join(BIN, name)


def sh(cmd, what, env=None):
    """Runs a step; its output is kept for the error message."""
    try:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env)
    except OSError as e:
        die(f"zoo: {what} failed: cannot run {cmd[0]}: {e.strerror} (run utils/build)")
    if out.returncode != 0:
        die(f"zoo: {what} failed (exit code {out.returncode}):\n{out.stdout[-3000:]}")
    return out.stdout


def code_index():
    """The index of the engine's code — its Python and its C++ kernels, not
    the cases or this runner, which hold the ground truth — built once and
    kept up to date incrementally."""
    index = os.path.join(BUILD, "zoo-engine.index")
    sh([tool("ekka-index"), "build", "-o", index, os.path.join(HERE, "zoo_engine"),
        os.path.join(HERE, "kernels")], "indexing the engine")
    return index


MARKER = ".ekka-zoo-work"


def fresh_workdir(work):
    """Empties a work directory the zoo made before (it holds the marker),
    or makes a new one; refuses to touch anything else."""
    if os.path.exists(work):
        if os.listdir(work) and not os.path.exists(os.path.join(work, MARKER)):
            die(f"zoo: '{work}' is not empty and is not a zoo work directory; "
                "give --work a new or empty directory")
        shutil.rmtree(work)
    os.makedirs(work)
    open(os.path.join(work, MARKER), "w").close()


def trace_case(case, work, device="cpu", separate=False):
    """Traces the engine with the case's bug and the reference (bf16, fp32)
    into `work` (made fresh): in one Python process, each side in its own
    trace (ekka.trace.Trace), or with `separate` as a user would, three
    ekka-trace runs."""
    fresh_workdir(work)
    py = sys.executable
    side = os.path.join(HERE, "run_side.py")
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""),
               EKKA_PROGRESS="0")
    where = ["--device", device]
    if not separate:
        env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env["PYTHONPATH"]
        env.setdefault("EKKA_RUNTIME_LIB", os.path.join(BUILD, "lib", "libekka_runtime.so"))
        sh([py, side, "all", case.id, work] + where, "tracing the engine and the reference", env)
        return
    trace = [tool("ekka-trace"), "--force"]
    sh(trace + ["-o", f"{work}/target", "--capture-ops", "^zoo::", "--capture-op-inputs", "--",
                py, side, "target", case.id, work] + where, "tracing the engine", env)
    for dtype in ("bf16", "fp32"):
        stats = ["--op-stats"] if dtype == "bf16" else []
        sh(trace + ["-o", f"{work}/reference-{dtype}"] + stats + ["--", py, side, "reference",
                    case.id, work, dtype] + where, f"tracing the reference ({dtype})", env)


def diagnose_case(work, index, text=True):
    """Runs ekka-diagnose over the traces in `work`; returns its JSON report.
    With `text`, also the diagnosis as ekka-diagnose prints it."""
    for side in ("target", "reference-bf16", "reference-fp32"):
        if not any(os.path.isfile(os.path.join(work, side, *where, "trace.db"))
                   for where in ((), ("rank-0",))):
            die(f"zoo: no trace '{side}' in '{work}' (zoo trace CASE --work DIR makes them)")
    # The engine decodes greedily, as a user diagnosing it would know.
    cmd = [tool("ekka-diagnose"), "--target", f"{work}/target",
           "--reference", f"{work}/reference-bf16", "--reference-fp32", f"{work}/reference-fp32",
           "--index", index, "--greedy"]
    shown = (subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
             if text else "")
    js = subprocess.run(cmd + ["--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if js.returncode not in (0, 1):
        die(f"zoo: ekka-diagnose failed (exit code {js.returncode}):\n{js.stderr}")
    report = json.loads(js.stdout)
    report["_text"] = shown
    report["_exit"] = js.returncode
    return report


def run_case(case, work, index, text=True, device="cpu", separate=False):
    """Traces and diagnoses one case; returns (report dict, seconds)."""
    start = time.time()
    trace_case(case, work, device, separate)
    return diagnose_case(work, index, text), time.time() - start


def score(case, report, seconds):
    suspects = [s.get("component", "") for s in report.get("suspects", [])]
    # A divergence of the sampler, after every module: no suspect names it.
    if (not suspects and report.get("verdict") == "divergence"
            and (report.get("sampling") or {}).get("departures")):
        suspects = ["(sampler)"]
    divergence = report.get("verdict") != "no-divergence"
    row = {"id": case.id, "clean": case.clean, "expected": list(case.accepted),
           "suspects": suspects[:3], "top1": None, "top3": None, "kernel": None,
           "false_alarm": None, "seconds": round(seconds, 2), "verdict": report.get("verdict")}
    if case.clean:
        row["false_alarm"] = divergence
    else:
        row["top1"] = bool(suspects) and suspects[0] in case.accepted
        row["top3"] = any(s in case.accepted for s in suspects[:3])
        if case.kernel:
            first = (report.get("suspects") or [{}])[0]
            named = json.dumps(first.get("kernel") or "")
            row["kernel"] = row["top1"] and case.kernel in named
    return row


def cmd_list(args):
    def line(c):
        truth = "no divergence" if c.clean else ", ".join(c.accepted)
        kernel = f" (kernel {c.kernel})" if c.kernel else ""
        print(f"{c.id:22} {c.source:26} {c.model:20} -> {truth}{kernel}")
    for c in CASES:
        line(c)
    print("extra cases (not in ZOO.md, not in the benchmark's totals):")
    for c in EXTRA_CASES:
        line(c)


def find_case(name):
    case = BY_ID.get(name)
    if not case:
        die(f"zoo: no case '{name}' (zoo list shows them)")
    return case


def show(case, report, seconds, work):
    """The report next to the ground truth; the exit code of `run`."""
    print(report["_text"], end="")
    row = score(case, report, seconds)
    print("---")
    if case.clean:
        print(f"ground truth: clean pair, no divergence expected; "
              f"{'FALSE ALARM' if row['false_alarm'] else 'ok'}")
    else:
        print(f"ground truth: {' or '.join(case.accepted)}"
              + (f", kernel {case.kernel}" if case.kernel else "") + f" ({case.symptom})")
        print(f"top-1 {'hit' if row['top1'] else 'MISS'}, top-3 {'hit' if row['top3'] else 'MISS'}"
              + (f", kernel {'hit' if row['kernel'] else 'MISS'}" if case.kernel else ""))
    print(f"traces in {work}; {seconds:.1f} s")
    return 0 if (row["false_alarm"] is False or row["top1"]) else 1


def announce(case):
    print(f"zoo: {case.id} ({case.source}): {case.model}, bug: {', '.join(case.bugs) or 'none'}",
          file=sys.stderr)


def cmd_run(args):
    case = find_case(args.case)
    work = args.work or os.path.join(tempfile.gettempdir(), f"ekka-zoo-{case.id}")
    announce(case)
    report, seconds = run_case(case, work, code_index(), device=args.device,
                               separate=args.separate)
    return show(case, report, seconds, work)


def cmd_trace(args):
    case = find_case(args.case)
    announce(case)
    start = time.time()
    trace_case(case, args.work, args.device, args.separate)
    print(f"zoo: traces of {case.id} in {args.work} ({time.time() - start:.1f} s)", file=sys.stderr)
    return 0


def cmd_diagnose(args):
    case = find_case(args.case)
    start = time.time()
    report = diagnose_case(args.work, code_index())
    return show(case, report, time.time() - start, args.work)


def cmd_bench(args):
    index = code_index()
    rows = []
    work_root = tempfile.mkdtemp(prefix="ekka-zoo-bench-")
    for i, case in enumerate(CASES):
        print(f"zoo: [{i + 1}/{len(CASES)}] {case.id}", file=sys.stderr)
        report, seconds = run_case(case, os.path.join(work_root, case.id), index, text=False,
                                   device=args.device, separate=args.separate)
        rows.append(score(case, report, seconds))
    shutil.rmtree(work_root, ignore_errors=True)
    mark = {True: "yes", False: "no", None: "-"}
    print(f"{'case':22} {'expected':34} {'Ekka top 3':60} top1 top3 kernel  s")
    for r in rows:
        expected = "(clean)" if r["clean"] else r["expected"][0]
        got = ", ".join(r["suspects"]) or f"({r['verdict']})"
        t1 = ("FALSE ALARM" if r["false_alarm"] else "ok") if r["clean"] else mark[r["top1"]]
        print(f"{r['id']:22} {expected:34} {got[:60]:60} {t1:4} {mark[r['top3']]:4} "
              f"{mark[r['kernel']]:6} {r['seconds']:.1f}")
    bugs = [r for r in rows if not r["clean"]]
    kernels = [r for r in bugs if r["kernel"] is not None]
    clean = [r for r in rows if r["clean"]]
    totals = {
        "cases": len(bugs), "clean_pairs": len(clean),
        "top1": sum(r["top1"] for r in bugs) / max(len(bugs), 1),
        "top3": sum(r["top3"] for r in bugs) / max(len(bugs), 1),
        "kernel": sum(r["kernel"] for r in kernels) / max(len(kernels), 1) if kernels else None,
        "false_alarms": sum(r["false_alarm"] for r in clean),
        "seconds_per_case": sum(r["seconds"] for r in rows) / max(len(rows), 1),
    }
    print(f"top-1 {totals['top1']:.0%} ({sum(r['top1'] for r in bugs)}/{len(bugs)}), "
          f"top-3 {totals['top3']:.0%}, kernel-level "
          + (f"{totals['kernel']:.0%} ({sum(r['kernel'] for r in kernels)}/{len(kernels)})"
             if kernels else "-")
          + f", false alarms {totals['false_alarms']}/{len(clean)}, "
          f"{totals['seconds_per_case']:.1f} s per case")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cases": rows, "totals": totals}, f, indent=1)
    return 0


def main():
    ap = argparse.ArgumentParser(prog="zoo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the cases and their ground truth")
    run = sub.add_parser("run", help="trace and diagnose one case")
    run.add_argument("case")
    run.add_argument("--work", help="where the traces go (default: a temporary folder per case)")
    bench = sub.add_parser("bench", help="every case, with accuracy and time")
    bench.add_argument("--json", help="also write the results as JSON to this file")
    trace = sub.add_parser("trace", help="only trace one case (e.g. on a GPU machine)")
    trace.add_argument("case")
    trace.add_argument("--work", required=True, help="where the traces go")
    diagnose = sub.add_parser("diagnose", help="only diagnose the traces `zoo trace` made")
    diagnose.add_argument("case")
    diagnose.add_argument("--work", required=True, help="where the traces are")
    for p in (run, bench, trace):
        p.add_argument("--device", default="cpu",
                       help="where all three sides run: cpu (default) or cuda")
        p.add_argument("--separate", action="store_true",
                       help="trace the three sides as three ekka-trace runs, as a user would "
                            "(default: one Python process writing three traces)")
    args = ap.parse_args()
    return {"list": cmd_list, "run": cmd_run, "bench": cmd_bench, "trace": cmd_trace,
            "diagnose": cmd_diagnose}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
