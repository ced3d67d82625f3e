"""A stack of linear layers in bf16 (in fp32 with --fp32). --engine computes
each layer as a serving engine's GEMM does, splitting its inner dimension in
chunks whose products are summed in fp32 (other rounding, the same answer);
--bug sums the second layer's chunks in bf16 instead (no fp32 accumulator):
an error that raises that layer's R, but not above the threshold of 1.5."""
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--fp32", action="store_true")
parser.add_argument("--engine", action="store_true")
parser.add_argument("--bug", action="store_true")
parser.add_argument("--tokens", type=int, default=24)
parser.add_argument("--chunk", type=int, default=16)
args = parser.parse_args()
dtype = torch.float32 if args.fp32 else torch.bfloat16


class EngineLinear(torch.nn.Linear):
    def __init__(self, linear, accumulate):
        super().__init__(linear.in_features, linear.out_features, bias=False)
        self.weight = linear.weight
        self.accumulate = accumulate

    def forward(self, x):
        acc = None
        for s in range(0, x.shape[-1], args.chunk):
            part = (x[..., s:s + args.chunk].to(self.accumulate)
                    @ self.weight[:, s:s + args.chunk].t().to(self.accumulate))
            acc = part if acc is None else acc + part
        return acc.to(x.dtype)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 128)
        self.layers = torch.nn.ModuleList(
            [torch.nn.Linear(128, 128, bias=False) for _ in range(3)])

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


torch.manual_seed(0)
model = Model().to(dtype)
if args.engine or args.bug:
    for i, layer in enumerate(model.layers):
        model.layers[i] = EngineLinear(
            layer, torch.bfloat16 if args.bug and i == 1 else torch.float32)
ids = torch.arange(args.tokens) * 7 % 64
with torch.no_grad():
    print(model(ids).float().sum().item())
