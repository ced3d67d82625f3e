"""Forks at the moment a trace starts: in each of K fresh processes that
have not traced yet, a thread's first module call starts the trace while
the main thread, which has run no module, forks; the child then runs a
module (and starts a trace of its own). A child that has not ended after
10 s is a hang: said, killed, and counted. Prints the count."""
import os
import sys
import threading
import time

import torch

K = int(sys.argv[1])


def one_try():
    layer, x = torch.nn.Linear(16, 16), torch.ones(2, 16)
    # The child's ops, run once before (without a module call: no trace):
    # forking while another thread makes an op's first call leaves that
    # op's static guard taken in the child, untraced too.
    torch.tanh(torch.relu(x))
    started = []

    def module_calls():
        started.append(True)
        for _ in range(20):
            layer(x)  # the first starts the trace

    thread = threading.Thread(target=module_calls)
    thread.start()
    while not started:  # fork as soon as that thread has the GIL let go
        pass
    pid = os.fork()
    if pid == 0:
        torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh())(x)
        os._exit(0)
    for _ in range(1000):
        if os.waitpid(pid, os.WNOHANG)[0]:
            thread.join()
            os._exit(0)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    thread.join()
    os._exit(3)


hangs = 0
for _ in range(K):
    pid = os.fork()
    if pid == 0:
        one_try()
    hangs += os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 3
print(f"{hangs} hangs in {K} tries")
