"""Two regions of one program traced into two traces (ekka.trace.Trace),
and what is refused."""
import os
import sys

import torch

import ekka.trace

out = sys.argv[1]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
sequential_forward = torch.nn.Sequential.forward
x = torch.randn(2, 4)
with torch.no_grad():
    model(x)  # before any region: not traced
    with ekka.trace.Trace(os.path.join(out, "first")) as first:
        model(x)
    model(x)  # between the regions: not traced
    with ekka.trace.Trace(os.path.join(out, "second"), capture="none"):
        model(x)
        model(x)
        try:
            with ekka.trace.Trace(os.path.join(out, "nested")):
                pass
        except RuntimeError as e:
            print("nested:", e)
    try:
        with ekka.trace.Trace(os.path.join(out, "first")):
            pass
    except FileExistsError as e:
        print("exists:", e)
    open(os.path.join(out, "first", "notes.txt"), "w").write("mine")
    with ekka.trace.Trace(os.path.join(out, "first"), force=True):
        model(x)
    # A model whose forward is called directly gets a forward of its own
    # from the shim while traced (see awkward.test's direct).
    with ekka.trace.Trace(os.path.join(out, "direct")):
        model.forward(x)
        model.forward(x)
        print("direct forward during:", type(model).forward is not sequential_forward)
    # Each region's own op filter: what the runtime remembers of an op
    # (whether the filter takes it, its interned name) is its trace's.
    with ekka.trace.Trace(os.path.join(out, "ops-addmm"), capture_ops="^aten::addmm$"):
        model(x)
    with ekka.trace.Trace(os.path.join(out, "ops-relu"), capture_ops="^aten::relu$"):
        model(x)
    # ekka-trace's --budget (in MiB: here 64 bytes), --op-stats and
    # --no-gpu-kernels.
    with ekka.trace.Trace(os.path.join(out, "options"), budget=64 / 2**20, op_stats=True,
                          no_gpu_kernels=True):
        model(x)
    try:
        ekka.trace.Trace(os.path.join(out, "bad"), budget="1")
    except ValueError as e:
        print("budget:", e)
print("kept:", open(os.path.join(out, "first", "notes.txt")).read())
# After its regions the model carries no mark of the tracer's hook, and its
# class has its own forward again.
print("marked after:", sum(len(m._forward_pre_hooks_with_kwargs) for m in model.modules()))
print("direct forward after:", type(model).forward is not sequential_forward)
print("summary:", first.summary)
# A region of one module call: its summary counts it in the singular.
with torch.no_grad(), ekka.trace.Trace(os.path.join(out, "single")) as single:
    torch.nn.Linear(4, 4)(x)
print("single summary:", single.summary)
