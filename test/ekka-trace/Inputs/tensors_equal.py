"""The shim's two ways of finding the tensors in a module's arguments or
result: the Python binding's `tensors`, in C, which the hooks use, and
`_tensors_py`, which they use without the binding. Both must give the same
tensors in the same order, or raise the same error, for any argument:
random nested tuples, lists and dicts of tensors (plain, parameters,
subclasses), scalars (an IntEnum among them), namedtuples, dataclasses,
ModelOutput-like objects, opaque objects, an object that says it is an
int, a list that holds itself (also with the recursion limit raised). Run under ekka-trace, whose
shim is installed. Prints how many it compared."""
import collections
import dataclasses
import enum
import random
import sys

import torch

import ekka.trace as et

if et._tensors is et._tensors_py:
    sys.exit("the binding's tensors is not in use")


class Sub(torch.Tensor):
    pass


class Color(enum.IntEnum):
    RED = 1


Pair = collections.namedtuple("Pair", "a b")


@dataclasses.dataclass
class Out:
    x: object
    y: object = None


class ModelOutputLike:
    def __init__(self, *items):
        self.items = items

    def to_tuple(self):
        return self.items


class Opaque:
    pass


class SaysInt:
    """A proxy whose __class__ says int: isinstance takes it as one."""
    @property
    def __class__(self):
        return int

    t = torch.zeros(1)


class Raises:
    """An object whose attributes raise: pytree's and the shim's questions
    of it go wrong alike."""
    def __getattr__(self, name):
        raise RuntimeError("no " + name)


tensors = [torch.zeros(1), torch.nn.Parameter(torch.ones(2)), torch.zeros(3).as_subclass(Sub)]


def leaf(rng):
    return rng.choice([
        lambda: rng.choice(tensors),
        lambda: None, lambda: True, lambda: 3, lambda: 2.5, lambda: "s", lambda: Color.RED,
        lambda: Pair(rng.choice(tensors), None),
        lambda: Out(rng.choice(tensors), [rng.choice(tensors)]),
        lambda: ModelOutputLike(rng.choice(tensors), 1),
        lambda: Opaque(), lambda: torch.Size([2, 3]), lambda: Raises(), lambda: cyclic(rng), lambda: SaysInt(),
    ])()


def cyclic(rng):
    """A list that holds itself: both raise RecursionError."""
    out = [rng.choice(tensors)]
    out.append(out)
    return out


def value(rng, depth):
    if depth == 0 or rng.random() < 0.3:
        return leaf(rng)
    items = [value(rng, depth - 1) for _ in range(rng.randint(0, 4))]
    kind = rng.choice(["tuple", "list", "dict"])
    if kind == "tuple":
        return tuple(items)
    if kind == "list":
        return items
    return {f"k{i}": v for i, v in enumerate(items)}


def result(find, x, outputs):
    try:
        return [id(t) for t in find(x, outputs)]
    except Exception as error:
        return type(error).__name__


rng = random.Random(0)
compared = 0
for n in range(5000):
    x = value(rng, 3)
    for outputs in (False, True):
        c, py = result(et._tensors, x, outputs), result(et._tensors_py, x, outputs)
        if c != py:
            sys.exit(f"differ on {x!r} (outputs={outputs}): C {c}, Python {py}")
        compared += 1
# A program may raise Python's recursion limit: a list that holds itself
# still raises RecursionError (the C walk hands deep nesting to Python's).
sys.setrecursionlimit(5000)
for outputs in (False, True):
    x = (tensors[0], cyclic(rng))
    c, py = result(et._tensors, x, outputs), result(et._tensors_py, x, outputs)
    if c != py or c != "RecursionError":
        sys.exit(f"a list that holds itself: C {c}, Python {py}")
    compared += 1
print(f"compared {compared}")
