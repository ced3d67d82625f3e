"""A block in two styles: the reference with separate q/k/v projections (as
HF writes it), the target with one fused qkv projection (as vLLM does) built
from the same weights. --bug corrupts the v projection (the fused one's v
rows)."""
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--fused", action="store_true")
parser.add_argument("--bug", action="store_true")
args = parser.parse_args()


class Separate(torch.nn.Module):
    def __init__(self, q, k, v, o):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = q, k, v
        self.o_proj = o

    def forward(self, x):
        return self.o_proj(torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], -1))


class Fused(torch.nn.Module):
    def __init__(self, qkv, o):
        super().__init__()
        self.qkv_proj = qkv
        self.o_proj = o

    def forward(self, x):
        return self.o_proj(self.qkv_proj(x))


class Model(torch.nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.layers = torch.nn.ModuleList(blocks)

    def forward(self, ids):
        x = torch.nn.functional.one_hot(ids, 16).float()
        for block in self.layers:
            x = x[..., :16] + block(x)[..., :16]
        return x


torch.manual_seed(0)
# All weights first, so that both styles draw the same random numbers.
weights = [([torch.nn.Linear(16, 8) for _ in range(3)], torch.nn.Linear(24, 16)) for _ in range(2)]
blocks = []
for (q, k, v), o in weights:
    if args.fused:
        qkv = torch.nn.Linear(16, 24)
        with torch.no_grad():
            qkv.weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
            qkv.bias.copy_(torch.cat([q.bias, k.bias, v.bias]))
        blocks.append(Fused(qkv, o))
    else:
        blocks.append(Separate(q, k, v, o))
if args.bug:  # the second block's v projection negated, fused or not
    with torch.no_grad():
        if args.fused:
            blocks[1].qkv_proj.weight[16:] *= -1
        else:
            blocks[1].v_proj.weight *= -1
model = Model(blocks)
with torch.no_grad():
    print("out", model(torch.tensor([[1, 2, 3, 4]])).sum().item())
