"""A projection, a scaling and an output projection, run two ways: `hf`,
which scales with a plain op between its two projections, or `engine`, which
scales in a module of its own (`scale`, which the reference lacks) and hands
the result to `attn` (a pass-through, mapped onto o_proj's input, whose own
inputs therefore have no counterpart). --bug-scale scales by 3, not 2;
--bug-attn makes `attn` add 1."""
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["hf", "engine"])
parser.add_argument("--bug-scale", action="store_true")
parser.add_argument("--bug-attn", action="store_true")
args = parser.parse_args()


class Scale(torch.nn.Module):
    def forward(self, h):
        return h * (3.0 if args.bug_scale else 2.0)


class Attn(torch.nn.Module):
    def forward(self, h):
        return h + 1.0 if args.bug_attn else h.clone()


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.o_proj = torch.nn.Linear(16, 16)
        if args.mode == "engine":
            self.scale = Scale()
            self.attn = Attn()

    def forward(self, x):
        h = self.proj(x)
        if args.mode == "engine":
            h = self.attn(self.scale(h))
        else:
            h = h * 2.0
        return self.o_proj(h)


torch.manual_seed(0)
model = Model()
with torch.no_grad():
    model(torch.randn(4, 16))
print(args.mode, "done")
