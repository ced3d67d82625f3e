"""Ops whose inputs come in lists, for --capture-op-inputs: a KV-cache
write (`cache[slots] = k`, aten::index_put_ with its slot mapping in a
Tensor?[]) and torch.stack and torch.cat of a Tensor[]. Prints the sum of
each tensor the ops read, in argument order, to compare with the trace."""
import torch


class Cache(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(16, 4))

    def forward(self, k, slots):
        self.cache[slots] = k
        stacked = torch.stack([k, k * 2])
        out = torch.cat([stacked.flatten(), slots.float()])
        # A column write: index_put_'s indices are [an undefined tensor, cols].
        self.cache[:, torch.tensor([2])] = torch.full((16, 1), 7.0)
        return out


k = torch.arange(12.0).reshape(3, 4)
slots = torch.tensor([5, 0, 9])
with torch.no_grad():
    Cache()(k, slots)
print("index_put_", slots.sum().item(), k.sum().item())
print("stack", k.sum().item(), (k * 2).sum().item())
print("cat", (k.sum() * 3).item(), slots.float().sum().item())
print("index_put_", 2, 16 * 7.0)
