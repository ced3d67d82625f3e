"""Base classes, in the shapes real model code has."""
import abc
import functools
from typing import TYPE_CHECKING, Generic, TypeVar

T = TypeVar("T")


class Registry(type):
    def __new__(mcs, name, bases, ns):
        return super().__new__(mcs, name, bases, ns)


class Mixin:
    pass


@functools.total_ordering
@abc.abstractmethod
class BaseModel(Mixin, Generic[T], metaclass=Registry, flag=True):
    """A decorated class with two bases, a metaclass and a keyword."""

    class Config:
        class Inner:
            depth = 2

    def forward(self, x):
        return x

    async def generate(self, prompt):
        return prompt

    @property
    def name(self):
        return "base"


if TYPE_CHECKING:
    class OnlyForTypes(BaseModel):
        pass


def make_layer(width):
    class LocalLayer(BaseModel):
        def forward(self, x):
            return x * width

    return LocalLayer


async def serve():
    return None
