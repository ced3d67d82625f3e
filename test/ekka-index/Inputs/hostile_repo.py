"""Builds the hostile repositories of hostile-repo.test in the test's own
directory, so that nothing large or odd is committed.

  hostile_repo.py make DIR          one of each hostile input, beside good files
  hostile_repo.py vanish DIR DB -- CMD...
                                    a tree of small files, indexed by CMD while
                                    this script deletes files and directories
                                    and puts FIFOs in place of others; checks
                                    that CMD exits 0 and that its counts agree
                                    with the index it wrote
"""
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time

BIG = 50 * 1024 * 1024


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def big_file(path, line):
    """A generated source of BIG bytes, as a code generator writes one."""
    chunk = line * (1024 * 1024 // len(line) + 1)
    with open(path, "wb") as f:
        written = 0
        while written < BIG:
            piece = chunk[: BIG - written]
            f.write(piece)
            written += len(piece)


def long_path(root, name_len=250, depth=20):
    """A file whose path is longer than PATH_MAX (4096), made through
    directory descriptors: no single call names it whole."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for i in range(depth):
        name = ("%02d" % i) * (name_len // 2)
        os.mkdir(name, dir_fd=fd)
        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    leaf = os.open("far.py", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(leaf, b"class Far:\n    pass\n")
    os.close(leaf)
    os.close(fd)


def remove(path):
    """rm -rf, through the directories an earlier run made unreadable."""
    if not os.path.lexists(path):
        return
    for dirpath, dirnames, _ in os.walk(path):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p) and len(p) < 4000:
                os.chmod(p, 0o755)
    shutil.rmtree(path)


def make(root):
    remove(root)
    os.makedirs(root)
    j = lambda *p: os.path.join(root, *p)
    write(j("good.py"), b"class Good:\n    pass\n")
    write(j("good.cpp"), b"int good_function() { return 1; }\n")

    # Binary files under source names.
    blob = bytes(range(256)) * 16
    for name in ("bin.py", "bin.cu", "bin.cpp"):
        write(j("binary", name), blob)

    # 50 MB generated sources.
    os.makedirs(j("generated"))
    big_file(j("generated", "big.py"), b"TABLE_ENTRY = [1, 2, 3, 4, 5, 6, 7, 8]\n")
    big_file(j("generated", "big.cpp"), b"static const int table_entry[] = {1, 2, 3, 4, 5, 6};\n")
    # A unity build's source, including the big one.
    write(j("generated", "unity.cpp"), b'#include "big.cpp"\nint after_big() { return 3; }\n')
    # Seven lines of templates that instantiate two of themselves a level:
    # 2^40 classes asked for, which would take Clang days and terabytes.
    write(j("generated", "bomb.cpp"),
          b"template <int N, int M> struct F {\n  F<N - 1, 2 * M> a;\n"
          b"  F<N - 1, 2 * M + 1> b;\n};\ntemplate <int M> struct F<0, M> { int v; };\n"
          b"F<40, 0> x;\nint after_bomb() { return 1; }\n")
    # 22 KB whose parse would hold 320 MB: a broken `def …:` and a broken
    # line indented by 55 tabs, 200 times, cost tree-sitter's error
    # recovery 1.6 MB each (a fuzzer's find).
    write(j("generated", "recovery.py"),
          (b"$ef f(a, b):\n  " + b"\t" * 55 + b"  torch.ops._C.rms_norm(out, s x, weight,\n") * 200)

    # Symlink loops: a file link to itself, two links to each other, a
    # directory link to its parent and one to the root.
    os.makedirs(j("loops", "a", "b"))
    os.symlink("self.py", j("loops", "self.py"))
    os.symlink("mutual2.py", j("loops", "mutual1.py"))
    os.symlink("mutual1.py", j("loops", "mutual2.py"))
    os.symlink("..", j("loops", "a", "parent"))
    os.symlink("../../..", j("loops", "a", "b", "root"))

    # Non-UTF-8 names (a file, a directory) and contents.
    write(os.path.join(os.fsencode(root), b"names", b"caf\xe9.py"), b"class Latin1Name:\n    pass\n")
    write(os.path.join(os.fsencode(root), b"names", b"\xff\xfe", b"mod.py"), b"class InBadDir:\n    pass\n")
    write(j("names", "latin1.py"), "class Latin1:\n    name = 'caf\xe9'\n".encode("latin-1"))
    write(j("names", "latin1.cpp"), "// caf\xe9\nint latin1() { return 0; }\n".encode("latin-1"))

    # Names with control characters, which valid UTF-8 allows: ESC starting
    # a terminal's control sequence (colour, clear the screen), BEL, a
    # newline. Indexed, and printed escaped.
    write(os.path.join(os.fsencode(root), b"controls", b"a\x1b[31mred.py"), b"class Red:\n    pass\n")
    write(os.path.join(os.fsencode(root), b"controls", b"new\nline.py"), b"class NewLine:\n    pass\n")
    write(os.path.join(os.fsencode(root), b"controls", b"bin\x07\x1b[2J.py"), blob)

    # 200 directories deep, and deeper than PATH_MAX.
    deep = j("deep", *(["d"] * 200))
    write(os.path.join(deep, "bottom.py"), b"class Bottom:\n    pass\n")
    os.makedirs(j("toolong"))
    long_path(j("toolong"))

    # Things that are not files under source names, and what cannot be read.
    os.makedirs(j("special"))
    os.mkfifo(j("special", "x.py"))
    os.mkfifo(j("special", "fifo.h"))
    write(j("special", "includes_fifo.cpp"), b'#include "fifo.h"\nint after_fifo() { return 2; }\n')
    os.symlink("/dev/zero", j("special", "z.py"))
    os.symlink("missing.py", j("special", "dangling.py"))
    write(j("special", "foo.py", "inside.py"), b"class InsideFooPy:\n    pass\n")
    write(j("special", "locked.py"), b"class Locked:\n    pass\n")
    os.chmod(j("special", "locked.py"), 0)
    write(j("special", "lockeddir", "hidden.py"), b"class Hidden:\n    pass\n")
    os.chmod(j("special", "lockeddir"), 0)


def make_tree(root, dirs=40, files=50):
    # All of a size: the index reads them in the order of their paths.
    for d in range(dirs):
        for f in range(files):
            write(os.path.join(root, "d%02d" % d, "m%02d.py" % f),
                  b"class C%02d_%02d:\n    def method(self):\n        return 1\n" % (d, f))


def vanish(root, db, cmd):
    """Runs cmd while files under root disappear, from the last path back
    (so that most go after the walk listed them, before they are read):
    in each directory every fifth file deleted, every seventh put back as a
    FIFO, and every fourth directory removed whole."""
    remove(root)
    make_tree(root)
    victims = []
    for n, d in enumerate(sorted(os.listdir(root), reverse=True)):
        dpath = os.path.join(root, d)
        if n % 4 == 0:
            victims.append(("rmdir", dpath))
            continue
        for i, f in enumerate(sorted(os.listdir(dpath), reverse=True)):
            if i % 5 == 0 or i % 7 == 0:
                victims.append(("delete" if i % 5 == 0 else "fifo", os.path.join(dpath, f)))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def attack():
        for how, path in victims:
            if proc.poll() is not None:
                return
            try:
                if how == "rmdir":
                    for f in os.listdir(path):
                        os.unlink(os.path.join(path, f))
                    os.rmdir(path)
                else:
                    os.unlink(path)
                    if how == "fifo":
                        os.mkfifo(path)
            except OSError:
                pass
            time.sleep(0.0005)

    attacker = threading.Thread(target=attack)
    attacker.start()
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        sys.exit("vanish: %s hung" % cmd[0])
    attacker.join()
    text = out.decode("utf-8", "replace")
    sys.stdout.write(text)
    if proc.returncode != 0:
        sys.exit("vanish: %s exited with %d" % (cmd[0], proc.returncode))
    m = re.search(r"indexed (\d+) files? \((\d+) parsed, (\d+) unchanged, 0 removed\), "
                  r"(\d+) definitions?, (\d+) skipped", text)
    if not m:
        sys.exit("vanish: no summary line")
    files, parsed, unchanged, definitions, skipped = map(int, m.groups())
    con = sqlite3.connect(db)
    rows = con.execute("SELECT count(*), sum(status = 'indexed') FROM files").fetchone()
    defs = con.execute("SELECT count(*) FROM definitions").fetchone()[0]
    # Every file the walk found is in the index, parsed or skipped with its
    # reason; the skips the summary counts include those of the walk.
    problems = []
    if rows[0] != files or (rows[1] or 0) != parsed or unchanged != 0:
        problems.append("index rows %s for %d files, %d parsed" % (rows, files, parsed))
    if skipped < files - parsed:
        problems.append("%d skipped < %d files not parsed" % (skipped, files - parsed))
    if defs != definitions:
        problems.append("%d definitions in the index, %d reported" % (defs, definitions))
    if problems:
        sys.exit("vanish: counts disagree: " + "; ".join(problems))
    print("vanish: counts agree (%d files, %d parsed, %d skipped)"
          % (files, parsed, skipped))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "vanish" and sys.argv[4] == "--":
        vanish(sys.argv[2], sys.argv[3], sys.argv[5:])
    else:
        sys.exit(__doc__)
