from .base import BaseModel as BaseModel
