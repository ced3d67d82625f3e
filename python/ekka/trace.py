"""The tracing shim: global module hooks that feed Ekka's C++ runtime.

Installed in every Python process that ``ekka-trace`` starts (through
``sitecustomize``); tracing begins at the first ``nn.Module`` call, so helper
processes that never run a model leave nothing behind. The logic lives in
C++ (``libekka_runtime.so``, loaded as PyTorch custom ops); this file only
observes module calls and hands them over.

A module whose ``forward`` is called directly (``m.forward(x)`` instead of
``m(x)``) bypasses PyTorch's hooks. Where that module is the outermost one
(SGLang's model runner calls ``model.forward(...)``), its first call is
recovered from the Python stack when its first submodule is called (see
_direct_forward), and its later ones are hooked (_hook_direct_calls). Known
gap: a submodule's ``forward`` called directly by its parent is not a module
call of its own; its ops are attributed to the enclosing module call (its
own submodules keep their paths).
"""
import atexit
import contextlib
import dataclasses
import functools
import inspect
import os
import sys
import threading
import weakref

import torch
from torch.nn.modules.module import (register_module_forward_hook,
                                     register_module_forward_pre_hook)
from torch.utils import _pytree

_state = None
_enter = _exit = None  # torch.ops.ekka.enter / exit, once the runtime is loaded


class _State:
    def __init__(self, trace_dir, options):
        self.trace_dir = trace_dir
        self.options = options
        self.base_options = options  # without what _start adds
        self.active = True           # False between regions of Trace()
        self.started = False
        self.starting = False    # _start is running (on the thread holding _start_lock)
        self.start_ok = False    # whether it started
        self.exit_handlers = False
        self.local = threading.local()  # per thread: stack and names of its root
        self.sources = {}        # class -> (qualname, file, line)

    @property
    def stack(self):             # (module, call id, positional inputs, kwargs seen, tree,
                                 # direct-call marker, path)
        if not hasattr(self.local, "stack"):
            self.local.stack = []
        return self.local.stack

    @stack.setter
    def stack(self, value):
        self.local.stack = value


_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
_is_dynamo_compiling = getattr(getattr(torch, "compiler", None), "is_dynamo_compiling",
                               _is_compiling)
# Without it, is_compiling() is taken to be every thread's, as it says.
_compile_context = getattr(getattr(getattr(torch, "_guards", None), "CompileContext", None),
                           "try_get", None) or (lambda: True)
_tracing_state = torch._C._get_tracing_state
_is_scripting = torch.jit.is_scripting
_functorch_level = getattr(getattr(torch._C, "_functorch", None), "maybe_current_level",
                           lambda: None)


def _compiling_here():
    """torch.compiler.is_compiling(), for this thread. Its flag is the whole
    process's: while one thread compiles, another's module calls are the
    program's, and a flag that two threads' compiles left set (each restores
    what it found) is no thread's. A thread that compiles (Dynamo, a lazy
    backward compile, compiled autograd, a non-strict export) has a compile
    context of its own. (While a program exports, the shim's hooks are out
    of PyTorch's on every thread: see _wrap_export.) Dynamo, tracing the
    hooks, answers True at once: is_dynamo_compiling() is a constant to it,
    so nothing goes into the graph. Asks no op: jit.trace on this thread
    would record it, and the program's TorchFunctionMode see it."""
    return _is_compiling() and (_is_dynamo_compiling() or _compile_context() is not None)


def _not_traceable():
    """While torch.compile or torch.jit traces the program, hooks must stay
    out of the graph: the ekka ops have no meta kernels and return strings.
    Inside a torch.func transform (vmap, grad) the tensors are the
    transform's wrappers, which the ekka ops take no batching rule for: the
    modules called there are not recorded (their calls, as the whole, are)."""
    return _compiling_here() or _traced_otherwise()


def _traced_otherwise():
    """_not_traceable's questions but torch.compile's, which the hooks ask
    first of all (see _pre_hook)."""
    return _tracing_state() is not None or _is_scripting() or _functorch_level() is not None


def _tensors_py(value, outputs=False):
    """The tensors in a module's arguments or, with `outputs`, its result,
    in order. The common shapes (a tensor, a tuple or list of tensors and
    None, a dict of them, nested: HF's `position_embeddings=(cos, sin)`,
    beside objects that hold none: HF's `past_key_values` cache) directly,
    in pytree's order; anything else through pytree: a hook runs at every
    module call, and pytree's flattening is most of its cost. Exact types
    are tested first: isinstance() against torch.Tensor costs a metaclass
    call for anything that is no tensor. The Python binding's `tensors`
    does the same in C (install() makes it `_tensors`); this is what it
    does where there is none, and what it is tested against."""
    kind = type(value)
    if kind is _Tensor or kind is _Parameter:
        return [value]
    if kind is tuple or kind is list:
        out = []
        for leaf in value:
            kind = type(leaf)
            if kind in _scalars:
                continue
            if kind is _Tensor or kind is _Parameter or isinstance(leaf, _Tensor):
                out.append(leaf)
            elif kind is tuple or kind is list or kind is dict:
                out.extend(_tensors_py(leaf, outputs))
            elif not isinstance(leaf, (int, float, bool, str)) and not _opaque(leaf, outputs):
                return _tensors_of_any(value, outputs)
        return out
    if kind is dict:
        return _tensors_py(list(value.values()), outputs)
    if isinstance(value, _Tensor):
        return [value]
    return _tensors_of_any(value, outputs)


_tensors = _tensors_py
_Tensor, _Parameter = torch.Tensor, torch.nn.Parameter
_scalars = frozenset((type(None), bool, int, float, str))


def _opaque(leaf, outputs):
    """Whether _tensors_of_any would find no tensor in `leaf`, no tensor
    itself: a pytree leaf (no registered node, no namedtuple) that is no
    ModelOutput and, among outputs, no dataclass (the leaves it looks into).
    Asked of the type: torch.fx's Proxy has every attribute, and using one
    puts a node into the graph it traces."""
    return (_is_leaf(leaf) and not _is_model_output(leaf)
            and not (outputs and dataclasses.is_dataclass(leaf)))


# pytree's own test where it has one (torch 2.2 on); else no leaf is
# opaque, and such arguments go through pytree whole, as before.
_is_leaf = getattr(_pytree, "tree_is_leaf", lambda leaf: False)


def _is_model_output(leaf):
    """Whether `leaf` is a transformers ModelOutput, or anything whose class
    has its `to_tuple`. Never asked of the instance: an object that answers
    every attribute (an fx.Proxy, which a module's hooks get while
    torch.fx.symbolic_trace runs it) would be called, and symbolic_trace
    would put that call into the program's graph."""
    return callable(getattr(type(leaf), "to_tuple", None))


def _tensors_of_any(value, outputs=False):
    leaves, _ = _pytree.tree_flatten(value)
    out = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            out.append(leaf)
        elif _is_model_output(leaf):
            out.extend(t for t in leaf.to_tuple() if isinstance(t, torch.Tensor))
        elif outputs and dataclasses.is_dataclass(leaf) and not isinstance(leaf, type):
            # A returned dataclass (SGLang's LogitsProcessorOutput): its
            # tensor fields, in order. Not an argument's (SGLang's
            # ForwardBatch, passed to every layer, is no input of each).
            out.extend(t for t in (getattr(leaf, f.name, None) for f in dataclasses.fields(leaf))
                       if isinstance(t, torch.Tensor))
    return out


def _class_source(state, cls):
    cached = state.sources.get(cls)
    if cached is None:
        qualname = f"{cls.__module__}.{cls.__qualname__}"
        try:
            file = inspect.getsourcefile(cls) or ""
            line = inspect.getsourcelines(cls)[1]
        except (OSError, TypeError):
            file, line = "", 0
        cached = state.sources[cls] = (qualname, file, line)
    return cached


def _trace_dir(base):
    """Where this process writes: rank-N/ for ranks of a distributed run."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world > 1:
        return os.path.join(base, f"rank-{os.environ.get('RANK', '0')}")
    return base


STARTED_MARKER = "started"


def _mark_started(base):
    """A rank of a distributed run leaves rank-N/started as it begins: its
    trace starts only at its first module call, and a rank that runs none
    (or is killed before) leaves no trace.db. Readers then tell such a rank
    from one whose trace is missing (lost, or never run under Ekka)."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1 or _data_loader_worker():
        return
    directory = _trace_dir(base)
    try:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, STARTED_MARKER), "a") as f:
            f.write(f"pid {os.getpid()}\n")
    except OSError:
        pass  # the trace itself says what is wrong with DIR, if it starts


def _gpu_options():
    """GPU kernels are traced through the libcupti that ships with torch's
    CUDA wheels, when there is a GPU."""
    if not torch.cuda.is_available():
        return "gpu=no CUDA device;"
    import glob
    site = os.path.dirname(os.path.dirname(torch.__file__))
    found = sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libcupti.so*")) +
                   glob.glob(os.path.join(site, "nvidia", "cuda_cupti", "lib", "libcupti.so*")))
    if os.environ.get("EKKA_CUPTI_LIB"):
        found = [os.environ["EKKA_CUPTI_LIB"]]
    if not found:
        return "gpu=no libcupti found beside torch (set EKKA_CUPTI_LIB);"
    return f"cupti={found[0]};"


def _unseen(op, *args):
    """Calls one of the runtime's own ops (start, stop, flush) where the
    program's TorchDispatchMode or TorchFunctionMode, if one is active (a
    logging mode, FakeTensorMode), does not see it: it is no op of the
    program's (a mode that refuses what it does not know would keep the trace
    from starting). They take no tensors, so Python's dispatch has nothing
    else to do with them."""
    with torch._C._DisableTorchDispatch(), _no_torch_function():
        return op(*args)


_no_torch_function = getattr(torch._C, "DisableTorchFunction", contextlib.nullcontext)


def _start(state):
    """Starts the trace at the first module call of any thread. The others
    wait for it: a call that entered before the trace existed would be
    lost, its children recorded without it. A module call that the start
    itself makes on this thread (an import hook's) is not recorded."""
    with _start_lock:
        if state.started:  # another thread's call started it meanwhile
            return state.start_ok
        if state.starting:
            return False
        state.starting = True
        try:
            state.start_ok = _start_now(state)
            return state.start_ok
        finally:
            state.starting = False
            state.started = True  # once, whether or not it failed


_start_lock = threading.RLock()


def _data_loader_worker():
    """Whether this process is a DataLoader's worker (any start method)."""
    data = sys.modules.get("torch.utils.data")
    return getattr(data, "get_worker_info", lambda: None)() is not None


def _start_now(state):
    binding = "torch.ops" if _enter is torch.ops.ekka.enter.default else "python"
    state.options = _gpu_options() + f"binding={binding};" + state.base_options
    if _data_loader_worker():
        # Its modules (a dataset's transforms) run before the program's
        # model gets its first batch: DIR is left to the program.
        error = "already holds a trace"
    else:
        error = _unseen(torch.ops.ekka.start, _trace_dir(state.trace_dir), state.options,
                        os.environ.get("EKKA_COMMAND_LINE", " ".join(sys.argv)))
    if error:
        # Another process of this program already writes here (a subprocess
        # that runs a model too): give it a directory of its own.
        if "already holds a trace" in error:
            alt = os.path.join(state.trace_dir, f"process-{os.getpid()}")
            error = _unseen(torch.ops.ekka.start, alt, state.options, " ".join(sys.argv))
        if error:
            print(f"ekka-trace: error: {error}", file=sys.stderr)
            return False
    if not state.exit_handlers:
        state.exit_handlers = True
        atexit.register(_stop)
        # A child of multiprocessing's fork start method leaves through
        # os._exit, which skips atexit; multiprocessing's own finalizers
        # still run.
        import multiprocessing.util
        multiprocessing.util.Finalize(None, _stop, exitpriority=0)
    return True


def _hook_failed(where, error):
    """The hooks must not change what the program does: an error of their
    own (an input or output they cannot walk: a list that holds itself)
    costs part of the module call's record, and is said once on stderr.
    Before the call, the call's row (its ops and its submodules' calls are
    its caller's; a root's submodules fail alike, see _open_direct); after
    it, its outputs only (_after ends the call without them)."""
    global _hook_error_said
    if not _hook_error_said:
        _hook_error_said = True
        lost = ("a module call was not recorded (its ops and its submodules' calls are its "
                "caller's; a root's submodules' calls are lost too)"
                if where == "hook before the call" else
                "a module call's outputs were not recorded (the call, its inputs and what "
                "ran inside it are)")
        print(f"ekka-trace: warning: {lost}: the {where} failed: "
              f"{type(error).__name__}: {error}", file=sys.stderr)


_hook_error_said = False


# Under torch.compile, Dynamo traces the hooks as part of the module call:
# their first question, whether it compiles, it answers True at compile
# time, so they put nothing into the graph and break none (a program that
# compiles with fullgraph=True still does). The modules it compiled are not
# recorded; the ops of the compiled code are, as any op.
def _pre_hook(module, args, kwargs=None):
    if _compiling_here():
        return
    try:
        if _fast_before is None or not _fast_before(module, args, kwargs):
            _before(module, args, kwargs)
    except Exception as error:
        _hook_failed("hook before the call", error)


def _post_hook(module, args, *rest):
    if _compiling_here():
        return
    try:
        if _fast_after is None or not _fast_after(module, args, *rest):
            _after(module, args, *rest)
    except Exception as error:
        _hook_failed("hook after the call", error)


# With the Python binding, the hooks' common case (a call inside an open
# one, of a module of its tree, whose class was seen before; the end of the
# last call open) runs in C: `_fast_before` and `_fast_after` do what
# _before and _after would, or answer False for them to be asked.
_fast_before = _fast_after = None


# With the binding, the global hooks are its `pre_hook` and `post_hook`:
# _pre_hook and _post_hook in C, which PyTorch calls without a Python frame
# of the shim's at all (two or three fewer a hook; about a tenth of a
# module call's cost). Dynamo cannot trace a C function: it would break the
# graph at every module call. Once torch._dynamo is imported, each has a
# stand-in registered that Dynamo traces instead (substitute_in_graph), and
# that, like _pre_hook and _post_hook under it, does nothing. Where the
# stand-ins cannot be registered, the Python hooks take the C ones' places
# before anything compiles.
def _pre_hook_in_graph(module, args, kwargs=None):
    return None


def _post_hook_in_graph(module, args, *rest):
    return None


def _hooks_in_graph(pre, post, _dynamo):
    try:
        from torch.compiler import substitute_in_graph
        substitute_in_graph(pre, skip_signature_check=True)(_pre_hook_in_graph)
        substitute_in_graph(post, skip_signature_check=True)(_post_hook_in_graph)
    except Exception:
        hooks = torch.nn.modules.module
        hooks._global_forward_pre_hooks[_pre_hook_id] = _pre_hook
        hooks._global_forward_hooks[_post_hook_id] = _post_hook


def _when_imported(name, action):
    """Calls action(module) once the module `name` is imported (now if it
    is; see ekka._imports). An error of the action's is not the import's:
    it is said on stderr."""
    def act(module):
        try:
            action(module)
        except Exception as error:
            print(f"ekka-trace: warning: after importing {name}: {type(error).__name__}: "
                  f"{error}", file=sys.stderr)

    from ekka._imports import when_imported
    when_imported(name, act)


def _before(module, args, kwargs=None):
    """Before a module's forward. PyTorch passes the keyword arguments too
    for the modules of a named root's tree (see _names_of); otherwise only
    the positional ones, and the keyword ones are recorded at the exit."""
    state = _state
    if not state.active or _traced_otherwise():  # _pre_hook asked of torch.compile
        return
    if not state.started and not _start(state):
        return
    if isinstance(module, _GraphModule) and _run_by_backend():
        return
    local = state.local
    stack = getattr(local, "stack", None)
    if stack is None:
        stack = local.stack = []
    # Only a root whose forward was called directly is open: has it returned?
    if len(stack) == 1 and stack[0][5] is not None and not _running(stack[0][5]):
        _close_direct(stack)
    if stack and _runs_compiled(local, stack[-1][0], module):
        return
    is_root = not stack
    if is_root and getattr(local, "unrecorded", False):
        return  # torch.jit.trace's check, fx's tracer: not the program's step (_unrecorded)
    trees = getattr(local, "trees", None)
    if trees is None:
        trees = local.trees = {}
    tree = None
    named = _compiled(module)
    direct = _direct_forward(module) if is_root else None
    if direct is not None:
        # The outermost module's forward was called directly: its call is
        # recovered as the root, and this module's is its child.
        tree = _open_direct(state, local, trees, stack, *direct)
        is_root = False
    elif is_root:
        tree = trees.get(id(named))
        if tree is not None and tree.root() is not named:
            del trees[id(named)]  # a dead root's id, reused
            tree = None
        owner = _generating(named) if tree is None else None
        if owner is not None:
            # An encoder that generate() runs alone, before the whole model
            # (each generate()'s): a step, named in the whole model's tree.
            tree = trees.get(id(owner))
            if tree is None or tree.root() is not owner:
                tree = trees[id(owner)] = _new_tree(trees, owner)
        elif tree is None:
            # A submodule of a root called on its own, after the root's
            # forward (vLLM's compute_logits calls the logits processor so):
            # it keeps its path in the root's tree, and is no new step.
            tree = _tree_holding(local, named)
            if tree is not None:
                is_root = False
                local.called_after = getattr(local, "forwards", 0)
        if is_root and _after_forward(local, named):
            # A module with no weights called alone after a model's forward
            # on this thread (vLLM's Sampler, after compute_logits): the
            # step's post-processing, named as a root of its own
            # (`<Sampler>`), in the step of the forward.
            if tree is None:
                tree = trees[id(named)] = _new_tree(trees, named)
            is_root = False
        if is_root:
            tree = _begin_step(local, trees, named, tree)
    else:
        # The tree of the outermost call open on this thread: a submodule
        # called on its own keeps its root's tree for its children too.
        tree = stack[0][4]
    path = None
    parent, parent_path = (stack[-1][0], stack[-1][6]) if stack else (None, None)
    open_paths = [entry[6] for entry in stack]
    if tree is not None:
        path = tree.path(named, parent, parent_path, open_paths)
        if path is None and stack and tree.named_in != local.forwards:
            tree.rename(local.forwards)  # a module added since it was named
            path = tree.path(named, parent, parent_path, open_paths)
    if path is None:
        # A module outside the root's tree (created on the fly): named under
        # its caller.
        parent = parent_path if tree is not None else None
        parent = parent or ""
        path = f"{parent}.<{type(named).__name__}>" if parent else type(named).__name__
    cls = type(named)
    qualname, file, line = _class_source(state, cls)
    inputs = _tensors(args)
    if kwargs:
        inputs += _tensors(kwargs)
    call_id = _enter(path, cls.__name__, qualname, file, line, is_root, inputs)
    stack.append((module, call_id, len(inputs), kwargs is not None, tree, None, path))


_GraphModule = getattr(getattr(torch, "fx", None), "GraphModule", ())
# Where a GraphModule's call passes through before its hooks, and where the
# shim's hooks are.
_CALL_FILES = ("/torch/nn/modules/module.py", "/torch/fx/graph_module.py",
               "/torch/fx/_lazy_graph_module.py", "/ekka/trace.py")
_BACKEND_DIRS = ("/torch/_dynamo/", "/torch/_functorch/", "/torch/_inductor/")


def _run_by_backend():
    """Whether the GraphModule being called is run by a compile backend's
    runtime, as aot_eager's runs its forward and backward graphs: compiled
    code, whose modules are not recorded (its ops are, under the call open
    around it). Recorded, its inputs would be every parameter of the model,
    captured at every step. A GraphModule the program calls (an exported
    program's module) is recorded."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.replace("\\", "/").endswith(_CALL_FILES):
        frame = frame.f_back
    if frame is None:
        return False
    name = frame.f_code.co_filename.replace("\\", "/")
    return any(part in name for part in _BACKEND_DIRS)


def _runs_compiled(local, top, module):
    """Whether `module`'s call is the one that the compiled call open around
    it runs, not a call of its own: where the compiled code runs as it is
    (TORCH_COMPILE_DISABLE=1, or Dynamo falling back to the frame) the
    hooks fire again inside, for the OptimizedModule's `_orig_mod`, or for
    a module compiled in place (`_recorded_call`). Recorded once."""
    if top is module:
        return getattr(local, "compiled_call", None) is module
    return _is_optimized(top) and _compiled(top) is module


def _compiled(module):
    """The module that a module call runs: torch.compile(module)'s
    OptimizedModule's is the module it compiled (its ``_orig_mod``), whose
    compiled call it is; it is recorded as that module's call, with that
    module's path and class. (The binding's hooks know no OptimizedModule's
    class, state.sources holds the compiled module's: its calls come to
    _before and _after.)"""
    while _is_optimized(module):
        inner = module._modules.get("_orig_mod")
        if inner is None:
            break
        module = inner
    return module


def _is_optimized(module):
    cls = type(module)
    return cls.__name__ == "OptimizedModule" and cls.__module__ == "torch._dynamo.eval_frame"


def _direct_forward(module):
    """A module called from no other module's hooks may still run inside a
    module whose ``forward`` was called directly, bypassing the hooks
    (SGLang's model runner calls ``model.forward(input_ids, positions,
    forward_batch)``; the model then calls ``self.model(...)``). That module
    is found on this thread's Python stack: the outermost ``forward`` frame
    whose ``self`` is a module holding ``module``. Its (frame, module), or
    None. Only ``forward`` frames count: a long-running method of a module
    that holds the model (a generation loop) is not one forward step."""
    found = None
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "forward" and code.co_argcount and code.co_varnames[0] == "self":
            owner = frame.f_locals.get("self")
            if isinstance(owner, torch.nn.Module) and owner is not module and \
                    any(m is module for m in owner.modules()):
                found = (frame, owner)
        frame = frame.f_back
    return found


def _begin_step(local, trees, module, tree):
    """A root call of `module` begins a forward step on this thread: in
    `tree` (its root's), or a new tree of its own. Returns the tree."""
    local.forwards = getattr(local, "forwards", 0) + 1
    if tree is None:
        tree = trees[id(module)] = _new_tree(trees, module)
    local.current = tree
    return tree


def _after_forward(local, module):
    """Whether a root-level call of `module` belongs to the forward step
    begun last on this thread: after that forward, a submodule of its model
    was called on its own (vLLM's compute_logits calls the logits
    processor so), and `module` holds no parameters or buffers (vLLM's
    Sampler): it computes on what the step produced. A module with weights
    (a draft model, a second model) begins a step, and so does one after a
    forward alone."""
    if getattr(local, "called_after", None) != getattr(local, "forwards", 0):
        return False
    current = getattr(local, "current", None)
    root = current.root() if current is not None else None
    if root is None or root is module:
        return False
    return next(module.parameters(), None) is None and next(module.buffers(), None) is None


def _generating(module):
    """The generation model (a module with a ``generate`` method: HF's
    GenerationMixin) whose method, on this thread's Python stack, calls
    `module` that it holds, outermost first; or None. HF's generate() of an
    encoder-decoder model runs the encoder alone first (`get_encoder()`),
    then the whole model at each step: the encoder is named in the whole
    model's tree (`model.encoder`), not a root of its own whose paths would
    lack the prefix. Asked of a root-level call of a module that is no
    root of its own (a new root, or a submodule called on its own)."""
    found = None
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_argcount and code.co_varnames[0] == "self":
            owner = frame.f_locals.get("self")
            if isinstance(owner, torch.nn.Module) and owner is not module and \
                    callable(getattr(type(owner), "generate", None)) and \
                    any(m is module for m in owner.modules()):
                found = owner
        frame = frame.f_back
    return found


# The key under which a directly called root's forward frame is marked (in
# its frame's locals, which hold it while the frame lives): the shim holds
# the mark, not the frame, so nothing of the frame outlives its return.
_ROOT_MARK = "__ekka_direct_root__"


def _running(marker):
    """Whether the forward frame marked with `marker` (its code, the mark)
    is still on this thread's Python stack."""
    code, mark = marker
    f = sys._getframe(2)
    while f is not None:
        if f.f_code is code and f.f_locals.get(_ROOT_MARK) is mark:
            return True
        f = f.f_back
    return False


def _open_direct(state, local, trees, stack, frame, owner):
    """Enters the call of `owner`, whose forward (running in `frame`) was
    called directly, as a root: a forward step, with the tensors among its
    named parameters as inputs (their values now, at its first submodule's
    call). It stays open on the stack until its frame has returned (checked
    at the next call that would be a root, or when tracing stops); the frame
    is marked in its locals, not held. A module of a live root's tree
    keeps its path there and starts no step: a layer whose forward
    gradient checkpointing runs again in the backward pass (HF's
    GradientCheckpointingLayer checkpoints `forward`, not the call), or one
    called on its own after its root's forward."""
    tree = trees.get(id(owner))
    if tree is not None and tree.root() is not owner:
        tree = None
    held = _tree_holding(local, owner) if tree is None else None
    root = held is None
    tree = _begin_step(local, trees, owner, tree) if root else held
    code = frame.f_code
    named = code.co_varnames[1:code.co_argcount + code.co_kwonlyargcount]
    values = frame.f_locals
    inputs = _tensors([values.get(name) for name in named])
    mark = object()
    values[_ROOT_MARK] = mark
    qualname, file, line = _class_source(state, type(owner))
    path = tree.path(owner) or ""
    call_id = _enter(path, type(owner).__name__, qualname, file, line, root, inputs)
    marker = (code, mark)
    stack.append((owner, call_id, len(inputs), True, tree, marker, path))
    del values
    _watch_return(frame, marker)
    del frame
    # Not from the backward pass (a checkpoint's recompute): the class's
    # forward is the program's there, whose identity HF's checkpointing
    # layer checks (wrapped, the layer stops checkpointing).
    if _current_graph_task() == -1:
        _hook_direct_calls(owner)
    return tree


# The autograd graph task this thread runs a backward pass for, -1 if none.
_current_graph_task = getattr(torch._C, "_current_graph_task_id", lambda: -1)


def _watch_return(frame, marker):
    """This first direct call's output: a profile function on this thread
    sees its forward frame return, with the value it returns, and closes the
    call with it there, as the post-hook closes a hooked call, so that the
    ops after it (sampling) are outside it too. It runs at every call and
    return on this thread until then (one forward), and is removed at once.
    Not where the program has a profile function of its own (cProfile
    before Python 3.12, yappi, pyinstrument): the call is then closed as
    before, its output unseen. Nor for a generator or coroutine `forward`
    (a profile function sees each suspension as a return). The frame is
    known by its id and code, and the call by the mark `_open_direct` gave
    it (`marker`): neither is held."""
    global _watcher
    code = frame.f_code
    if sys.getprofile() is not None or code.co_flags & _SUSPENDS:
        return
    target = id(frame)

    def watch(f, event, arg):
        global _watcher
        if event != "return" or f.f_code is not code or id(f) != target:
            return
        sys.setprofile(None)
        if _watcher is watch:
            _watcher = None
        state = _state
        stack = getattr(state.local, "stack", None) if state is not None else None
        # Only the call this watch was set for, still open at the stack's
        # bottom (its children's calls, if one raised, above it).
        if not stack or stack[0][5] is not marker or not state.active or _not_traceable():
            return
        try:
            outputs = _tensors(arg, True)
        except Exception:  # an output pytree cannot flatten: not worth the program's return
            outputs = []
        del stack[1:]
        _close_direct(stack, outputs)

    _watcher = watch
    sys.setprofile(watch)


_watcher = None  # the last profile function _watch_return set
_SUSPENDS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _hook_direct_calls(owner):
    """The later direct calls of `owner.forward` are whole module calls: its
    class's `forward` is wrapped, while tracing runs, in one that runs the
    shim's hooks around it when it is called directly, not through
    `module(...)` (whose hooks opened the call already), so that they see
    the call's output, and the ops after it are outside it. It has the
    original's signature, for code that reads it. On the class, not the
    instance: copies of the model, shallow or deep, and pickles hold nothing
    of the shim's. Not where the instance has a `forward` of its own
    (accelerate's hooks set one), nor for instances of a subclass."""
    cls = type(owner)
    if "forward" in vars(owner) or cls in _hooked_classes:
        return
    original = cls.forward

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        if _compiling_here() or type(self) is not cls:
            return original(self, *args, **kwargs)
        state = _state
        stack = getattr(state.local, "stack", None) if state is not None else None
        # Called through self(...): its hooks opened its call already. (Not
        # a call recovered from the stack, still open: that one has returned.)
        hooked = stack and stack[-1][0] is self and stack[-1][5] is None
        if state is None or not state.active or hooked or _not_traceable():
            return original(self, *args, **kwargs)
        _pre_hook(self, args, kwargs)
        try:
            output = original(self, *args, **kwargs)
        except BaseException:
            _post_hook(self, args, None)  # as PyTorch calls it for a call that raised
            raise
        _post_hook(self, args, kwargs, output)
        return output

    _hooked_classes[cls] = (forward, cls.__dict__.get("forward"))
    cls.forward = forward


# The classes whose forward _hook_direct_calls wrapped: the wrapper, and the
# class's own forward before (None: it inherited one).
_hooked_classes = {}


def _close_direct(stack, outputs=()):
    """Exits a directly called root's call, with its `outputs` where they
    were seen (_watch_return)."""
    _, call_id, positional, _, _, _, _ = stack.pop()
    _exit(call_id, list(outputs), [], positional)


_pre_hook_id = _post_hook_id = None  # the global hooks' handle ids


class _Tree:
    """A root module's tree: its modules' paths, prefixed for a root that is
    not the first (a draft model next to the target model). The root is
    held weakly: tracing must not keep a model alive.

    `names` maps a module's id to its name, (path, owner, key): the module
    it is an attribute of (a weak reference; None for the root) and that
    attribute's name. A module at several paths (vLLM's get_rope() gives
    every layer one RotaryEmbedding) has a list of them, in named_modules()
    order. The Python binding's `before` reads names as this
    does (`path`)."""

    def __init__(self, root, prefix):
        self.root = weakref.ref(root)
        self.prefix = prefix
        self.named_in = None
        self.names = {}
        self.rename(None)

    def rename(self, forward):
        root = self.root()
        self.named_in = forward
        if root is None:
            self.names = {}
            return
        names = _names_of(root)
        if self.prefix:
            names = {k: self.prefixed(v) for k, v in names.items()}
        self.names = names

    def prefixed(self, name):
        if type(name) is list:
            return [self.prefixed(n) for n in name]
        path, owner, key = name
        return (f"{self.prefix}.{path}" if path else self.prefix, owner, key)

    def path(self, module, parent=None, parent_path=None, open_paths=()):
        """The path of `module`'s call, made from the call of `parent` at
        `parent_path` (None: no call open) inside the calls at `open_paths`
        (outermost first), or None where it has none in this tree. Of
        several paths, as _under chooses. A module that is no longer where it was named (a pruned
        layer list, swapped modules, a dead module's id reused) renames the
        tree first: paths follow named_modules() as it is now."""
        name = self.names.get(id(module))
        if name is None:
            return None
        if type(name) is list:
            name = _under(name, parent_path, open_paths)
        if not self.still_named(module, name, parent):
            self.rename(self.named_in)
            name = self.names.get(id(module))
            if name is None:
                return None
            if type(name) is list:
                name = _under(name, parent_path, open_paths)
        return name[0]

    def still_named(self, module, name, parent):
        """Whether `module` is still the attribute its `name` says, and its
        owner too, up to `parent` (the module whose call is open around
        it), or the root: one dictionary look-up for a call of a child."""
        while True:
            _, owner, key = name
            if owner is None:  # the root
                return True
            owner = owner()
            modules = getattr(owner, "_modules", None)
            if not isinstance(modules, dict) or modules.get(key) is not module:
                return False
            if owner is parent:
                return True
            module, name = owner, self.names.get(id(owner))
            if type(name) is not tuple:
                return name is not None  # several paths: not followed up


def _tree_holding(local, module):
    """The tree of a live root that `module` belongs to (the last root's
    first), or None. From the backward pass, another thread's too: on a
    GPU, autograd runs it on a thread of its own, where a gradient
    checkpoint's recompute calls the layers of the forward thread's model."""
    current = getattr(local, "current", None)
    candidates = ([current] if current is not None else []) + \
        [t for t in local.trees.values() if t is not current]
    if _current_graph_task() != -1:
        with _live_trees_lock:
            others = list(_live_trees)
        candidates += [t for t in others if t not in candidates]
    for tree in candidates:
        if tree.root() is not None and id(module) in tree.names:
            return tree
    return None


# Every thread's trees, for the backward pass's threads (_tree_holding).
_live_trees = weakref.WeakSet()
_live_trees_lock = threading.Lock()


def _new_tree(trees, module):
    """The tree of a new root. Earlier roots inside it (a program that ran
    its inner model alone first) are part of it now and leave the registry.
    The first root alive gets the path "", as a single root always does; a
    later, unrelated one (a draft model beside the target) is named by its
    class, `<LlamaForCausalLM>`, numbered when two share a class
    (`<LlamaForCausalLM>#2`), so that the two trees' paths do not collide.
    Only live roots hold names: a freed root's goes to the next new one, so
    a program that replaces its model keeps its paths ("" again)."""
    tree = _Tree(module, "")
    with _live_trees_lock:
        _live_trees.add(tree)
    for key, other in list(trees.items()):
        if other.root() is None or id(other.root()) in tree.names:
            del trees[key]
    taken = {t.prefix for t in trees.values()}
    if "" in taken:
        base = f"<{type(module).__name__}>"
        prefix, n = base, 1
        while prefix in taken:
            n += 1
            prefix = f"{base}#{n}"
        tree.prefix = prefix
        tree.rename(None)
    return tree


def _under(names, parent_path, open_paths=()):
    """Of a module's several names, the one whose owner's call is open,
    outermost: a module owned by a model's block and lent to a helper
    module it calls keeps the block's name, the one its weights load
    under (vLLM's MoE router `mlp.gate`, called by the fused-experts
    runner `mlp.experts`; its shared expert `mlp.shared_expert`). Else the
    one under `parent_path`, else the first. One module of every layer
    (vLLM's rotary embedding) is each layer's: only that layer's owner is
    open."""
    outermost = None
    depth = {}
    for i, open_path in enumerate(open_paths):
        depth.setdefault(open_path, i)
    for name in names:
        d = depth.get(name[0].rpartition(".")[0])
        if d is not None and (outermost is None or d < outermost[0]):
            outermost = (d, name)
    if outermost is not None:
        return outermost[1]
    if parent_path:
        prefix = parent_path + "."
        for name in names:
            if name[0].startswith(prefix):
                return name
    return names[0]


def _names_of(root):
    """The paths of a root's modules. Each is also marked to give the global
    pre-hook its keyword arguments: PyTorch's global pre-hooks get only the
    positional ones, unless a module lists the hook among its own
    with-kwargs hooks. So HF's `hidden_states=` is recorded at the call's
    entry, before the module can change it in place. An OptimizedModule
    (torch.compile(module)) and the module it compiled share a path: its
    own, `layers.0`, not `layers.0._orig_mod`. See _Tree for what names
    are."""
    names = {}
    modules = {}  # named_modules()'s own names: where the owners are
    optimized = []  # the paths of OptimizedModules: theirs is their module's
    for name, m in root.named_modules(remove_duplicate=False):
        modules[name] = m
        owner_name, _, key = name.rpartition(".")
        owner = modules.get(owner_name) if name else None
        try:
            owner = weakref.ref(owner) if owner is not None else None
        except TypeError:  # a class with __slots__ and no __weakref__: not checked
            owner = None
        for path in optimized:
            inner = f"{path}._orig_mod" if path else "_orig_mod"
            if name == inner or name.startswith(inner + "."):
                rest = name[len(inner):]
                name = path + rest if path else rest[1:]
        if _is_optimized(m):
            optimized.append(name)
        entry = (name, owner, key)
        known = names.get(id(m))
        if known is None:
            names[id(m)] = entry
        elif type(known) is list:
            known.append(entry)
        else:
            names[id(m)] = [known, entry]
        with_kwargs = getattr(m, "_forward_pre_hooks_with_kwargs", None)
        if _pre_hook_id is not None and isinstance(with_kwargs, dict):
            with_kwargs[_pre_hook_id] = True
            _marked.add(m)
    return names


def _after(module, args, *rest):
    # PyTorch passes (kwargs, output) normally, but only (output) when it
    # calls an always_call hook for a forward that raised.
    kwargs, output = (rest[0], rest[1]) if len(rest) == 2 else ({}, None)
    stack = getattr(_state.local, "stack", None)
    if not stack or _traced_otherwise():  # _post_hook asked of torch.compile
        return
    # Unwind to this module: a call that raised left without its exit. One
    # not open at all (a compiled call's own, recorded once) unwinds nothing.
    if not any(entry[0] is module for entry in stack):
        return
    while stack and stack[-1][0] is not module:
        stack.pop()
    if not stack:
        return
    _, call_id, positional, kwargs_seen, _, _, _ = stack.pop()
    # Keyword arguments the pre-hook did not see (a module outside a named
    # tree) are recorded here, as the inputs after the positional ones.
    try:
        outputs = _tensors(output, True)
        keywords = _tensors(kwargs) if kwargs and not kwargs_seen else []
    except BaseException:
        # Outputs it cannot walk (a list that holds itself): the call ends
        # without them, so that what its caller does next is not its.
        _exit(call_id, [], [], positional)
        raise
    _exit(call_id, outputs, keywords, positional)


# The modules whose with-kwargs set names the global pre-hook (_names_of):
# the mark is taken back when tracing stops, so that a model saved or sent
# to another process afterwards carries no hook id of this one's (where a
# hook of its own with that id would be called with keyword arguments).
_marked = weakref.WeakSet()


def _unmark():
    for m in list(_marked):
        with_kwargs = getattr(m, "_forward_pre_hooks_with_kwargs", None)
        if isinstance(with_kwargs, dict):
            with_kwargs.pop(_pre_hook_id, None)
    _marked.clear()
    for cls, (wrapper, own) in list(_hooked_classes.items()):
        if cls.__dict__.get("forward") is wrapper:  # not if wrapped again since
            if own is None:
                del cls.forward
            else:
                cls.forward = own
    _hooked_classes.clear()


def _stop():
    global _watcher
    _unmark()
    if _watcher is not None and sys.getprofile() is _watcher:
        sys.setprofile(None)
    _watcher = None
    # A directly called root still open on this thread ends with tracing.
    stack = getattr(_state.local, "stack", None) if _state is not None else None
    while stack:
        entry = stack.pop()
        if entry[5] is not None:
            _exit(entry[1], [], [], entry[2])
    summary = _unseen(torch.ops.ekka.stop)
    if summary.startswith("error: "):
        print(f"ekka-trace: {summary}", file=sys.stderr)
    elif "; warning: " in summary and not os.environ.get("EKKA_TRACE_SUMMARIZES"):
        # (ekka-trace's summary names every trace's losses.)
        print(f"ekka-trace: warning: {summary.split('; warning: ', 1)[1]}", file=sys.stderr)
    return summary


class Trace:
    """Traces a region of this program into a trace directory, as
    ``ekka-trace -o DIR`` traces a whole program::

        import ekka.trace
        with ekka.trace.Trace("ref.trace"):
            model(ids)
        with ekka.trace.Trace("tgt.trace", capture_ops="^zoo::"):
            engine.generate(prompt, 4)

    One program can so write several traces without starting again (the
    zoo runs its three sides in one process). The runtime library comes
    from ``runtime_library`` or ``$EKKA_RUNTIME_LIB``. Processes forked
    inside the region (ranks) trace into ``rank-N/`` as under ekka-trace.
    Options are ekka-trace's, named alike: ``capture`` ("modules" or
    "none"), ``capture_modules``, ``capture_ops`` (regular expressions),
    ``capture_op_inputs``, ``op_stats``, ``steps``, ``budget`` (MiB; a
    fraction of one too), ``no_gpu_kernels``, ``timings``, ``framework``;
    ``force`` replaces an existing trace in the directory, which is
    otherwise an error. Not for a program already run under ekka-trace.
    After the region, ``summary`` is the runtime's line for the trace
    ("N module calls, N ops, N kernels, N tensors, N bytes captured", then
    "; warning: ..." if it lacks records; "error: ..." if it could not be
    closed; "" if no module ran), not ekka-trace's summary."""

    def __init__(self, trace_dir, capture="modules", capture_modules=None, capture_ops=None,
                 steps=None, framework=None, force=False, runtime_library=None,
                 capture_op_inputs=False, timings=False, op_stats=False, budget=None,
                 no_gpu_kernels=False):
        self.trace_dir = os.path.abspath(trace_dir)
        options = []
        if capture == "none":
            options.append("capture=none")
        if capture_op_inputs:
            if capture_ops is None:
                raise ValueError("ekka.trace.Trace: capture_op_inputs needs capture_ops")
            options.append("op_inputs=1")
        if op_stats:
            options.append("op_stats=1")
        if timings:
            options.append("timings=1")
        if budget:  # MiB, as ekka-trace's --budget; 0 or None: no limit
            if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget < 0:
                raise ValueError("ekka.trace.Trace: budget is a number of MiB (0: no limit)")
            options.append(f"budget={max(1, int(budget * (1 << 20)))}")
        if no_gpu_kernels:
            options.append("gpu_kernels=off")
        for key, value in (("modules", capture_modules), ("ops", capture_ops),
                           ("steps", steps), ("framework", framework)):
            if value is not None:
                if ";" in str(value):
                    raise ValueError(f"ekka.trace.Trace: {key} may not contain ';'")
                options.append(f"{key}={value}")
        self.options = "".join(o + ";" for o in options)
        self.force = force
        self.runtime_library = runtime_library
        self.summary = ""

    def __enter__(self):
        if _state is not None and (os.environ.get("EKKA_TRACE_DIR") or _state.active):
            raise RuntimeError("ekka.trace.Trace: this process is traced already "
                               "(under ekka-trace, or inside another Trace)")
        if _state is None:
            _runtime_library(self.runtime_library)  # before touching the directory
        holds = any(os.path.exists(os.path.join(self.trace_dir, *p, "trace.db"))
                    for p in ((), ("rank-0",)))
        if holds:
            if not self.force:
                raise FileExistsError(f"'{self.trace_dir}' already holds a trace "
                                      "(force=True replaces it)")
            _remove_trace(self.trace_dir)
        os.makedirs(self.trace_dir, exist_ok=True)
        install(self.trace_dir, self.options, self.runtime_library)
        _state.trace_dir, _state.base_options = self.trace_dir, self.options
        _state.started, _state.active = False, True
        _mark_started(self.trace_dir)
        _forget_roots()
        return self

    def __exit__(self, *exc):
        if _state.started:
            self.summary = _stop()
        _state.started = _state.active = False
        _forget_roots()
        return False


def _forget_roots():
    """A region starts without what an earlier one saw of module trees."""
    local = _state.local
    for name in ("stack", "trees", "current", "forwards"):
        if hasattr(local, name):
            delattr(local, name)


def _remove_trace(trace_dir):
    """What a trace is, and only that (ekka-trace --force does the same):
    the database, its shards, and rank and process subdirectories."""
    import glob
    import shutil
    for path in glob.glob(os.path.join(trace_dir, "trace.db*")) + \
            glob.glob(os.path.join(trace_dir, "tensors-*.safetensors")):
        os.remove(path)
    for path in glob.glob(os.path.join(trace_dir, "rank-*")) + \
            glob.glob(os.path.join(trace_dir, "process-*")):
        shutil.rmtree(path)


def _after_fork_in_child():
    # The runtime forgot the parent's trace (pthread_atfork); a child that
    # runs modules starts its own, in a process-PID directory.
    global _start_lock
    _start_lock = threading.RLock()  # another thread may have held it at the fork
    if _state is not None:
        _state.started = _state.starting = _state.start_ok = False
        _state.stack = []
        # multiprocessing clears a forked child's finalizers: the child's
        # own trace needs its exit handlers registered again.
        _state.exit_handlers = False


def _traced_now():
    """Whether this process's trace has started (and not failed to)."""
    state = _state
    return state is not None and state.started and state.start_ok


def _writing_out_first(real):
    """os.execv and os.execve (which os.execl, os.execle, os.execlp,
    os.execvp and os.execvpe call) write the trace out first, with what a
    stop writes of it: the new program would lose what the runtime has not
    written yet, and leave the trace unclosed. Tracing goes on: an exec
    that fails leaves the program in the same trace."""
    @functools.wraps(real)
    def exec_after_writing_out(*args, **kwargs):
        traced = _traced_now()
        if traced:
            try:
                error = _unseen(torch.ops.ekka.flush)
                if error:
                    print(f"ekka-trace: {error}", file=sys.stderr)
            except Exception:  # the exec must happen as it would untraced
                pass
        try:
            return real(*args, **kwargs)
        except BaseException:
            if traced:  # it failed: the trace is open again
                try:
                    _unseen(torch.ops.ekka.exec_failed)
                except Exception:
                    pass
            raise
    return exec_after_writing_out


def _stopping_first(real):
    """os._exit skips atexit, where tracing stops: the trace is stopped
    first, as at a normal exit (a program that ends its processes with
    os._exit to skip what would hang, a multiprocessing child). A thread
    that a SIGTERM's flush holds still stands still here too, so the
    process does not end before the trace is written."""
    @functools.wraps(real)
    def exit_after_stopping(*args, **kwargs):
        if _traced_now():
            try:
                _stop()
            except BaseException:  # the process ends as it would untraced
                pass
        return real(*args, **kwargs)
    return exit_after_stopping


def _wrap_export():
    """torch.export's export and draft_export, strict, fail on any global
    module hook (their Dynamo then traces the module's __call__, which
    reaches a wrapper of torch's own that it will not trace): the shim's
    hooks are taken out of PyTorch's while a program exports, and put back
    where they were. Nothing is lost: under export, strict or not, the
    hooks record nothing (it compiles). A module call on another thread
    meanwhile is not recorded. The private torch.export._trace._export,
    which torch._export's aot_compile, converter and report_exportability
    call, is wrapped too, once imported (export reaches it through the
    wrapped one: nested, it finds the hooks out already)."""
    _unhook_while(torch.export, "export", "draft_export")
    _when_imported("torch.export._trace",
                   lambda trace: _unhook_while(trace, "_export"))


def _unhook_while(owner, *names):
    for name in names:
        export = getattr(owner, name, None)
        if export is not None and not getattr(export, "_ekka_wrapped", False):
            setattr(owner, name, _without_hooks(export))


def _without_hooks(export):
    @functools.wraps(export)
    def export_without_hooks(*args, **kwargs):
        # Imported first: the Python hooks may take the C ones' places then
        # (_hooks_in_graph), which must happen before they are taken out.
        import torch._dynamo  # noqa: F401
        hooks = torch.nn.modules.module
        tables = [(table, key, list(table)) for table, key in (
            (hooks._global_forward_pre_hooks, _pre_hook_id),
            (hooks._global_forward_hooks, _post_hook_id),
            (getattr(hooks, "_global_forward_hooks_with_kwargs", {}), _post_hook_id),
            (getattr(hooks, "_global_forward_hooks_always_called", {}), _post_hook_id))]
        taken = [table.pop(key, _MISSING) for table, key, _ in tables]
        try:
            return export(*args, **kwargs)
        finally:
            for (table, key, order), value in zip(tables, taken):
                if value is not _MISSING and key not in table:
                    now = dict(table)
                    now[key] = value
                    table.clear()
                    for k in order + [k for k in now if k not in order]:
                        if k in now:
                            table[k] = now[k]

    export_without_hooks._ekka_wrapped = True
    return export_without_hooks


_MISSING = object()


def _wrap_module_compile():
    """Module.compile() compiles the module's whole call, the global hooks
    in it: traced by Dynamo, they record nothing, and a program whose model
    was compiled so ran "no module". Its compiled call is recorded around
    it, as the hooks record an uncompiled call; within it, its ops (as under
    torch.compile(module), whose OptimizedModule's call the hooks see)."""
    compile = torch.nn.Module.__dict__.get("compile")
    if compile is None or getattr(compile, "_ekka_wrapped", False):
        return

    @functools.wraps(compile)
    def compile_recorded(self, *args, **kwargs):
        result = compile(self, *args, **kwargs)
        compiled = self.__dict__.get("_compiled_call_impl")
        if compiled is not None:
            self._compiled_call_impl = _recorded_call(self, compiled)
        return result

    compile_recorded._ekka_wrapped = True
    torch.nn.Module.compile = compile_recorded


def _recorded_call(module, compiled):
    """`compiled`, a module's compiled call, with the global hooks' calls
    around it, as PyTorch's _call_impl makes them (where a compiling caller
    traces it, they record nothing)."""
    def call(*args, **kwargs):
        _pre_hook(module, args, kwargs)
        local = _state.local if _state is not None else None
        outer = getattr(local, "compiled_call", None)
        if local is not None:
            local.compiled_call = module
        try:
            result = compiled(*args, **kwargs)
        except Exception:
            _post_hook(module, args, None)
            raise
        finally:
            if local is not None:
                local.compiled_call = outer
        _post_hook(module, args, kwargs, result)
        return result

    return call


def _hide_hooks_from_compile_warning():
    """torch.compile(module) warns every program that has global module
    hooks that they are called for its OptimizedModule too: a warning the
    untraced program does not print (an error under -W error or pytest's
    filterwarnings = error). The shim's record the OptimizedModule's call as
    the module it compiled (_compiled), and nothing is recorded twice: the
    question PyTorch asks before it warns, its only use, leaves the shim's
    hooks out (a hook of the program's is still warned about)."""
    hooks = torch.nn.modules.module
    theirs = getattr(hooks, "_has_any_global_hook", None)
    if theirs is None or getattr(theirs, "_ekka_wrapped", False):
        return
    tables = ("_global_backward_pre_hooks", "_global_backward_hooks",
              "_global_forward_pre_hooks", "_global_forward_hooks",
              "_global_forward_hooks_always_called", "_global_forward_hooks_with_kwargs")

    @functools.wraps(theirs)
    def has_any_global_hook_but_ekkas():
        ours = (_pre_hook_id, _post_hook_id)
        return any(key not in ours for name in tables for key in getattr(hooks, name, ()))

    has_any_global_hook_but_ekkas._ekka_wrapped = True
    hooks._has_any_global_hook = has_any_global_hook_but_ekkas


def _watch_compiles(dynamo):
    """While Dynamo compiles, the ops it runs on real tensors (detaching the
    inputs to make fakes of them, guards) and the kernels it launches
    (Inductor's autotuning) are its own, not the program's: the runtime
    records none of the compiling thread's meanwhile. Each compile on each
    thread says so (torch.ops.ekka.aside, a depth of the thread's), from
    where Dynamo installs its compile callbacks around it
    (callback_handler.install_callbacks, on the compiling thread, for
    Dynamo's compiles and lazy backward compiles: not a CUDA graph's
    recording, whose first replay is the program's). Overlapping compiles
    on several threads are each their own thread's: the callbacks alone
    fire at the first start and the last end, wherever they are, and are
    what a torch without install_callbacks is watched by (then a thread's
    ops between its compile's end and another's may be taken for the
    compile's; torch.ops.ekka.compiling)."""
    handler = getattr(dynamo, "callback_handler", None)
    install = getattr(handler, "install_callbacks", None)
    if callable(install) and getattr(install, "_ekka_aside", False):
        return
    if callable(install):
        @functools.wraps(install)
        @contextlib.contextmanager
        def install_callbacks(*args, **kwargs):
            # Inside the context: the compile callbacks that it runs as it
            # opens and closes are the program's (a program's own
            # on_compile_end callback that runs ops has them recorded).
            trigger = args[0] if args else kwargs.get("trigger")
            with install(*args, **kwargs), \
                    (_aside() if _compiles(trigger) else contextlib.nullcontext()):
                yield

        install_callbacks._ekka_aside = True
        try:
            handler.install_callbacks = install_callbacks
            return
        except (AttributeError, TypeError):  # a handler with slots: the callbacks
            pass
    if handler is None or not isinstance(getattr(handler, "start_callbacks", None), list) or \
            not isinstance(getattr(handler, "end_callbacks", None), list):
        return

    def watch():
        if _compile_started not in handler.start_callbacks:
            handler.start_callbacks.insert(0, _compile_started)
        if _compile_ended not in handler.end_callbacks:
            handler.end_callbacks.insert(0, _compile_ended)

    watch()
    reset = dynamo.reset

    @functools.wraps(reset)
    def reset_watching(*args, **kwargs):
        try:
            return reset(*args, **kwargs)
        finally:
            watch()

    dynamo.reset = reset_watching


def _compiles(trigger):
    """Whether Dynamo's callback trigger is a compile's (Dynamo's, a lazy
    backward's), not a CUDA graph's recording, whose first replay is the
    program's."""
    return getattr(trigger, "name", "DYNAMO") in ("DYNAMO", "LAZY_BACKWARD")


@contextlib.contextmanager
def _aside():
    """This thread's ops and launches meanwhile are not the program's
    (torch.ops.ekka.aside; they nest). Never raises into what it wraps."""
    aside = torch.ops.ekka.aside.default
    try:
        _unseen(aside, True)
        entered = True
    except Exception:
        entered = False
    try:
        yield
    finally:
        if entered:
            try:
                _unseen(aside, False)
            except Exception:
                pass


def _compile_started(args=None):
    if _compiles(getattr(args, "callback_trigger", None)):
        try:
            _unseen(torch.ops.ekka.compiling, True)
        except Exception:  # never into the compile
            pass


def _compile_ended(args=None):
    try:
        _unseen(torch.ops.ekka.compiling, False)
    except Exception:
        pass


def _set_aside(run):
    """`run`, wrapped so that its ops and launches on this thread are not
    recorded (torch.ops.ekka.aside)."""
    @functools.wraps(run)
    def aside(*args, **kwargs):
        with _aside():
            return run(*args, **kwargs)

    aside._ekka_aside = True
    return aside


def _unrecorded(run):
    """`run`, wrapped so that what it runs on this thread is no module call,
    op or launch of the program's: its calls are then roots, which _before
    leaves alone while `unrecorded` is set, and the C hooks, which take only
    calls with one open, leave to it; its ops are set aside. Inside a
    module's forward too (a module that traces a child): the thread's stack
    is set aside meanwhile."""
    @functools.wraps(run)
    def unrecorded(*args, **kwargs):
        local = _state.local if _state is not None else None
        if local is None:
            return run(*args, **kwargs)
        was = getattr(local, "unrecorded", False)
        stack = getattr(local, "stack", None)
        local.unrecorded, local.stack = True, []
        try:
            with _aside():
                return run(*args, **kwargs)
        finally:
            local.unrecorded = was
            if stack is None:
                del local.stack
            else:
                local.stack = stack

    unrecorded._ekka_aside = True
    return unrecorded


def _wrap_method(owner, name, wrap, module):
    """Replaces `owner.name` in `module` (`owner` None: the module's own
    function) by `wrap` of it, once: a method defined there, not inherited."""
    holder = getattr(module, owner, None) if owner else module
    run = getattr(holder, "__dict__", {}).get(name)
    if not callable(run) or getattr(run, "_ekka_aside", False):
        return
    setattr(holder, name, wrap(run))


# Work on the program's thread that is not the program's own, by module:
# - the autotuners' benchmark runs (Triton's @triton.autotune, in kernel
#   libraries, and Inductor's, which tunes the kernels torch.compile
#   generates at their first launch) run a configuration of a kernel,
#   cloning, zeroing and restoring its arguments around each launch: their
#   ops and launches are set aside; the configuration then launched for the
#   program is recorded;
# - torch.jit.trace checks what it traced by running the module eagerly once
#   more (the hooks are skipped while it traces), which would shift the
#   steps of the program's own forwards, and torch.fx's symbolic tracer
#   (symbolic_trace, HF's fx tracer, make_fx) calls the modules that are no
#   leaf with Proxies: their runs are no step (_unrecorded).
_WRAPPED_METHODS = {
    "triton.runtime.autotuner": ("Autotuner", "_bench", _set_aside),
    "torch._inductor.runtime.triton_heuristics": ("CachingAutotuner", "bench", _set_aside),
    "torch.jit._trace": (None, "_check_trace", _unrecorded),
    "torch.fx._symbolic_trace": ("Tracer", "trace", _unrecorded),
}


def _wrap_init_process_group(dist):
    """A rank whose environment says so only as it joins its group (mp.spawn
    workers set RANK and WORLD_SIZE themselves, after importing torch)
    leaves its start marker then."""
    real = getattr(dist, "init_process_group", None)
    if real is None or getattr(real, "_ekka_marks", False):
        return

    @functools.wraps(real)
    def init_process_group_marked(*args, **kwargs):
        result = real(*args, **kwargs)
        state = _state
        if state is not None and (os.environ.get("EKKA_TRACE_DIR") or state.active):
            _mark_started(state.trace_dir)
        return result
    init_process_group_marked._ekka_marks = True
    dist.init_process_group = init_process_group_marked


def _wrap_exec():
    import posix  # os's own: a program may call posix.execv directly

    for name, wrap in (("execv", _writing_out_first), ("execve", _writing_out_first),
                       ("_exit", _stopping_first)):
        real = getattr(os, name)
        wrapped = wrap(real)
        setattr(os, name, wrapped)
        if getattr(posix, name, None) is real:
            setattr(posix, name, wrapped)
        if real in os.supports_fd:  # os.execve takes a file descriptor
            os.supports_fd.add(wrapped)


def install(trace_dir, options="", runtime_library=None):
    """Starts observing every nn.Module call of this process."""
    global _state
    if _state is not None:
        return
    library = _runtime_library(runtime_library)
    torch.ops.load_library(library)
    global _enter, _exit, _tensors, _fast_before, _fast_after, _traced_otherwise
    _enter, _exit = torch.ops.ekka.enter.default, torch.ops.ekka.exit.default
    state = _State(trace_dir, options)
    binding = _python_binding(library)
    if binding is not None:
        _enter, _exit = binding.enter, binding.exit
        if hasattr(binding, "tensors"):
            binding.set_tensor_helpers(_Tensor, _Parameter, _opaque, _tensors_of_any,
                                       _tensors_py, (int, float, bool, str))
            _tensors = binding.tensors
            if hasattr(binding, "before") and os.environ.get("EKKA_FAST_HOOKS") != "0":
                binding.set_hooks(state, _functorch_level)
                _fast_before, _fast_after = binding.before, binding.after
                _traced_otherwise = binding.traced_otherwise
    _state = state
    pre, post = _pre_hook, _post_hook
    dynamo_callback = getattr(getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None),
                              "get_eval_frame_callback", None)
    if _fast_before is not None and hasattr(binding, "pre_hook") and dynamo_callback and \
            isinstance(vars(torch.compiler).get("_is_compiling_flag"), bool):
        binding.set_hook_fallbacks(globals(), vars(torch.compiler), dynamo_callback)
        pre, post = binding.pre_hook, binding.post_hook
    global _pre_hook_id, _post_hook_id
    _pre_hook_id = register_module_forward_pre_hook(pre).id
    _post_hook_id = register_module_forward_hook(post, with_kwargs=True, always_call=True).id
    if pre is not _pre_hook:
        _when_imported("torch._dynamo", functools.partial(_hooks_in_graph, pre, post))
    os.register_at_fork(after_in_child=_after_fork_in_child)
    _hide_hooks_from_compile_warning()
    _when_imported("torch._dynamo", _watch_compiles)
    _wrap_exec()
    _when_imported("torch.distributed", _wrap_init_process_group)
    _wrap_export()
    _wrap_module_compile()
    for module, (owner, name, wrap) in _WRAPPED_METHODS.items():
        _when_imported(module, functools.partial(_wrap_method, owner, name, wrap))


def _runtime_library(runtime_library=None):
    """The runtime library's path, or a RuntimeError that says how to give
    it (ekka-trace sets EKKA_RUNTIME_LIB; a program that calls Trace or
    install itself must)."""
    library = runtime_library or os.environ.get("EKKA_RUNTIME_LIB")
    if not library:
        raise RuntimeError(
            "ekka.trace: Ekka's runtime library was not given: set EKKA_RUNTIME_LIB "
            "to its path (an Ekka build's lib/libekka_runtime.so), or pass "
            "runtime_library= to ekka.trace.Trace")
    built_for = os.environ.get("EKKA_RUNTIME_TORCH") if runtime_library is None else None
    ours = str(torch.__version__)
    if built_for and built_for != ours:
        # A runtime links the LibTorch it was built against: another torch's
        # may load and record garbage, or crash the program. ekka-trace
        # names the runtimes its build has for other torches.
        others = {}
        for entry in os.environ.get("EKKA_RUNTIMES", "").split(":"):
            version, _, path = entry.partition("=")
            if version and path:
                others[version] = path
        if ours in others:
            return others[ours]
        installed = _installed_runtime(ours)
        if installed:
            return installed
        have = ", ".join(sorted([built_for] + list(others)))
        raise RuntimeError(
            f"ekka.trace: this program runs torch {ours}, and Ekka's runtime is built against "
            f"torch {have} only: build the tracer against this program's Python, "
            f"`cmake -S EKKA_SRC -B BUILD/torch-{ours} -DEKKA_TRACER_ONLY=ON "
            f"-DEKKA_PYTHON={sys.executable}` then `cmake --build BUILD/torch-{ours}`, or "
            f"`pip install --no-build-isolation EKKA_SRC/python` in its environment "
            f"(utils/install-vllm does so for its vLLM), and trace with ekka-trace as before")
    return library


def _installed_runtime(version):
    """The runtime that `pip install --no-build-isolation EKKA_SRC/python`
    built into this environment's ekka package, if it is for torch
    `version`; else None. (ekka-trace's own python/ comes first on the
    path, so the installed package is found by its distribution.)"""
    try:
        from importlib import metadata
        dists = list(metadata.distributions(name="ekka"))
    except Exception:
        return None
    for dist in dists:  # the source tree's own metadata may come first
        try:
            library = str(dist.locate_file("ekka/_runtime/libekka_runtime.so"))
            with open(str(dist.locate_file("ekka/_runtime/libekka_runtime.torch-version"))) as f:
                if f.read().strip() == version and os.path.exists(library):
                    return library
        except Exception:
            continue
    return None


def _python_binding(library):
    """The runtime's module entries and exits called from Python directly
    (`ekka_runtime_python`, beside the runtime library): the same functions
    as torch.ops.ekka.enter and exit, without the dispatcher's conversions,
    about 6 us less per module call. None where it was not built (no
    Python headers), is for another Python, or EKKA_PYTHON_BINDING=0."""
    if os.environ.get("EKKA_PYTHON_BINDING") == "0":
        return None
    import importlib.machinery
    import importlib.util
    directory = os.path.dirname(os.path.abspath(library))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(directory, "ekka_runtime_python" + suffix)
        if os.path.exists(path):
            try:
                spec = importlib.util.spec_from_file_location("ekka_runtime_python", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                return module
            except ImportError:
                return None
    return None


def vllm_plugin():
    """vLLM `general_plugins` entry point: every vLLM process (engine core,
    workers) installs the hooks when run under ekka-trace. vLLM must run in
    eager mode (`enforce_eager=True`): CUDA graphs replay kernels that no
    hook or observer sees."""
    install_from_environment()


def install_from_environment():
    trace_dir = os.environ.get("EKKA_TRACE_DIR")
    if trace_dir:
        install(trace_dir, os.environ.get("EKKA_TRACE_OPTIONS", ""))
        _mark_started(trace_dir)
