from .sub.impl import Widget
