"""Three forward steps of one small model on the same input (bf16; fp32 with
`fp32`); with `bug`, its activation returns NaN in one row (16 values) from
the second step on."""
import sys

import torch

torch.manual_seed(0)
calls = [0]


class Act(torch.nn.Tanh):
    def forward(self, x):
        calls[0] += 1
        y = torch.tanh(x)
        if sys.argv[1] == "bug" and calls[0] >= 2:
            y = y.clone()
            y[0] = float("nan")
        return y


dtype = torch.float32 if sys.argv[1] == "fp32" else torch.bfloat16
model = torch.nn.Sequential(torch.nn.Linear(16, 16), Act(), torch.nn.Linear(16, 16)).to(dtype)
x = torch.randn(4, 16).to(dtype)
with torch.no_grad():
    for _ in range(3):
        model(x)
