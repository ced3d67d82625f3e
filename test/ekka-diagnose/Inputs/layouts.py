"""Two programs that hold one attention-like tensor in different layouts:
the reference as HF does, heads first ([1, heads, tokens, dim], a transposed
view of [1, tokens, heads, dim]); the target as a serving engine does,
tokens first ([tokens, heads, dim]). With as many tokens as heads the
shapes cannot tell the layouts apart.

  layouts.py ref            the reference, its heads-first tensor a view
  layouts.py ref-contiguous the reference, its heads-first tensor a copy
  layouts.py tgt            the target
  layouts.py tgt-bug        the target, one head of the split zeroed
"""
import sys

import torch

mode = sys.argv[1]
TOKENS = HEADS = 4
DIM = 8
torch.manual_seed(0)


class Split(torch.nn.Module):
    """The projection's output split into heads."""

    def forward(self, x):
        if mode.startswith("ref"):
            heads = x.view(1, TOKENS, HEADS, DIM).transpose(1, 2)
            return heads.contiguous() if mode == "ref-contiguous" else heads
        heads = x.view(TOKENS, HEADS, DIM)
        if mode == "tgt-bug":
            heads = heads.clone()
            heads[:, 2] = 0
        return heads


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(32, HEADS * DIM)
        self.proj = torch.nn.Linear(HEADS * DIM, HEADS * DIM)
        self.split = Split()
        self.out = torch.nn.Linear(HEADS * DIM, HEADS * DIM)

    def forward(self, ids):
        x = self.proj(self.embed(ids))
        heads = self.split(x)
        if mode.startswith("ref"):
            merged = heads.transpose(1, 2).reshape(1, TOKENS, HEADS * DIM)
        else:
            merged = heads.reshape(TOKENS, HEADS * DIM)
        return self.out(merged)


model = Model().eval()
ids = torch.tensor([3, 1, 4, 1])
with torch.no_grad():
    model(ids.unsqueeze(0) if mode.startswith("ref") else ids)
