"""Ops of threads with no module call open, while another thread's call is
open: the main thread's sin and cos while a thread's module waits in its
forward (no module's), and a backward pass that a module's forward runs on
a thread of its own, as autograd runs a GPU's on its device thread (the
module's)."""
import threading

import torch

entered, done = threading.Event(), threading.Event()


class Waits(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        entered.set()
        done.wait()
        return y + 1


class Backward(torch.nn.Module):
    def forward(self, x):
        w = x.clone().requires_grad_()
        loss = (w * w).sum()
        thread = threading.Thread(target=loss.backward)
        thread.start()
        thread.join()
        return w.grad


waiting = threading.Thread(target=lambda: Waits()(torch.ones(3)))
waiting.start()
entered.wait()
z = torch.arange(5.0).sin().cos()
done.set()
waiting.join()
print("grad", Backward()(torch.arange(3.0)).tolist())
