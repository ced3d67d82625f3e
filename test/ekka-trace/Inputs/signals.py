"""Programs that SIGTERM ends, run under ekka-trace. Modes:
  self      runs a model, then SIGTERMs itself
  parent    runs a model, then SIGTERMs its parent (ekka-trace), which
            passes it on
  theirs    runs a model, then sets a SIGTERM handler of its own (exit 7)
  before    sets that handler before it runs any model
  ignored   ignores SIGTERM, runs a model, SIGTERMs itself, ends on its own
  pool      a multiprocessing Pool (fork) whose `with` ends its workers
            with SIGTERM (Pool.terminate) once they have run the model
  child     forks a child that runs no model and SIGTERMs it: the child
            ends by the signal, as untraced
  threads   runs a model, then says which signals ekka's threads block
  interrupt runs a model, then sends SIGINT to its parent (ekka-trace),
            which passes it on: KeyboardInterrupt, exit 5
  inherited says whether SIGINT is ignored, as a background job's is
  stopping  captures tens of MB, and SIGTERMs itself once its main thread
            is in the runtime's stop (at exit), which closes the writer
  waiting   records ops faster than the writer takes them; a watcher
            process SIGTERMs it once its main thread sleeps: inside the
            runtime, waiting for room in the writer's queue, with its
            buffer's lock held. Counts the adds it ran in the file argv[2]
  ran       says whether the adds the file argv[3] counts are all in the
            trace argv[2]
  twice     as waiting, and a second SIGTERM 1.5 s after the first, while
            the trace is still being written without the first's handler
"""
import multiprocessing
import os
import signal
import sys
import threading
import time

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())


def work(i):
    return model(torch.full((1, 4), float(i))).sum().item()


def wait_for_the_end():
    time.sleep(60)
    print("not ended")
    sys.exit(1)


mode = sys.argv[1]
if mode == "before":
    signal.signal(signal.SIGTERM, lambda *args: sys.exit(7))
if mode == "ignored":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
model(torch.ones(2, 4))
if mode == "theirs":
    signal.signal(signal.SIGTERM, lambda *args: sys.exit(7))
if mode in ("self", "theirs", "before"):
    os.kill(os.getpid(), signal.SIGTERM)
    print("ran on", flush=True)  # untraced, the process has ended (self)
    wait_for_the_end()
elif mode == "parent":
    os.kill(os.getppid(), signal.SIGTERM)
    wait_for_the_end()
elif mode == "ignored":
    os.kill(os.getpid(), signal.SIGTERM)
    print("ignored")
elif mode == "pool":
    with multiprocessing.get_context("fork").Pool(2) as pool:
        print(pool.map(work, range(4)))
elif mode == "interrupt":
    try:
        os.kill(os.getppid(), signal.SIGINT)
        wait_for_the_end()
    except KeyboardInterrupt:
        print("interrupted")
        sys.exit(5)
elif mode == "stopping":
    big = torch.nn.Linear(1024, 1024)
    with torch.no_grad():
        for _ in range(40):
            big(torch.ones(256, 1024))
    main = threading.main_thread().ident

    def when_stopping():
        # The main thread inside torch.ops.ekka.stop, called from the shim's
        # _stop: this thread runs because the op let the GIL go.
        while True:
            frame = sys._current_frames().get(main)
            names = []
            while frame is not None and len(names) < 3:
                names.append(frame.f_code.co_name)
                frame = frame.f_back
            if names[1:] == ["_unseen", "_stop"]:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.0002)

    threading.Thread(target=when_stopping, daemon=True).start()
elif mode in ("waiting", "twice"):
    # The main thread is the program's only Python thread: where it sleeps
    # in a loop of ops, it waits for the tracer's writer.
    watcher = """
import os, signal, sys, time
pid = int(sys.argv[1])
deadline, asleep = time.monotonic() + 60, 0
while time.monotonic() < deadline and asleep < 3:  # a wait, not a moment's
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        asleep = asleep + 1 if f.read().rsplit(")", 1)[1].split()[0] == "S" else 0
    time.sleep(0.0005)
os.kill(pid, signal.SIGTERM)
if sys.argv[2] == "twice":
    time.sleep(1.5)
    os.kill(pid, signal.SIGTERM)
"""
    import ctypes
    import mmap
    import subprocess
    # How many adds ran, in a file that outlives the process: each op that
    # ran to its end before the signal ended the process is in the trace.
    with open(sys.argv[2], "w+b") as f:
        f.truncate(8)
        ran = ctypes.c_int64.from_buffer(mmap.mmap(f.fileno(), 8))
    x = torch.ones(2, 4)
    with torch.no_grad():
        model(x)
        subprocess.Popen([sys.executable, "-I", "-c", watcher, str(os.getpid()), mode])
        while True:
            for _ in range(100):
                x = torch.add(x, 1e-6)
                ran.value += 1
            model(x)
elif mode == "ran":
    # The adds that ran to their end (argv[3], as waiting counts them) all
    # have their end in the trace (argv[2]): their output. One more may
    # (the add in flight when the process ended, its end recorded).
    import sqlite3
    with open(sys.argv[3], "rb") as f:
        ran = int.from_bytes(f.read(8), "little")
    db = sqlite3.connect(f"file:{sys.argv[2]}/trace.db?mode=ro", uri=True)
    (ended,) = db.execute(
        "SELECT count(*) FROM ops WHERE name = 'aten::add' AND id IN "
        "(SELECT owner_id FROM tensors WHERE owner = 'op' AND role = 'output')").fetchone()
    print("adds ran:", "all ended in the trace" if ran <= ended <= ran + 1 else
          f"{ran}, of which {ended} ended in the trace", f"({ran > 0})")
elif mode == "inherited":
    print("SIGINT ignored:", signal.getsignal(signal.SIGINT) == signal.SIG_IGN)
elif mode == "threads":
    for task in sorted(os.listdir("/proc/self/task")):
        with open(f"/proc/self/task/{task}/comm") as f:
            name = f.read().strip()
        if name.startswith("ekka-"):
            with open(f"/proc/self/task/{task}/status") as f:
                blocked = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
            print(name, "blocks", *(s.name for s in (signal.SIGTERM, signal.SIGINT, signal.SIGSEGV)
                                   if blocked >> (s - 1) & 1))
elif mode == "child":
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    print("child ended by signal", os.WTERMSIG(status) if os.WIFSIGNALED(status) else None)
