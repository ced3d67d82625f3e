from pkg.models import base as b
from .base import BaseModel as Model
from . import base


class LlamaModel(Model):
    def forward(self, x):
        return x


class LlamaForCausalLM(b.BaseModel):
    pass


class LlamaTiny(LlamaModel):
    pass


class Unresolved(torch.nn.Module):
    pass
