"""torch.compile with the shim's global hooks in C (the Python binding's
pre_hook and post_hook): a model compiled whole with fullgraph=True, its
first call compiled (no eager call before), a compiled function that calls
it, and both again after torch._dynamo.reset() and the trace rules'
caches cleared (as torch.distributed's init_process_group does), with
torch._dynamo looked for (importlib.util.find_spec) before it is
imported. Prints
which hooks PyTorch holds, before and after torch._dynamo's import, and
whether each compiled result equals the eager one. With `no-substitute`,
torch.compiler.substitute_in_graph fails, as in a torch without it: the
Python hooks take the C ones' places when torch._dynamo is imported. Run
under ekka-trace."""
import importlib.util
import sys

import torch
import torch.nn.modules.module as hooks

import ekka.trace as shim


def held():
    pre = hooks._global_forward_pre_hooks[shim._pre_hook_id]
    post = hooks._global_forward_hooks[shim._post_hook_id]
    return "python" if (pre, post) == (shim._pre_hook, shim._post_hook) else \
        "c" if (pre.__module__, post.__module__) == ("ekka_runtime_python",) * 2 else "other"


if sys.argv[1:] == ["no-substitute"]:
    def refuse(*args, **kwargs):
        raise TypeError("no substitute_in_graph here")
    torch.compiler.substitute_in_graph = refuse

print("before dynamo:", held())
# Asked first whether it is there (as libraries check): its import still
# brings the stand-ins.
print("dynamo there:", importlib.util.find_spec("torch._dynamo") is not None)
import torch._dynamo  # noqa: E402
print("after dynamo:", held())

torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.out = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.lin(x).relu())


net = Net()
x = torch.randn(3, 4)


def run(round):
    whole = torch.compile(net, fullgraph=True, backend="eager")
    print(round, "module:", torch.equal(whole(x), net(x)))

    @torch.compile(fullgraph=True, backend="eager")
    def step(x):
        return net(x) * 2

    print(round, "function:", torch.equal(step(x), net(x) * 2))


run("first")
torch._dynamo.reset()
torch._dynamo.trace_rules.clear_lru_cache()
run("again")
