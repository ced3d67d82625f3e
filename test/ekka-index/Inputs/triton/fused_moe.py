import torch

from .kernels import fused_moe_kernel as _jitted


# A launcher with the kernel's name: not the kernel.
def fused_moe_kernel(a, b):
    _jitted[(1,)](a, b)


def rms_norm_kernel(x):
    return x
