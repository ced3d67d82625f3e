"""A module `c` whose first input an unmapped module `u` computed (the
reference doubles inline) and whose second, a float the reference does not
pass, cannot be compared. `u`'s output is compared through `c`'s first
input, and agrees: with --bug, `c` departs, and `u` is no suspect."""
import sys

import torch
from torch import nn

side, bug = sys.argv[1], "--bug" in sys.argv[2:]


class U(nn.Module):
    def forward(self, x):
        return x * 2


class C(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, a, scale=None):
        y = self.lin(a)
        if bug:
            y = y * 1.05
        return y if scale is None else y * scale


class Target(nn.Module):
    def __init__(self):
        super().__init__()
        self.u = U()
        self.c = C()

    def forward(self, x):
        return self.c(self.u(x), torch.ones(32))


class Ref(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = C()

    def forward(self, x):
        return self.c(x * 2)


torch.manual_seed(1)
model = Target() if side == "target" else Ref()
torch.manual_seed(2)
with torch.no_grad():
    model(torch.randn(4, 32))
print(side, "done")
