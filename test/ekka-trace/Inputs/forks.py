"""Runs a module, forks a child (multiprocessing's fork start method) that
runs modules too, then runs another."""
import multiprocessing

import torch

layer = torch.nn.Linear(4, 4)


def child():
    torch.nn.ReLU()(layer(torch.ones(1, 4)))


if __name__ == "__main__":
    layer(torch.ones(1, 4))
    p = multiprocessing.get_context("fork").Process(target=child)
    p.start()
    p.join()
    layer(torch.ones(1, 4))
    print("parent done", p.exitcode)
