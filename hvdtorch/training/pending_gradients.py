"""Gradients whose reduction is in flight, behind stand-ins that wait for it.

DistributedOptimizer (training/gradient_sync.py) and the sharded
optimizer's shard=1 (zero/gradients.py) finish in step() the reduction a
backward pass launched (Horovod's contract), so that step() overlaps its
tail. Between that pass and step(), code written for DDP reads and changes
.grad (torch's clip_grad_norm_, GradScaler.unscale_, a norm for the log)
and expects the average, which DDP has finished when backward returns. So
from the end of a reducing pass until the reduction is finished, each .grad
is a PendingGradient: the first use of any of them finishes the reduction
(the owner's settle(): its synchronize(), once), puts the real gradients
back into .grad and runs that use, and every later one, on the real
gradient. Code that never touches .grad before step() keeps the overlap;
code that does sees what DDP's sees.

Contract:
  * place() runs once every callback of a reducing pass has run (the
    reducer has written every gradient by then; training/gradient_marks.py
    queues it after its note); restore() puts the real gradient back
    wherever a stand-in still is (code that put another tensor into .grad
    keeps it; the owner's change check names it). The owner restores before
    it finishes the reduction itself (synchronize(), step()), when the next
    backward pass begins, and when it forgets the pass.
  * ``p.grad is None`` is False while placed, also for a parameter that got
    no gradient on this rank: after the reduction it holds the average of
    the others'. One that no rank gave a gradient is None after the
    reduction, as under DDP and in one process (the owner's ``unused``
    names it); its stand-in, used before, acts as zeros (what a norm or a
    scale of the gradients sees of a missing one).
  * A stand-in kept past the step (``g = p.grad``) resolves to its
    parameter's .grad at each use.
"""

import functools
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type

import torch
from torch.utils._pytree import tree_map

from .. import runtime
from .compiled_model import refuse_compiled_autograd

# The one element every stand-in of a dtype and device expands (read-only: nothing writes into a stand-in).
_ZEROS: Dict[Tuple[torch.dtype, torch.device], torch.Tensor] = {}


def stand_in(cls: Type[torch.Tensor], param: torch.Tensor) -> torch.Tensor:
    """A ``cls`` instance that .grad of ``param`` accepts (its shape, dtype
    and device) and that holds no memory of its own (one shared zero,
    expanded). Shared with shard=2's stand-ins (zero/held_gradients.py)."""
    key = (param.dtype, param.device)
    zero = _ZEROS.get(key)
    if zero is None:
        zero = _ZEROS[key] = torch.zeros((), dtype=param.dtype, device=param.device)
    return torch.Tensor._make_subclass(cls, zero.expand(param.shape))


class PendingGradient(torch.Tensor):
    """A .grad whose reduction is in flight; any use waits for it (see the top)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for owner in {id(o): o for o in _owners(args, kwargs)}.values():
            owner.settle()
        real = tree_map(_real, (args, kwargs))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*real[0], **real[1])


def stand_ins_in(cls: Type[torch.Tensor], args, kwargs) -> List[torch.Tensor]:
    """The ``cls`` instances among a torch function's arguments, nested ones
    (the lists of foreach ops) included. Shared with zero/held_gradients.py."""
    found: List[torch.Tensor] = []
    tree_map(lambda a: found.append(a) if isinstance(a, cls) else None, (args, kwargs or {}))
    return found


def _owners(args, kwargs):
    return [o for o in (s._hvd_owner() for s in stand_ins_in(PendingGradient, args, kwargs)) if o is not None]


def _real(a):
    if not isinstance(a, PendingGradient):
        return a
    param = a._hvd_param()
    grad = None if param is None else param.grad
    owner = a._hvd_owner()
    if grad is None and owner is not None and id(param) in owner._unused_ids:
        return torch.zeros_like(param)  # no rank gave it a gradient: a norm or a scale sees nothing
    if grad is None or isinstance(grad, PendingGradient):
        refuse_compiled_autograd("DistributedOptimizer")  # what this is when Dynamo traces it
        raise RuntimeError(
            f"hvdtorch: rank {runtime.rank()}: the .grad of {a._hvd_name!r} was used after its reduction, but the "
            "parameter holds no reduced gradient (it was set to None or freed)"
        )
    return grad


class PendingGradients:
    def __init__(
        self,
        params: Sequence[torch.Tensor],
        names: Sequence[str],
        counter,
        settle: Callable[[], None],
        unused: Optional[Callable[[], Sequence[int]]] = None,
    ):
        """``counter``: the owner's pass counter (_C.PassCounter), which says
        whether the pass that just ended reduced; ``settle``: finishes the
        reduction of the pass the stand-ins stand for (the owner's
        synchronize(), which calls restore() first); ``unused``: the indices
        of the parameters no rank gave a gradient in that pass (None: none)."""
        self._params = list(params)
        self._counter = counter
        self._names = list(names)
        self._settle = settle
        self._unused = unused
        self._unused_ids: set = set()  # id() of the parameters no rank gave a gradient, once settled
        self._stand_ins: Optional[list] = None  # one per parameter, made at the first placement and reused
        self._real: list = []  # the real gradients while the stand-ins are placed
        self._settling = False

    @property
    def placed(self) -> bool:
        return bool(self._real)

    def place(self) -> None:
        """After a reducing pass: a stand-in in every parameter's .grad."""
        if self._stand_ins is None:
            me = weakref.ref(self)  # stand-ins live in .grad and must not keep their owner alive
            self._stand_ins = []
            for p, name in zip(self._params, self._names):
                s = stand_in(PendingGradient, p)
                s._hvd_owner, s._hvd_param, s._hvd_name = me, weakref.ref(p), name
                self._stand_ins.append(s)
        self._real = [p.grad for p in self._params]
        self._unused_ids = set()
        for p, s in zip(self._params, self._stand_ins):
            p.grad = s

    def place_after_pass(self) -> None:
        """At the end of a pass (after every callback of it): place() if the
        pass reduced; passes that accumulate locally keep the real .grad."""
        if self._counter.reducing:
            self.place()

    def restore(self) -> None:
        """Every stand-in still in .grad back to the real gradient."""
        real, self._real = self._real, []
        for p, s, g in zip(self._params, self._stand_ins or (), real):
            if p.grad is s:
                p.grad = g

    def settle(self) -> None:
        """A stand-in is used: the owner finishes the reduction (once)."""
        if not self._real or self._settling:
            return
        self._settling = True
        try:
            self._settle()
            unused = (self._unused() or ()) if self._unused is not None else ()
            self._unused_ids = {id(self._params[i]) for i in unused}
        finally:
            self._settling = False
        if self._real:
            raise RuntimeError(f"hvdtorch: rank {runtime.rank()}: finishing the reduction left stand-ins in .grad")


def weak_method(owner, method: str) -> Callable[..., Any]:
    """``owner.<method>(*args)`` behind a weak reference, doing nothing
    (None) once the owner is gone: for callbacks that stand-ins, autograd or
    the C++ reducer hold, which must not keep an optimizer alive."""
    return functools.partial(_call_weakly, weakref.ref(owner), method)


def _call_weakly(ref, method: str, *args) -> Any:
    owner = ref()
    return None if owner is None else getattr(owner, method)(*args)
