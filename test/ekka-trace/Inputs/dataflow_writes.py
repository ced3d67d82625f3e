"""A module output that the program writes in place before the next module
takes it, in ways no version counter of that output sees: through `.data`
or `detach()`, and on another thread under torch.inference_mode, or given
other memory (`h.data = ...`, no op on h at all). Usage:
dataflow_writes.py HOW MODE, HOW one of data, detach, thread, assign, MODE
one of grad, nograd, inference. b's input is then 10 times a's output."""
import sys
import threading

import torch

how, mode = sys.argv[1], sys.argv[2]
context = {"grad": torch.enable_grad, "nograd": torch.no_grad,
           "inference": torch.inference_mode}[mode]


def scale(h):
    if how == "data":
        h.data.mul_(10)
    elif how == "detach":
        h.detach().mul_(10)
    elif how == "assign":
        h.data = h.detach() * 10
    elif how == "thread":
        def helper():
            with context():
                h.mul_(10)
        t = threading.Thread(target=helper)
        t.start()
        t.join()


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        scale(h)
        return self.b(h)


torch.manual_seed(0)
with context():
    Model()(torch.randn(2, 4))
print("ran", how, mode)
