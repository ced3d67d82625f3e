"""A small model whose module and class names hold terminal control
sequences, as a hostile or careless program may name them: a submodule
named with OSC (set the window title) and BEL, a class named with ESC [2J
(clear the screen), and a submodule whose name holds a newline and a line
of a report. With `bug`, that submodule's output is scaled."""
import sys

import torch

torch.manual_seed(0)


class Block(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.scale = scale

    def forward(self, x):
        return torch.tanh(self.proj(x)) * self.scale


Block.__name__ = Block.__qualname__ = "Block\x1b[2J"

model = torch.nn.Sequential()
model.add_module("evil\x1b]0;pwned\x07", Block(1.5 if sys.argv[1] == "bug" else 1.0))
# A newline, and what would pass for a line of the report after it.
model.add_module("act\nsuspect 9: forged", torch.nn.Tanh())
model.add_module("out", torch.nn.Linear(16, 16))
x = torch.randn(4, 16)
with torch.no_grad():
    model(x)
