"""DDP's per-forward rules on the optimizer route, for a module the
optimizer is told about (hvd.DistributedOptimizer(..., model=net)).

DistributedModel applies DDP's two rules itself. A script that ports to
DistributedOptimizer keeps its plain module, so the optimizer cannot see its
forwards unless it is given the module; with ``model=`` it hooks the root
module's forward and applies the same two rules there:

* accumulation: ``net.require_backward_grad_sync`` (an attribute DDP scripts
  set on the model, True when absent) is read at every forward with
  autograd on; False makes that forward's backward accumulate locally
  (uncounted, as inside no_sync()), and the next reduced step averages the
  sum (``on_sync(bool)`` is the optimizer's switch);
* buffers: the first rank's buffers before each forward that follows a
  training forward whose backward reduces (buffer_sync.ForwardSyncRule), so
  that every rank evaluates and saves rank 0's BatchNorm statistics.

Without ``model=`` neither applies (Horovod's behaviour: the optimizer
never sees the module); docs/guide.md says what a DDP script adds then.
"""

import weakref
from typing import Callable

import torch

from .buffer_sync import BufferSync, ForwardSyncRule


def _backward_syncs(module: torch.nn.Module) -> bool:
    return bool(getattr(module, "require_backward_grad_sync", True))


class ModuleRules:
    def __init__(self, module: torch.nn.Module, process_set, name: str, on_sync: Callable[[bool], None]):
        self._buffers = BufferSync(module, process_set, name, enabled=True)
        self._rule = ForwardSyncRule()
        me = weakref.ref(self)  # the module's hooks must not keep the optimizer's rules alive

        def before(mod, _args):
            rules = me()
            if rules is not None:
                rules._before(mod)

        def after(mod, _args, _out):
            rules = me()
            if rules is not None:
                rules._rule.after_forward(torch.is_grad_enabled(), _backward_syncs(mod))

        self._on_sync = on_sync
        self._handles = [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
        weakref.finalize(self, _remove, self._handles)

    def _before(self, module: torch.nn.Module) -> None:
        if torch.is_grad_enabled():
            self._on_sync(_backward_syncs(module))
        if self._rule.due:
            self._buffers.sync_buffers()

    def remove(self) -> None:
        _remove(self._handles)


def _remove(handles) -> None:
    for h in handles:
        h.remove()
