"""A traced program that ends badly, and a check of what its trace kept.

  faults.py run HOW [STEPS]  runs STEPS (5) forward passes of a small model,
                             waits for the trace to write them (3 s, longer
                             than the writer keeps a shard open), then ends
                             HOW in the middle of one more: kill (SIGKILL),
                             segv (a read of address 0), exit (os._exit(4)),
                             not at all (none), or after 8 MiB more of
                             outputs, exiting 5 (big: for a full disk), or
                             after 3,000 passes more, exiting 5 (rows: for
                             a full disk under a trace of no tensors);
  faults.py check DIR STEPS  reads DIR with sqlite3 and safetensors, not
                             Ekka: says whether steps 1..STEPS are whole
                             (every module call, each one's output captured
                             in a shard, its bytes summing to the row's sum).
"""
import ctypes
import os
import signal
import sqlite3
import sys
import time


def run(how, steps):
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64))
    x = torch.randn(4, 64)
    for step in range(steps):
        model(x)
        print("step", step + 1, "ran", flush=True)
    time.sleep(3)

    def end(module, args, output):
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "segv":
            ctypes.string_at(0)
        elif how == "exit":
            os._exit(4)

    if how == "rows":
        for _ in range(3000):
            model(x)
        print("ended", flush=True)
        sys.exit(5)
    if how == "big":
        wide = torch.nn.Linear(512, 512)
        for _ in range(8):
            wide(torch.ones(512, 512))
        print("ended", flush=True)
        sys.exit(5)
    model[1].register_forward_hook(end)
    model(x)
    print("ended", flush=True)


def check(trace, steps):
    from safetensors import safe_open
    db = sqlite3.connect("file:" + os.path.join(trace, "trace.db") + "?mode=ro", uri=True)
    whole = True
    for step in range(1, steps + 1):
        calls = db.execute("SELECT id FROM module_calls WHERE step = ?", (step,)).fetchall()
        outputs = db.execute(
            "SELECT t.shard, t.key, t.sum FROM tensors t JOIN module_calls m ON "
            "t.owner = 'module_call' AND t.owner_id = m.id WHERE m.step = ? AND "
            "t.role = 'output'", (step,)).fetchall()
        good = 0
        for shard, key, total in outputs:
            if not shard:
                continue
            with safe_open(os.path.join(trace, shard), "pt") as f:
                if abs(float(f.get_tensor(key).double().sum()) - total) <= 1e-6 * (1 + abs(total)):
                    good += 1
        print(f"step {step}: {len(calls)} calls, {good} of {len(outputs)} outputs captured and read")
        whole &= len(calls) == 4 and good == len(outputs) == 4
    print("whole" if whole else "NOT whole")


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 5)
    else:
        check(sys.argv[2], int(sys.argv[3]))
