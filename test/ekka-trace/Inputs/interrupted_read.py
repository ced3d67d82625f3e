"""A KeyboardInterrupt (or any other exception) raised by Python code that
the tracer runs while it reads a module's jagged nested tensor: the tracer
asks PyTorch for the tensor's lengths and values, which runs the jagged
tensor's __torch_dispatch__ in Python. Here that dispatch raises once, at
the Nth question asked after the first forward, to stand for a Ctrl-C that
arrives meanwhile.

    interrupted_read.py KeyboardInterrupt|RuntimeError N

The model is a root `M` whose child `lin` gets the values, and which
returns its jagged input as it is (the read at its exit). Three forwards;
the second is the one armed. The program catches a KeyboardInterrupt and
goes on, as an interactive loop would."""
import builtins
import sys

import torch
from torch.nested._internal.nested_tensor import NestedTensor

raised, countdown = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
dispatch = NestedTensor.__torch_dispatch__.__func__
state = {"armed": False, "asked": 0}


@classmethod
def interrupting(cls, func, types, args=(), kwargs=None):
    if state["armed"] and "_nested_get_lengths" in str(func):
        state["asked"] += 1
        if state["asked"] == countdown:
            state["armed"] = False
            raise getattr(builtins, raised)("raised in the jagged tensor's dispatch")
    return dispatch(cls, func, types, args, kwargs)


NestedTensor.__torch_dispatch__ = interrupting


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        self.lin(x.values())
        return x


m = M()
x = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], layout=torch.jagged)
for step in (1, 2, 3):
    state["armed"] = step == 2
    try:
        m(x)
        print(f"step {step}: ran")
    except KeyboardInterrupt:
        print(f"step {step}: KeyboardInterrupt reached the program")
print("questions asked in step 2:", state["asked"])
