# Ops registered from Python, the ways vLLM and torch.library do it.
import torch
from torch.library import Library

from vllm.utils.torch_utils import direct_register_custom_op


def unified_attention(query: torch.Tensor, key: torch.Tensor, layer_name: str) -> torch.Tensor:
    return query


def unified_attention_fake(query: torch.Tensor, key: torch.Tensor, layer_name: str) -> torch.Tensor:
    return torch.empty_like(query)


# vLLM's: into its `vllm` library unless target_lib names another.
direct_register_custom_op(
    op_name="unified_attention",
    op_func=unified_attention,
    mutates_args=[],
    fake_impl=unified_attention_fake,
    dispatch_key=current_platform.dispatch_key,
)

fp8_lib = Library("fp8", "FRAGMENT")


def scaled_fp8_quant(x: torch.Tensor) -> torch.Tensor:
    return x


direct_register_custom_op("scaled_fp8_quant", scaled_fp8_quant, [], None, fp8_lib, "CUDA")


@torch.library.custom_op("mylib::my_add", mutates_args=())
def my_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


@my_add.register_fake
def _(a, b):
    return torch.empty_like(a)


@torch.library.register_fake("mylib::my_mul")
def my_mul_fake(a, b):
    return torch.empty_like(a)


lib = torch.library.Library("x", "DEF")
lib.define("foo(Tensor a) -> Tensor")


def foo_cuda(a):
    return a


lib.impl("foo", foo_cuda, "CUDA")
lib.impl("foo", lambda a: a, dispatch_key="CPU")

# Names built at run time cannot be read.
for name in ["relu", "gelu"]:
    lib.define(name + "(Tensor a) -> Tensor")
    direct_register_custom_op(op_name=f"{name}_op", op_func=foo_cuda, mutates_args=[])


# vLLM's fake implementations of its C++ ops name the namespace as written:
# `_C` is the library TORCH_EXTENSION_NAME makes, not a macro.
@torch.library.register_fake("_C::rotary_embedding")
def _rotary_embedding_fake(positions, query, key):
    return None


torch.library.register_fake("_C_cache_ops::swap_blocks", lambda src, dst: None)
