"""Programs that tracing must not change: a module that raises (caught),
torch.jit.trace, torch.compile (of functions, of modules and in place),
torch.export, meta tensors, a tensor subclass, a
negated view and a uint16 tensor, complex tensors, the float8 and float4
types of quantized inference, torch.inference_mode, torch.func's vmap
and grad, an input or output the hooks cannot walk, a keyword input written in
place inside the module, a submodule called on its own after its root's
forward (as vLLM computes logits), two unrelated models taking turns, an
inner model run alone before its whole, a model whose forward is called
directly (as SGLang's model runner does), two overloads of one op, and
modules that return their submodule's output, as it is or changed in
place, a module that returns a dataclass, arguments and outputs nested in
tuples, lists and dicts, and module outputs the caller writes to in place
right away, threads whose first module calls start the trace together,
and the program's own TorchDispatchMode."""
import os
import sys

import torch

kind = sys.argv[1]


def together(*functions):
    """Runs the functions on threads of their own, and waits for them."""
    import threading

    threads = [threading.Thread(target=f) for f in functions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


torch.manual_seed(0)


class Raises(torch.nn.Module):
    def forward(self, x):
        raise ValueError("expected")


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.bad, self.b = torch.nn.Linear(4, 4), Raises(), torch.nn.Linear(4, 4)

    def forward(self, x):
        x = self.a(x)
        try:
            self.bad(x)
        except ValueError:
            pass
        return self.b(x)


class InPlace(torch.nn.Module):
    def forward(self, hidden_states):
        hidden_states.mul_(2)
        return hidden_states + 1


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).relu()


x = torch.ones(2, 4)
if kind == "raise":
    m = Outer()
    m(x)
    m(x)
elif kind == "jit":
    lin = torch.nn.Linear(4, 4)
    lin(x)
    traced = torch.jit.trace(lin, x)
    traced(x)
    lin(x)
elif kind == "jit-inside":
    # A forward that traces its child: the check's run is not recorded there
    # either.
    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.jit.trace(self.m, x)(x)

    Outer()(x)
elif kind == "fx":
    # symbolic_trace calls the submodules that are no leaf (Block) with
    # fx.Proxy arguments, through the hooks: a Proxy has every attribute,
    # and each one the hooks used became a node of the program's graph.
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x).relu() + x

    class Blocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Block(), Block()

        def forward(self, x):
            return self.b(self.a(x))

    blocks = Blocks()
    traced = torch.fx.symbolic_trace(blocks)
    print("graph:", " ".join(n.name for n in traced.graph.nodes))
    assert torch.equal(traced(x), blocks(x))
elif kind == "compile":
    compiled = torch.compile(torch.nn.Linear(4, 4), backend="eager")
    compiled(x)
elif kind == "aot-eager":
    # aot_eager runs its forward and backward graphs as GraphModules: the
    # compiled code's, not recorded (they held every parameter as inputs,
    # captured at every step); one the program calls itself is.
    net = Net()
    compiled = torch.compile(net, backend="aot_eager")
    for _ in range(2):
        compiled(x.requires_grad_()).sum().backward()
    traced = torch.fx.symbolic_trace(Net())
    assert torch.equal(traced(x), traced(x))
elif kind == "fullgraph":
    # The hooks add no graph break: a program that compiles its model whole
    # still does, and computes what it computes untraced.
    net = Net()
    compiled = torch.compile(net, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), net(x))
elif kind == "compiled-modules":
    # Modules compiled whole: torch.compile(module)'s OptimizedModule is
    # recorded as the module it compiled, with its path; Module.compile()
    # (in place) was not recorded at all. Run under -W error, and with
    # warnings made errors again once torch._dynamo is imported (as
    # pytest's filterwarnings = error does): PyTorch's warning about global
    # hooks and OptimizedModule is not the program's; with a global hook of
    # its own, it is.
    import warnings

    import torch._dynamo  # noqa: F401
    warnings.simplefilter("error")
    class Parent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = Net(), torch.compile(Net(), backend="eager"), Net()
            self.c.compile(backend="eager")

        def forward(self, x):
            return self.c(self.b(self.a(x)))

    with torch.no_grad():
        parent = Parent()
        y = parent(x)
        whole = torch.compile(parent, fullgraph=True, backend="eager")
        assert torch.equal(whole(x), y)
        net = Net()
        net.compile(backend="eager")
        assert torch.equal(net(x), net.lin(x).relu())
        net(x + 1)
        from torch.nn.modules import module as hooks
        theirs = hooks.register_module_forward_hook(lambda module, args, output: None)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            parent.b(x)
        theirs.remove()
        assert any("global hooks" in str(w.message) for w in said), said
elif kind == "compile-disabled":
    # Run with TORCH_COMPILE_DISABLE=1 (as one checks whether a bug needs
    # compile): compiled modules run their calls as they are, hooks and all,
    # and each call is recorded once, with its submodules.
    outer = torch.nn.Sequential(torch.compile(Net()), Net())
    outer[1].compile()
    y = outer(x)
    assert torch.equal(y, outer[1].lin(outer[0]._orig_mod.lin(x).relu()).relu())
elif kind == "compile-threads":
    # Two compiles that overlap on two threads: one thread's lazy backward
    # compile starts first, the other's forward compile ends last. Dynamo
    # calls its compile callbacks at the first start and the last end only:
    # the first thread's ops after its compile are still the program's.
    import threading
    import time

    from torch._dynamo.backends.common import aot_autograd

    compiling_backward, forward_compiled = threading.Event(), threading.Event()

    def slow(seconds, event=None):
        def compiler(gm, example_inputs):
            if event is not None:
                event.set()
            time.sleep(seconds)
            return gm.forward
        return compiler

    def fast(gm, example_inputs):
        return gm.forward

    first = torch.nn.Linear(4, 4)

    def backward_first():
        f = torch.compile(lambda t: (t.sin() * 2).sum(),
                          backend=aot_autograd(fw_compiler=fast,
                                               bw_compiler=slow(0.5, compiling_backward)))
        f(torch.randn(8, 4, requires_grad=True)).backward()  # compiled lazily, here
        forward_compiled.wait()
        with torch.no_grad():
            first(x)

    def forward_last():
        compiling_backward.wait()
        g = torch.compile(lambda t: (t.cos() * 3).sum(),
                          backend=aot_autograd(fw_compiler=slow(1.0), bw_compiler=fast))
        g(torch.randn(8, 4))
        forward_compiled.set()

    together(backward_first, forward_last)
elif kind == "compile-overlap":
    # The same, the other way round: the first thread's lazy backward
    # compile starts first and ends first, and that thread runs a module
    # while the other's forward compile is still under way. Its ops are the
    # program's: the callbacks alone (first start, last end) took the whole
    # span for the first thread's compile.
    import threading

    from torch._dynamo.backends.common import aot_autograd

    backward_compiling, forward_compiling, ran = (threading.Event() for _ in range(3))

    def fast(gm, example_inputs):
        return gm.forward

    def backward_compiler(gm, example_inputs):
        backward_compiling.set()
        assert forward_compiling.wait(60)
        return gm.forward

    def forward_compiler(gm, example_inputs):
        forward_compiling.set()
        assert ran.wait(60)
        return gm.forward

    eager = torch.nn.Linear(4, 4)
    # The program's own compile callbacks, which Dynamo runs at the first
    # start and the last end: the program's ops (one start and one end
    # once the trace runs: the first thread's forward compile comes before
    # the first module call).
    marks = torch.zeros(1)
    torch._dynamo.callback.on_compile_start(lambda *args: marks.lerp_(torch.ones(1), 0.5))
    torch._dynamo.callback.on_compile_end(lambda *args: marks.clamp_(0, 1))

    def backward_first():
        f = torch.compile(lambda t: (t.sin() * 2).sum(),
                          backend=aot_autograd(fw_compiler=fast, bw_compiler=backward_compiler))
        f(torch.randn(8, 4, requires_grad=True)).backward()  # compiled lazily, here
        with torch.no_grad():
            eager(x)  # the other thread compiles meanwhile
        ran.set()

    def forward_meanwhile():
        assert backward_compiling.wait(60)
        g = torch.compile(lambda t: (t.cos() * 3).sum(),
                          backend=aot_autograd(fw_compiler=forward_compiler, bw_compiler=fast))
        g(torch.randn(8, 4))

    together(backward_first, forward_meanwhile)
elif kind == "compile-elsewhere":
    # One thread compiles (torch.compiler.is_compiling() is True for the
    # whole process meanwhile) while another runs its model eagerly: that
    # thread's calls are the program's, and recorded.
    import threading

    compiling, ran = threading.Event(), threading.Event()

    def waiting(gm, example_inputs):
        gm(*example_inputs)  # the compile's, on the compiling thread: not recorded
        compiling.set()
        assert ran.wait(60)
        return gm.forward

    def compiles():
        torch.compile(lambda t: t.sin() * 2, backend=waiting)(torch.randn(4))

    class Seen(torch.overrides.TorchFunctionMode):
        """The program's own TorchFunctionMode: it sees the program's calls
        only, and refuses any other."""
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") not in ("linear", "relu", "__get__"):
                raise RuntimeError(f"not the program's: {func}")
            return func(*args, **(kwargs or {}))

    def runs():
        assert compiling.wait(60)
        assert torch.compiler.is_compiling()
        net = Net()
        with torch.no_grad(), Seen():
            for _ in range(3):
                net(x)
        torch.jit.trace(net, x)  # calls no op of the tracer's, which jit would refuse
        ran.set()

    together(compiles, runs)
elif kind == "autotune":
    # A kernel that @triton.autotune tunes at its first call (run by
    # Triton's interpreter here, no GPU): each configuration is benchmarked,
    # its output cloned and restored around each run; then the best is
    # launched. Only that launch is the program's (a launch simulated in the
    # benchmark stands for a GPU's).
    os.environ["TRITON_INTERPRET"] = "1"
    import triton
    import triton.language as tl

    def bench(fn, quantiles):
        for _ in range(3):
            fn()
            torch.ops.ekka.simulated_launch("benchmark_run", [])
        return [1.0, 1.0, 1.0]

    @triton.autotune(configs=[triton.Config({"BLOCK": 4}), triton.Config({"BLOCK": 8})],
                     key=["n"], restore_value=["out_ptr"], do_bench=bench)
    @triton.jit
    def accumulate(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=mask) +
                 tl.load(x_ptr + offs, mask=mask), mask=mask)

    class Accumulate(torch.nn.Module):
        def forward(self, x):
            out = torch.zeros_like(x)
            accumulate[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, out, x.numel())
            torch.ops.ekka.simulated_launch("after_tuning", [out])
            return out

    acc, x = Accumulate(), torch.arange(16, dtype=torch.float32)
    assert torch.equal(acc(x), x) and torch.equal(acc(x), x)
    from torch._inductor.runtime import triton_heuristics
    print("inductor's benchmark set aside:",
          getattr(triton_heuristics.CachingAutotuner.bench, "_ekka_aside", False))
elif kind == "export":
    # torch.export.export, strict (whose Dynamo fails on any global module
    # hook) and not, of a model called before and after.
    net = Net()
    net(x)
    for strict in (True, False):
        exported = torch.export.export(net, (x,), strict=strict)
        assert torch.equal(exported.module()(x), net(x)), strict
    assert torch.equal(torch.export.draft_export(net, (x,), strict=True).module()(x), net(x))
    # The private _export that torch._export's aot_compile, converter and
    # report_exportability call.
    import torch.export._trace
    exported = torch.export._trace._export(net, (x,), strict=True)
    assert torch.equal(exported.module()(x), net(x))
    # A global hook of the program's (strict export fails on it, traced or
    # not), after the shim's: still after them once the program has exported.
    from torch.nn.modules import module as hooks
    theirs = hooks.register_module_forward_pre_hook(lambda module, args: None).id
    first = list(hooks._global_forward_pre_hooks)
    torch.export.export(net, (x,), strict=False)
    assert list(hooks._global_forward_pre_hooks) == first and first[-1] == theirs, first
elif kind == "dynamic":
    # Dynamic shapes under torch.compile and torch.export: a tensor of
    # symbolic sizes is not asked for them (that made them constants: a
    # dimension marked dynamic failed the compile, dynamic=True compiled
    # once per size).
    net = Net()
    net(x)  # the trace starts

    @torch.compile(backend="eager")
    def marked(t):
        return (t * 2).relu().sum(0)

    t = torch.randn(5, 4)
    torch._dynamo.mark_dynamic(t, 0)
    assert torch.equal(marked(t), (t * 2).relu().sum(0))

    @torch.compile(backend="eager", dynamic=True)
    def sized(t):
        return net(t).sum(0)

    for n in range(2, 8):
        t = torch.randn(n, 4)
        assert torch.allclose(sized(t), net(t).sum(0))
    import torch._dynamo.utils
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs == 2, graphs  # marked's and sized's
    batch = torch.export.Dim("batch")
    for strict in (True, False):
        exported = torch.export.export(net, (torch.randn(5, 4),), strict=strict,
                                       dynamic_shapes={"x": {0: batch}})
        t = torch.randn(7, 4)
        assert torch.equal(exported.module()(t), net(t)), strict
elif kind == "export-fallback":
    # As in a torch without substitute_in_graph: the Python hooks take the
    # C ones' places as export imports torch._dynamo, before the shim's are
    # taken out for it.
    def refuse(*args, **kwargs):
        raise TypeError("no substitute_in_graph here")

    torch.compiler.substitute_in_graph = refuse
    assert "torch._dynamo" not in sys.modules
    linear = torch.nn.Linear(4, 4)
    assert torch.equal(torch.export.export(linear, (x,), strict=True).module()(x), linear(x))
elif kind == "meta":
    torch.nn.Linear(4, 4, device="meta")(torch.empty(2, 4, device="meta"))
elif kind == "inference":
    # torch.inference_mode, as vLLM and SGLang run: inference tensors have
    # no version counter.
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = (torch.nn.Linear(4, 4) for _ in range(3))

        def forward(self, x):
            r = self.b(self.a(x))  # b's input is a's output
            r.mul_(3)              # b's output written in place before c sees it
            return self.c(r)

    with torch.inference_mode():
        Model()(x)
elif kind == "functorch":
    # Modules called inside torch.func transforms get the transforms'
    # wrapper tensors (the tracer's ops have no batching rule: vmap raised).
    lin = torch.nn.Linear(4, 4)

    class Batched(torch.nn.Module):
        def forward(self, x):
            return torch.func.vmap(lin)(x.unsqueeze(0).repeat(3, 1, 1))

    class Gradient(torch.nn.Module):
        def forward(self, x):
            return torch.func.grad(lambda t: lin(t).sum())(x)

    Batched()(x)
    Gradient()(x)
elif kind == "cycle":
    # An output the hooks cannot walk (a list that holds itself): the call
    # is recorded without its outputs, and ends there (what its caller
    # does next is the caller's); the program runs on. Twice, and once as
    # the root.
    class Cyclic(torch.nn.Module):
        def forward(self, x):
            out = [x * 2]
            out.append(out)
            return out

    class Outer2(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.lin = Cyclic(), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(self.c(x)[0].neg())

    outer = Outer2()
    outer(x)
    outer(x)
    Cyclic()(x)
    outer(x)
elif kind == "cycle-input":
    # An input the hooks cannot walk: the call is not recorded (its ops are
    # its caller's); its submodule's call is, under the caller. As a root,
    # its submodules' calls are lost too.
    class Takes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, xs):
            return self.lin(xs[0].neg())

    class Outer3(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.t, self.lin = Takes(), torch.nn.Linear(4, 4)

        def forward(self, x):
            xs = [x]
            xs.append(xs)
            return self.lin(self.t(xs))

    Outer3()(x)
    loop = [x]
    loop.append(loop)
    Takes()(loop)
elif kind == "views":
    class Views(torch.nn.Module):
        def forward(self, x):
            # A negated view (its memory holds the values before negation)
            # and an element type new to PyTorch (uint16).
            return torch._neg_view(torch.arange(6.0).reshape(2, 3)), torch.arange(4).to(torch.uint16)

    Views()(x)
elif kind == "complex":
    class Complex(torch.nn.Module):
        def forward(self, x):
            # 0+1i, 1+2i, 2+3i: returned conjugated (a view whose memory
            # holds the values before), in double and in half precision.
            z = torch.complex(torch.arange(3.0), torch.arange(3.0) + 1)
            return torch.conj(z), z.to(torch.complex128), z.to(torch.complex32)

    Complex()(x)
elif kind == "layouts":
    import warnings
    warnings.simplefilter("ignore")  # nested and quantized tensors warn of their future

    class Layouts(torch.nn.Module):
        def forward(self, x):
            coo = torch.sparse_coo_tensor([[0, 0, 2], [1, 1, 0]], [1.0, 2.0, -4.0], (3, 3))
            csr = torch.tensor([[0.0, 5.0], [-1.0, 0.0]]).to_sparse_csr()
            positive = torch.tensor([[0.0, 2.0], [3.0, 0.0]]).to_sparse()
            nested = torch.nested.nested_tensor([torch.tensor([1.0, 2.0]),
                                                 torch.tensor([3.0, 4.0, 5.0])])
            quantized = torch.quantize_per_tensor(torch.tensor([0.5, -1.0, 2.0]), 0.5, 0,
                                                  torch.qint8)
            jagged = Ragged()(torch.arange(-4.0, 6.0).reshape(5, 2))
            return coo, csr, positive, nested, quantized, jagged

    class Ragged(torch.nn.Module):
        # Returns a jagged nested tensor of two sequences, 2 and 3 long;
        # its caller's output is the same tensor, written in place after
        # this one returned (what was captured for each differs).
        def forward(self, rows):
            return torch.nested.nested_tensor_from_jagged(rows, torch.tensor([0, 2, 5]))

    class Keep(torch.nn.Module):
        def forward(self, ragged):
            return ragged

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ragged = Ragged()
            self.keep = Keep()

        def forward(self, rows):
            out = self.ragged(rows)
            out.values()[-1, -1] = 9.0
            return self.keep(out)

    Layouts()(x)
    with torch.inference_mode():  # whose tensors' writes are counted otherwise
        Outer()(torch.arange(-4.0, 6.0).reshape(5, 2))
elif kind == "smallfloats":
    # Every byte, as each small float type (and transposed, as fp4, whose
    # bytes' two values then are not side by side in a row).
    from smallfloats import TYPES, codes

    class SmallFloats(torch.nn.Module):
        def forward(self, x):
            return tuple(codes(t) for t in TYPES) + (codes(torch.float4_e2m1fn_x2).t(),)

    SmallFloats()(x)
elif kind == "mode":
    # The program's own TorchDispatchMode, active when the first module call
    # starts the trace (and when the program ends it): it sees the program's
    # ops, none of the tracer's.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    log, linear = Log(), torch.nn.Linear(2, 2)
    with log:
        linear(x[:, :2])
    print("mode saw", sorted(set(log.ops)))
    linear(x[:, :2])  # without it
elif kind == "subclass":
    from torch.utils._pytree import tree_map

    class Wrapped(torch.Tensor):
        """A wrapper subclass (as DTensor is): no data of its own."""
        @staticmethod
        def __new__(cls, inner):
            return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype,
                                                       device=inner.device)

        def __init__(self, inner):
            self.inner = inner

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            unwrap = lambda t: t.inner if isinstance(t, Wrapped) else t
            out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
            return tree_map(lambda t: Wrapped(t) if isinstance(t, torch.Tensor) else t, out)

    class Both(torch.nn.Module):
        def forward(self, x):
            return Wrapped(x * 2) + 1, x + 1

    Both()(x)
elif kind == "inplace":
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.layer = torch.nn.Embedding(8, 4), InPlace()

        def forward(self, ids):
            return self.layer(hidden_states=self.emb(ids))

    Model()(torch.tensor([1, 2]))
elif kind == "detached":
    m = Outer()
    m.bad = torch.nn.Identity()
    for _ in range(2):
        h = m(x)
        m.b(h)  # the model's own head, called after its forward
elif kind == "two-roots":
    # A target model and an unrelated draft model, taking turns (as
    # speculative decoding runs them); the draft is another instance of the
    # same class. Then a program that ran its inner model alone before the
    # whole.
    target, draft = Outer(), Outer()
    target.bad = draft.bad = torch.nn.Identity()
    for _ in range(2):
        target(x)
        draft(x)
    # Then a part of the target with parts of its own, called on its own
    # after the draft ran: its tree is still the target's.
    block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    target.b = block
    target(x)
    draft(x)
    target.b(x)
    # Roots that live for one call each, while the two live on: each takes
    # the first name no live root has, the freed one's before it. Then two
    # that live together: two names.
    for _ in range(3):
        torch.nn.Linear(4, 4)(x)
    kept = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)]
    for m in kept + kept:
        m(x)
elif kind == "inner-first":
    class Whole(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Outer()
            self.inner.bad = torch.nn.Identity()

        def forward(self, x):
            return self.inner(x)

    whole = Whole()
    whole.inner(x)
    whole(x)
elif kind == "direct":
    m = Outer()
    m.bad = torch.nn.Identity()
    with torch.no_grad():
        for _ in range(2):
            # Bypasses PyTorch's hooks: the first call is recovered from the
            # stack, the second goes through the forward the shim gave m.
            h = m.forward(x)
            assert sys.getprofile() is None  # the shim's watch has ended
            h.sum()  # after the forward returned
        m(h)
elif kind == "direct-raises":
    # The first direct call raises in a submodule: it ends without an
    # output, and the shim's watch with it; the next call is whole.
    class Fails(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("bad input")

    m = Outer()
    m.bad = Fails()
    with torch.no_grad():
        try:
            m.forward(x)
        except RuntimeError:
            pass
        assert sys.getprofile() is None
        m.bad = torch.nn.Identity()
        m.forward(x)
elif kind == "direct-profiled":
    # The program profiles itself: the shim leaves its profile function
    # alone, and the first direct call's output is not seen.
    events = []
    def mine(frame, event, arg):
        events.append(event)
    m = Outer()
    m.bad = torch.nn.Identity()
    sys.setprofile(mine)
    with torch.no_grad():
        m.forward(x)
        m.forward(x)
    assert sys.getprofile() is mine and events
    sys.setprofile(None)
elif kind == "direct-copy":
    import copy
    import inspect
    m = Outer()
    m.bad = torch.nn.Identity()
    with torch.no_grad():
        m.forward(x)
        m.forward(x)
        # What the shim gave m keeps forward's signature, and a copy of m
        # runs the copy's weights.
        assert list(inspect.signature(m.forward).parameters) == ["x"]
        c = copy.deepcopy(m)
        for p in c.b.parameters():
            p.zero_()
        assert torch.equal(c.forward(x), torch.zeros(2, 4))
        assert not torch.equal(m.forward(x), torch.zeros(2, 4))
elif kind == "overloads":
    class Adds(torch.nn.Module):
        def forward(self, x):
            out = torch.empty_like(x)
            torch.add(x, x, out=out)  # aten::add.out, which writes `out`
            return torch.add(out, x)  # aten::add.Tensor

    Adds()(x)
elif kind == "returns-child":
    class Same(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x)

    class Doubled(Same):
        def forward(self, x):
            return self.lin(x).mul_(2)

    class DoubledBehindItsBack(Same):
        def forward(self, x):
            y = self.lin(x)
            y.data.mul_(2)  # leaves y's version counter as it was
            return y

    with torch.no_grad():
        Same()(x)
        Doubled()(x)
    DoubledBehindItsBack()(x)
elif kind == "dataclass":
    import dataclasses

    @dataclasses.dataclass
    class Logits:  # as SGLang's LogitsProcessorOutput
        next_token_logits: torch.Tensor
        hidden_states: object = None
        top_logprobs: object = None

    @dataclasses.dataclass
    class Batch:  # as SGLang's ForwardBatch: an argument, not an input
        positions: torch.Tensor

    class Head(torch.nn.Module):
        def forward(self, x, batch):
            return Logits(x * 2, x + batch.positions, [1.0])

    Head()(x, Batch(torch.full((2, 4), 2.0)))
elif kind == "nested":
    class Nested(torch.nn.Module):
        def forward(self, a, pair, named, pe=None):
            b, (c, _, _) = pair
            return a * 2, [b * 2, {"c": named["k"] * 2}]

    class Cache:
        """An object that holds no tensor pytree sees (HF's DynamicCache)."""

    import collections
    Pair = collections.namedtuple("Pair", "cos sin")
    t = [torch.full((2, 4), float(i)) for i in range(7)]
    Nested()(t[1], (t[2], [t[3], None, Cache()]), {"k": t[4]}, pe=Pair(t[5], t[6]))
elif kind == "written-later":
    class Ones(torch.nn.Module):
        def forward(self, k):
            return torch.ones(256, 256) * k  # 256 KiB: statistics computed later

    m = Ones()
    with torch.no_grad():
        m(torch.tensor(1.0)).mul_(3)                     # in place
        m(torch.tensor(2.0)).data.add_(1)                # past the version counter
        m(torch.tensor(3.0))[0].zero_()                  # through a view
        y = m(torch.tensor(4.0))
        torch.add(y, y, out=y)                           # as an op's `out`
        torch._foreach_mul_([m(torch.tensor(5.0)), m(torch.tensor(6.0))], 2)  # in a list
elif kind == "input-written":
    class Eat(torch.nn.Module):
        def forward(self, x):
            x.mul_(10)                                   # its own input, in place
            return None

    class Read(torch.nn.Module):
        def forward(self, x):
            return None

    with torch.no_grad():
        for k in (1.0, 2.0):
            Eat()(torch.ones(256, 256) * k)              # an op's output (256 KiB)
        buffer = torch.empty(256, 256)
        for k in (3.0, 4.0):
            buffer.numpy()[:] = k                        # filled outside the ops
            Read()(buffer)
            buffer.numpy()[:] = 99                       # and again, right away
elif kind == "threads":
    # Four threads start their models at once: the first module call of
    # each comes while another one's starts the trace (made slow here, so
    # that they do).
    import threading
    import time

    import ekka.trace as shim
    gpu_options = shim._gpu_options

    def slow_gpu_options():
        time.sleep(0.3)
        return gpu_options()

    shim._gpu_options = slow_gpu_options
    models = [Outer() for _ in range(4)]
    for m in models:
        m.bad = torch.nn.Identity()
    barrier = threading.Barrier(4)

    def work(m):
        barrier.wait()
        for _ in range(3):
            m(x)

    threads = [threading.Thread(target=work, args=(m,)) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
print(kind, "ok")
