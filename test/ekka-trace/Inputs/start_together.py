"""Four forked children run their first module at the same moment (the
parent runs none): each traces, one into DIR, the others into
DIR/process-PID/."""
import multiprocessing
import time

import torch


def child(go):
    model = torch.nn.Linear(4, 4)
    go.wait()
    with torch.no_grad():
        for _ in range(3):
            model(torch.ones(1, 4))


if __name__ == "__main__":
    context = multiprocessing.get_context("fork")
    go = context.Event()
    children = [context.Process(target=child, args=(go,)) for _ in range(4)]
    for each in children:
        each.start()
    time.sleep(1.0)
    go.set()
    for each in children:
        each.join()
    print("exit codes", [each.exitcode for each in children])
