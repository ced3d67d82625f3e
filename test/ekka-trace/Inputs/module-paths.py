"""Module paths follow named_modules() as it is at each call: a module at
several paths (vLLM's get_rope() gives every layer one RotaryEmbedding;
`self.b = self.a`) is named under the call open around it (of its owners
with a call open, the outermost's: a block's module that a helper of the
block calls keeps the block's name), and a module
moved since its last call (a layer list pruned, two modules swapped) by
where it is now."""
import sys

import torch

kind = sys.argv[1]
x = torch.ones(2, 4)


class Rotary(torch.nn.Module):
    def forward(self, q):
        return q * 1.0


ROPE = Rotary()  # as get_rope() caches it


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.rotary_emb = torch.nn.Linear(4, 4), ROPE

    def forward(self, x):
        return self.rotary_emb(self.qkv(x))


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = Attention()

    def forward(self, x):
        return self.self_attn(x)


class Layers(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer() for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Pair(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.b(self.a(x))


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.p, self.q = Pair(), Pair()

    def forward(self, x):
        return self.q(self.p(x))


class Runner(torch.nn.Module):
    """A helper that calls modules its block owns (vLLM's fused-MoE runner
    and the block's router and shared expert)."""
    def __init__(self, gate, shared):
        super().__init__()
        self.gate, self.shared = gate, shared

    def forward(self, x):
        return self.shared(self.gate(x))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.shared_expert = torch.nn.Linear(4, 4), Pair()
        self.experts = Runner(self.gate, self.shared_expert)

    def forward(self, x):
        return self.experts(x)


with torch.no_grad():
    if kind == "borrowed":
        Block()(x)
    if kind == "shared":
        Layers(3)(x)
        # The same module at two paths of one parent: the first.
        pair = Pair()
        pair.b = pair.a
        pair(x)
        del pair
        # A shared module with children, called at both its paths.
        outer = Outer()
        outer.p.a = outer.q.a = Layer()
        outer(x)
    elif kind == "moved":
        model = Layers(4)
        model(x)
        model.layers = torch.nn.ModuleList([model.layers[0], model.layers[2], model.layers[3]])
        model(x)
        kept = model.layers  # still alive elsewhere: its layers are moved all the same
        model.layers = torch.nn.ModuleList([kept[1], kept[0]])
        model(x)
        pair = Pair()
        pair(x)
        pair.a, pair.b = pair.b, pair.a
        pair(x)
print(kind, "ok")
