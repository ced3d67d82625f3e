"""Ops of threads with no module call open, while another thread's call is
open: the main thread's sin and cos while a thread's module waits in its
forward (no module's), and a backward pass that a module's forward runs on
a thread of its own, as autograd runs a GPU's on its device thread (the
module's). Then backward passes beside other threads' module calls: one the
main thread runs with no call open while a thread's call waits (no
module's), and two that modules on two threads each run on a helper thread,
the first while the other thread's call was entered last (each its own
module's). Last, a graph a thread built inside a call it has since left,
its backward pass run by the main thread while that thread waits in
another call (no module's: the graph is older than that call)."""
import threading

import torch
import torch.nn.functional as F

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


# The main thread's backward pass, while a thread's module call is open.
entered.clear()
done.clear()
waiting = threading.Thread(target=lambda: Waits()(torch.ones(3)))
waiting.start()
entered.wait()
v = torch.arange(3.0).requires_grad_()
F.softplus(v).sum().backward()
done.set()
waiting.join()

# Two modules on two threads, each running a backward pass on a helper thread.
ready = [threading.Event(), threading.Event()]
go = [threading.Event(), threading.Event()]


class BackwardLater(torch.nn.Module):
    def __init__(self, index, fn):
        super().__init__()
        self.index, self.fn = index, fn

    def forward(self, x):
        w = x.clone().requires_grad_()
        loss = (self.fn(w) + w).sum()  # w's gradients accumulate (aten::add)
        # An op outside any node: a callback at the pass's end (aten::neg).
        engine = torch.autograd.Variable._execution_engine
        w.register_hook(lambda grad: engine.queue_callback(lambda: torch.ones(1).neg()))
        ready[self.index].set()
        go[self.index].wait()
        thread = threading.Thread(target=loss.backward)
        thread.start()
        thread.join()
        return w.grad


class Sigmoid(BackwardLater):
    pass


class Tanh(BackwardLater):
    pass


first = threading.Thread(target=lambda: Sigmoid(0, torch.sigmoid)(torch.arange(3.0)))
first.start()
ready[0].wait()
second = threading.Thread(target=lambda: Tanh(1, torch.tanh)(torch.arange(3.0)))
second.start()
ready[1].wait()
go[0].set()
first.join()
go[1].set()
second.join()
print("backward passes done")


# A graph built inside a call that has ended; its thread waits in another.
entered.clear()
done.clear()
built = {}


class Built(torch.nn.Module):
    def forward(self, x):
        return torch.exp(x).sum()


def build_then_wait():
    w = torch.arange(3.0).requires_grad_()
    built["w"], built["loss"] = w, Built()(w)
    Waits()(torch.ones(3))


waiting = threading.Thread(target=build_then_wait)
waiting.start()
entered.wait()
built["loss"].backward()
done.set()
waiting.join()
print("built grad", [round(g, 3) for g in built["w"].grad.tolist()])
