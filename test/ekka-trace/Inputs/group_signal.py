"""`group_signal.py send EKKA-TRACE ARGS...` starts the command in a session
of its own and sends one SIGINT to its whole process group (as killpg,
`kill -INT -PGID`, an IDE's interrupt or `timeout -s INT` do);
`group_signal.py program` is a program that cleans up after one
KeyboardInterrupt and fails on a second."""
import os
import signal
import subprocess
import sys
import time

if sys.argv[1] == "send":
    child = subprocess.Popen(sys.argv[2:], start_new_session=True, stdout=subprocess.PIPE,
                             text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert child.stdout.readline().startswith("ready")
    time.sleep(0.5)
    os.killpg(child.pid, signal.SIGINT)
    print(child.stdout.read(), end="")
    print("exit code", child.wait())
else:
    import torch

    model = torch.nn.Linear(8, 8)
    print("ready", flush=True)
    try:
        with torch.no_grad():
            while True:
                model(torch.randn(2, 8))
                time.sleep(0.01)
    except KeyboardInterrupt:
        print("interrupted once", flush=True)
        try:
            time.sleep(2)
        except KeyboardInterrupt:
            print("interrupted twice", flush=True)
            sys.exit(7)
        sys.exit(0)
