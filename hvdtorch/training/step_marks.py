"""FORWARD and BACKWARD of a DistributedModel on the engine's timeline.

The engine's timeline records what happens to every op (NEGOTIATE, QUEUE,
copies, the collective); these marks add the compute around it, on the same
clock, so a trace shows how much communication overlaps backward:

    FORWARD    the wrapped module's forward
    BACKWARD   from the moment the gradient of the forward's output is
               computed (the start of backward through the model) to the end
               of the autograd pass, before the wait for the last buckets

Both are recorded under the model's name as a trace "process" of its own.
While no timeline is written, marking costs one call that returns False.
"""

import torch

from .. import _C
from .compile_marks import disabled_when_compiled
from .compiled_model import call_module, compiled_autograd_on


def _first_tensor_needing_grad(out):
    if isinstance(out, torch.Tensor):
        return out if out.requires_grad else None
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        for item in out:
            t = _first_tensor_needing_grad(item)
            if t is not None:
                return t
    return None


class StepMarks:
    def __init__(self, engine, name: str):
        self._engine = engine
        self._name = name

    # Runs eagerly under torch.compile; the module's call is what gets compiled.
    @disabled_when_compiled(recursive=False)
    def forward(self, module, args, kwargs):
        """Runs ``module(*args, **kwargs)`` and marks it; returns its output.
        Under compiled autograd BACKWARD is not marked: it traces the hook
        that marks it, and cannot trace the mark."""
        if not _C.timeline_enabled(self._engine):
            return call_module(module, args, kwargs)
        _C.timeline_begin(self._engine, self._name, "FORWARD")
        try:
            out = call_module(module, args, kwargs)
        finally:
            _C.timeline_end(self._engine, self._name, "FORWARD")
        t = _first_tensor_needing_grad(out) if torch.is_grad_enabled() and not compiled_autograd_on() else None
        if t is not None:
            t.register_hook(self._backward_started)
        return out

    def _backward_started(self, grad):
        _C.timeline_begin(self._engine, self._name, "BACKWARD")
        # Runs at the end of this autograd pass, before callbacks queued later
        # (the gradient reducer's wait for its buckets is queued by the first
        # gradient hook, which fires after this one).
        torch.autograd.Variable._execution_engine.queue_callback(
            lambda: _C.timeline_end(self._engine, self._name, "BACKWARD")
        )
        return grad
