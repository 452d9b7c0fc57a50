"""shard=2's stand-ins for the gradients it does not keep.

After a reduced backward pass, shard=2 keeps only this rank's shard of the
averaged gradient, so a parameter's .grad holds nothing. Left None, torch's
clip_grad_norm_, GradScaler.unscale_ and any code that skips parameters
without a gradient would silently do nothing, where under DDP they act on
the average. So from the end of such a pass until step() or zero_grad(),
every .grad the reducer dropped is a HeldGradient instead: the parameter's
shape, dtype and device (training/pending_gradients.py's stand_in()) that raises an
``hvdtorch: ...`` error naming the parameter and the fix on any use.

Contract (the C++ reducer's pass callbacks, csrc/torch/grad_reducer.h):
  * placed at the end of a reduced pass whose strategy dropped .grad (it
    drops them as it launches each bucket), only where .grad is None:
    passes that accumulate locally (no_sync(), the first k-1 of
    backward_passes_per_step) keep real gradients and are left alone;
  * removed (.grad = None) when the next backward pass begins, before
    anything of it accumulates into .grad (an in-place add into an
    expanded tensor fails), and by the optimizer's step() and zero_grad();
  * ``p.grad is None`` is False while held: the point is that code which
    would use the gradient hears why there is none.
  * A stand-in replaced by the user (``p.grad = None`` to skip a parameter
    this step, or a tensor of their own) cannot change what the shard steps
    on: the optimizer's step() refuses it, naming the parameters
    (replaced()).
"""

from typing import Sequence

import torch

from .. import runtime
from ..training.pending_gradients import stand_in, stand_ins_in


class HeldGradient(torch.Tensor):
    """A .grad whose every use raises (see the top)."""

    @staticmethod
    def of(param: torch.Tensor, name: str) -> "HeldGradient":
        held = stand_in(HeldGradient, param)
        held._hvd_param_name = name
        return held

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = next((a._hvd_param_name for a in stand_ins_in(HeldGradient, args, kwargs)), None)
        what = getattr(func, "__name__", str(func))
        raise RuntimeError(
            f"hvdtorch: rank {runtime.rank()}: {what} on the .grad of {name!r}: with shard=2 a parameter's .grad "
            "holds no gradient between backward and step() (each rank keeps only its shard of the average). "
            "Clip with optimizer.clip_grad_norm_(max_norm) (the norm over every rank's shard), zero with "
            "optimizer.zero_grad(), or use shard=1 where code reads whole gradients (GradScaler, custom clipping)"
        )


class HeldGradients:
    def __init__(self, params: Sequence[torch.Tensor], names: Sequence[str]):
        """The owner (zero/gradients.py) calls remove() and place() from the
        pass callbacks of the _C.GradientReducer that drops these
        parameters' .grad (once per pass each, not a hook per parameter)."""
        self._params = list(params)
        self._names = list(names)
        self._stand_ins = None  # one per parameter, made at the first placement and reused
        self._placed = False

    def place(self) -> None:
        """After a reduced pass: a stand-in wherever .grad is None."""
        if self._stand_ins is None:
            self._stand_ins = [HeldGradient.of(p, name) for p, name in zip(self._params, self._names)]
        for p, held in zip(self._params, self._stand_ins):
            if p.grad is None:
                p.grad = held
        self._placed = True

    def replaced(self):
        """The names of the parameters whose stand-in was replaced since it
        was placed (``p.grad = None``, or a tensor of the user's)."""
        if not self._placed:
            return []
        return [n for p, n, held in zip(self._params, self._names, self._stand_ins) if p.grad is not held]

    def remove(self) -> None:
        """Every stand-in back to None (a real .grad is kept)."""
        if not self._placed:
            return
        for p in self._params:
            if type(p.grad) is HeldGradient:
                p.grad = None
        self._placed = False
