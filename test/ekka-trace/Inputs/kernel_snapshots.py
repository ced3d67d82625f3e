"""A custom op of two "kernels" writing one `out` argument, as vLLM's ops
do, with the launches simulated (ekka::simulated_launch: as CUPTI would
report them) so that the kernel buffer snapshots run without a GPU. Saves
what the op left after each kernel, for the test to compare."""
import sys

import torch
from safetensors.torch import save_file

ops = torch.library.Library("zoo_check", "DEF")
ops.define("two_pass(Tensor x, Tensor y, Tensor(a!) out) -> ()")
seen = {}


def two_pass(x, y, out):
    out.copy_(2 * x)  # the first kernel
    seen["after_scale"] = out.clone()
    torch.ops.ekka.simulated_launch("scale", [x, out])
    out.add_(y)  # the second
    seen["after_accumulate"] = out.clone()
    torch.ops.ekka.simulated_launch("accumulate", [y, out])


ops.impl("two_pass", two_pass, "CPU")


class TwoPass(torch.nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        torch.ops.zoo_check.two_pass(x, y, out)
        return out


torch.manual_seed(0)
with torch.no_grad():
    TwoPass()(torch.randn(4, 8), torch.randn(4, 8))
save_file(seen, sys.argv[1])
print("ran")
