"""Runs a module, forks a child that runs one too, then runs another."""
import os

import torch

layer = torch.nn.Linear(4, 4)
layer(torch.ones(1, 4))
pid = os.fork()
if pid == 0:
    torch.nn.ReLU()(layer(torch.ones(1, 4)))
    os._exit(0)
os.waitpid(pid, 0)
layer(torch.ones(1, 4))
print("parent done")
