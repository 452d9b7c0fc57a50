"""alltoall with Horovod's semantics.

Rank r sends rows ``splits[d]`` of dimension 0 (consecutive blocks, in rank
order) to rank d and receives, concatenated in rank order, what every rank
sends it. Without ``splits`` dimension 0 is divided evenly (it must be a
multiple of the number of ranks). Receive sizes are negotiated, so ranks may
send different amounts.

``synchronize(alltoall_async(...))`` returns ``(output, received_splits)``;
``alltoall(t)`` returns the output alone and ``alltoall(t, splits)`` the pair,
as Horovod 0.28 does. ``received_splits`` has the dtype of ``splits`` when it
is a tensor, int32 otherwise.
"""

from typing import List

import torch

from .. import _C, runtime
from ..exceptions import InvalidArgumentError
from .handles import check_process_set, contiguous, op_name, register, submit, synchronize


def _split_list(splits, name: str) -> List[int]:
    """splits as Python ints; the core checks their count, signs and sum."""
    if splits is None:
        return []
    where = f"hvdtorch: rank {runtime.rank()}: alltoall '{name}'"
    if isinstance(splits, torch.Tensor):
        if splits.dtype.is_floating_point or splits.dtype.is_complex or splits.dtype == torch.bool:
            raise InvalidArgumentError(f"{where}: splits must hold integers, got {splits.dtype}")
        if splits.dim() != 1:
            raise InvalidArgumentError(f"{where}: splits must be one-dimensional, got shape {tuple(splits.shape)}")
        return [int(s) for s in splits.tolist()]
    values = list(splits)
    for s in values:
        if isinstance(s, bool) or not isinstance(s, int):
            raise InvalidArgumentError(f"{where}: splits must hold integers, got {s!r}")
    return values


def alltoall_async(tensor, splits=None, name=None, process_set=None) -> int:
    """Starts an alltoall; synchronize() returns (output, received_splits)."""
    psid = check_process_set(process_set)
    name = op_name("alltoall", name, psid)
    split_list = _split_list(splits, name)
    src = contiguous(tensor, "alltoall")
    received_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32
    h = submit(_C.AlltoallOptions(), [src], name=name, splits=split_list, process_set_id=psid)
    return register(h, lambda outs: (outs[0], outs[1].to(received_dtype)))


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(alltoall_async(tensor, splits, name=name, process_set=process_set))
        ctx.received, ctx.process_set = received, process_set
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, *_received_grad):
        # Every row goes back where it came from: alltoall with the splits received.
        g, _ = synchronize(alltoall_async(grad.contiguous(), ctx.received, process_set=ctx.process_set))
        return g, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Scatters slices of ``tensor`` to every rank and gathers theirs; differentiable.

    Returns the gathered tensor, or ``(gathered, received_splits)`` when
    ``splits`` is given.
    """
    psid = check_process_set(process_set)
    return _AlltoallFn.apply(tensor, splits, op_name("alltoall", name, psid), process_set)
