import enum
import torch.nn as nn
from ...beyond import Nothing


class Widget:
    pass


class Module:
    """Shares its name with torch.nn.Module; no torch class derives from it."""


class Layer(nn.Module):
    pass


class Mode(enum.Enum):
    A = 1


class Props(Widget, metaclass=type, **{"flag": True}):
    @property
    def x(self):
        return 1

    @x.setter
    def x(self, value):
        pass
