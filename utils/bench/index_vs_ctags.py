#!/usr/bin/env python3
"""ekka-index against universal-ctags on one real tree, in one run.

Prints, for Python and for C/C++/CUDA, the files, lines, classes and kernels
each tool found and how long it took, and the time ratio; then the time of a
no-change re-index. A benchmark, not a test: nothing here asserts a timing.

  utils/bench/index_vs_ctags.py ~/src/flashinfer [--cxx-dirs csrc include] [--only python]
"""
import argparse
import json
import os
import re
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

PY_EXT = (".py",)
CXX_EXT = (".c", ".cc", ".cpp", ".cxx", ".c++", ".h", ".hh", ".hpp", ".hxx", ".h++", ".inl", ".cu", ".cuh")


def files_under(roots, exts):
    out = []
    for root in roots:
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if not x.startswith(".") and x != "__pycache__"]
            out += [os.path.join(d, n) for n in names if n.endswith(exts)]
    return out


def count_lines(paths):
    n = 0
    for p in paths:
        with open(p, "rb") as f:
            n += f.read().count(b"\n")
    return n


def grep_kernels(paths):
    """(path, line) of each __global__ outside // comments and #define lines, as grep sees them."""
    hits = []
    for p in paths:
        with open(p, "rb") as f:
            for i, line in enumerate(f.read().decode("utf-8", "replace").splitlines(), 1):
                s = line.strip()
                if "__global__" in s and not s.startswith(("//", "#", "*", "/*")):
                    hits.append((p, i, s))
    return hits


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd, **kw):
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed:\n{r.stderr}")
    return dt, r.stdout


def ctags(roots, language, extra):
    cmd = ["ctags", "-R", "--output-format=json", "--fields=+nK", "-f", "-",
           f"--languages={language}"] + extra + roots
    dt, out = timed(cmd)
    tags = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    tags = [t for t in tags if t.get("_type") == "tag"]
    return dt, tags


def ekka(tool, roots, index, languages):
    cmd = [tool, "build", *roots, "-o", index, f"--languages={languages}"]
    dt, out = timed(cmd)
    return dt, out.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree")
    ap.add_argument("--cxx-dirs", nargs="*", default=["csrc", "include"],
                    help="subdirectories holding the C++/CUDA sources (default: csrc include; "
                         "the whole tree if none exist)")
    ap.add_argument("--only", choices=["python", "cxx"],
                    help="measure one language alone (default: both, Python first)")
    ap.add_argument("--ekka-index", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                          "build", "bin", "ekka-index"))
    args = ap.parse_args()
    tree = os.path.abspath(args.tree)
    cxx_roots = [os.path.join(tree, d) for d in args.cxx_dirs if os.path.isdir(os.path.join(tree, d))] or [tree]
    tmp = tempfile.mkdtemp(prefix="ekka-bench-")
    print(f"tree: {tree}  cores: {os.cpu_count()}")

    try:
        if args.only != "cxx":
            bench_python(args, tree, tmp)
        if args.only != "python":
            bench_cxx(args, tree, cxx_roots, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_python(args, tree, tmp):
    py_files = files_under([tree], PY_EXT)
    idx = os.path.join(tmp, "py.idx")
    cpu = children_cpu()
    e_dt, e_sum = ekka(args.ekka_index, [tree], idx, "python")
    e_cpu = children_cpu() - cpu
    db = sqlite3.connect(idx)
    e_classes = db.execute("SELECT count(*) FROM definitions WHERE kind = 'class'").fetchone()[0]
    e_funcs = db.execute("SELECT count(*) FROM definitions WHERE kind IN ('function', 'method')").fetchone()[0]
    e_files = db.execute("SELECT count(*) FROM files WHERE status = 'indexed'").fetchone()[0]
    e_bases = db.execute("SELECT count(*) FROM definitions WHERE kind = 'class' AND bases != '[]'").fetchone()[0]
    db.close()
    r_dt, _ = ekka(args.ekka_index, [tree], idx, "python")
    c_dt, tags = ctags([tree], "Python", [])
    c_classes = sum(1 for t in tags if t.get("kind") == "class")
    c_funcs = sum(1 for t in tags if t.get("kind") in ("function", "member"))
    c_files = len({t["path"] for t in tags})
    print(f"\nPython: {len(py_files)} files, {count_lines(py_files)} lines")
    print(f"  {'':14}{'files':>8}{'classes':>9}{'functions':>11}{'spans':>7}{'bases':>7}{'seconds':>9}")
    print(f"  {'ekka-index':14}{e_files:>8}{e_classes:>9}{e_funcs:>11}{'yes':>7}{e_bases:>7}{e_dt:>9.2f}")
    print(f"  {'ctags':14}{c_files:>8}{c_classes:>9}{c_funcs:>11}{'no':>7}{'no':>7}{c_dt:>9.2f}")
    print(f"  time ratio ekka-index / ctags: {e_dt / c_dt:.2f}")
    print(f"  no-change re-index: {r_dt:.2f} s")
    # Wall time far above CPU time / cores says the machine was busy.
    print(f"  ekka-index CPU (user + system), cold: {e_cpu:.2f} s")


def bench_cxx(args, tree, cxx_roots, tmp):
    cxx_files = files_under(cxx_roots, CXX_EXT)
    idx = os.path.join(tmp, "cxx.idx")
    e_dt, e_sum = ekka(args.ekka_index, cxx_roots, idx, "cxx")
    db = sqlite3.connect(idx)
    e_classes = db.execute("SELECT count(*) FROM definitions WHERE kind IN ('class', 'struct', 'union')").fetchone()[0]
    e_kernels = db.execute("SELECT count(*) FROM definitions WHERE kind = 'kernel'").fetchone()[0]
    e_lexed = db.execute("SELECT count(*) FROM definitions WHERE kind = 'kernel' AND found_by = 'lexer'").fetchone()[0]
    e_lexed_classes = db.execute("SELECT count(*) FROM definitions WHERE kind IN ('class', 'struct', 'union') "
                                 "AND found_by = 'lexer'").fetchone()[0]
    e_files = db.execute("SELECT count(*) FROM files WHERE status = 'indexed'").fetchone()[0]
    spans = {}
    for path, a, b in db.execute("SELECT f.path, d.line_start, d.line_end FROM definitions d "
                                 "JOIN files f ON f.id = d.file_id WHERE d.kind = 'kernel'"):
        spans.setdefault(path, []).append((a, b))
    db.close()
    r_dt, _ = ekka(args.ekka_index, cxx_roots, idx, "cxx")
    c_dt, tags = ctags(cxx_roots, "C,C++", ["--map-C++=+.cu", "--map-C++=+.cuh"])
    c_classes = sum(1 for t in tags if t.get("kind") in ("class", "struct", "union"))
    # ctags also tags anonymous records (__anonN) and, in `struct __align__(16) S`,
    # the attribute macro as the class name; neither is a class one can look up.
    c_real = sum(1 for t in tags if t.get("kind") in ("class", "struct", "union")
                 and not t["name"].startswith("__anon")
                 and not re.fullmatch(r"__\w+__|alignas", t["name"]))
    c_kernels = sum(1 for t in tags if t.get("kind") == "function" and "__global__" in t.get("pattern", ""))
    c_files = len({t["path"] for t in tags})
    hits = grep_kernels(cxx_files)
    uncovered = [h for h in hits if not any(a <= h[1] <= b for a, b in spans.get(h[0], []))]
    print(f"\nC/C++/CUDA ({', '.join(os.path.relpath(r, tree) for r in cxx_roots)}): "
          f"{len(cxx_files)} files, {count_lines(cxx_files)} lines; "
          f"grep finds {len(hits)} __global__ lines (#define lines and // comments excluded)")
    print(f"  {'':14}{'files':>8}{'classes':>9}{'kernels':>9}{'seconds':>9}")
    print(f"  {'ekka-index':14}{e_files:>8}{e_classes:>9}{e_kernels:>9}{e_dt:>9.2f}"
          f"   (by the lexer, in code Clang did not see: {e_lexed} kernels, {e_lexed_classes} classes)")
    print(f"  {'ctags':14}{c_files:>8}{c_classes:>9}{c_kernels:>9}{c_dt:>9.2f}"
          f"   (kernels: function tags whose line has __global__)")
    print(f"  ctags classes without anonymous records and attribute names "
          f"(`struct __align__(16) S` tagged as `__align__`): {c_real}")
    print(f"  grep's __global__ lines inside no indexed kernel: {len(uncovered)}")
    for path, line, text in uncovered:
        print(f"    {os.path.relpath(path, tree)}:{line}: {text[:80]}")
    print(f"  time ratio ekka-index / ctags: {e_dt / c_dt:.1f}")
    print(f"  files/s: {e_files / e_dt:.1f}")
    print(f"  no-change re-index: {r_dt:.2f} s")


if __name__ == "__main__":
    main()
