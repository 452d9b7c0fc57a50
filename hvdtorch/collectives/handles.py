"""What every op module shares, below them all: the engine of this process,
op names, argument checks common to every collective, submission to the
engine, and the table of handles that ``synchronize``/``poll`` resolve.

An op submits to the engine (``submit``: the op's options struct, which the
compiled core binds as ``_C.<Op>Options``, and its tensors) and registers a *finisher* under the handle it got
back: ``synchronize(handle)`` waits for the engine's outputs and hands them to
the finisher, which makes the user's result (a tensor, a list, a tuple with
received splits). A handle may also be a callable (an op made of several
engine ops, e.g. ``sparse_allreduce_async``): it is then its own finisher.
"""

from typing import Callable, Dict, List, Optional, Sequence

import torch

from .. import _C, runtime
from ..exceptions import InvalidArgumentError
from .process_sets import set_id

# handle -> function turning the engine's outputs into the user's result
_finishers: Dict[int, Callable[[List[torch.Tensor]], object]] = {}


def engine():
    """The running engine (NotInitializedError before init())."""
    return runtime.state().engine


def check_process_set(process_set) -> int:
    """The engine id of an op's process_set (InvalidArgumentError for one not added, removed, or
    not including this rank)."""
    return set_id(process_set)


def op_name(kind: str, name: Optional[str], psid: int) -> str:
    """An op's name; unnamed ops are numbered per set, since only members call them."""
    return name or runtime.next_name(kind if psid == 0 else f"{kind}.set{psid}")


def contiguous(t: torch.Tensor, what: str) -> torch.Tensor:
    """``t`` as the engine takes it: a dense tensor, made contiguous if it is not."""
    if not isinstance(t, torch.Tensor):
        raise InvalidArgumentError(f"hvdtorch: {what} expects a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise InvalidArgumentError(
            f"hvdtorch: rank {runtime.rank()}: {what}: {t.layout} (sparse) tensors are not "
            "supported; densify them first (tensor.to_dense())"
        )
    return t if t.is_contiguous() else t.contiguous()


def fresh_output(src: torch.Tensor) -> torch.Tensor:
    """An empty contiguous output like ``src`` for an op that returns a new
    tensor: host memory from the output pool (csrc/torch/output_pool.h),
    which a repeated call reuses instead of faulting in fresh pages; device
    memory from torch's caching allocator, which already does."""
    if src.device.type == "cpu":
        return _C.pooled_empty_like(src)
    return torch.empty_like(src, memory_format=torch.contiguous_format)


def submit(options, inputs: Sequence[torch.Tensor] = (), outputs: Sequence[torch.Tensor] = (), **fields) -> int:
    """Submits one op to the engine and returns its handle. ``options``: a new
    options struct of the op (``_C.BroadcastOptions()``: the fields of
    csrc/core/ops/<op>.h), set here from ``fields`` by name (a misspelt one
    raises AttributeError); the tensors go apart, as the binding turns them
    into the engine's buffers."""
    for key, value in fields.items():
        setattr(options, key, value)
    return engine().submit(options, list(inputs), list(outputs))


def register(handle: int, finish: Callable[[List[torch.Tensor]], object]) -> int:
    """Remembers how to finish ``handle``; returns it."""
    _finishers[handle] = finish
    return handle


def poll(handle: int) -> bool:
    """True once the op behind ``handle`` has finished (successfully or not)."""
    if callable(handle):  # a handle made of several ops (sparse_allreduce_async)
        return handle.poll()
    return engine().poll(handle)


def synchronize(handle: int):
    """Waits for the op behind ``handle`` and returns its result (raises its error)."""
    if callable(handle):
        return handle()
    finish = _finishers.pop(handle, None)
    if finish is None:
        raise InvalidArgumentError(f"hvdtorch: unknown or already synchronized handle {handle!r}")
    outs = engine().wait(handle)
    return finish(outs)
