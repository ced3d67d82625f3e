"""Two forward steps of one small model on the same input; with `bug`, its
activation is scaled (in both steps)."""
import sys

import torch

torch.manual_seed(0)


class Scaled(torch.nn.Tanh):
    def forward(self, x):
        return torch.tanh(x) * 1.5


model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16))
if sys.argv[1] == "bug":
    model[1] = Scaled()
x = torch.randn(4, 16)
with torch.no_grad():
    for _ in range(2):
        model(x)
