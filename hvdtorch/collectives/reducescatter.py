"""reducescatter with Horovod's semantics.

Every rank passes a tensor of the same shape; the element-wise reduction
over ranks is split along dimension 0 and rank r keeps its share: dim0 //
size rows, one more for the first ``dim0 % size`` ranks. Average, Sum, Min,
Max, Product; prescale/postscale as for allreduce. A list
(``grouped_reducescatter``) is negotiated as one unit.

Gradient (Horovod's rule): the allgather of the output gradients, times
``size`` for Sum (and times the scale factors); Min, Max and Product have
none.
"""

from typing import List

import torch

from .. import _C
from ..exceptions import InvalidArgumentError
from .compression import Compression
from .handles import check_process_set, contiguous, op_name, register, submit, synchronize
from .ops import Average, Sum, allgather_async, grouped_allgather_async
from .process_sets import global_process_set


def _submit(tensors, name: str, op, prescale_factor, postscale_factor, psid: int) -> int:
    srcs = [contiguous(t, "reducescatter") for t in tensors]
    return submit(
        _C.ReducescatterOptions(),
        srcs,
        name=name,
        op=op,
        prescale=float(prescale_factor),
        postscale=float(postscale_factor),
        process_set_id=psid,
    )


def reducescatter_async(
    tensor, name=None, op=Average, process_set=None, prescale_factor=1.0, postscale_factor=1.0
) -> int:
    """Starts a reduce-scatter; synchronize() returns this rank's share."""
    psid = check_process_set(process_set)
    h = _submit([tensor], op_name("reducescatter", name, psid), op, prescale_factor, postscale_factor, psid)
    return register(h, lambda outs: outs[0])


def grouped_reducescatter_async(
    tensors, name=None, op=Average, process_set=None, prescale_factor=1.0, postscale_factor=1.0
) -> int:
    """Starts a reduce-scatter of a list as one unit; synchronize() returns the list of shares."""
    psid = check_process_set(process_set)
    h = _submit(
        list(tensors), op_name("grouped_reducescatter", name, psid), op, prescale_factor, postscale_factor, psid
    )
    return register(h, lambda outs: list(outs))


def _grad_scale(op, prescale_factor, postscale_factor, process_set) -> float:
    if op not in (Average, Sum):
        raise InvalidArgumentError(f"hvdtorch: reducescatter has no gradient for op {op}; use Average or Sum")
    size = (process_set or global_process_set).size()
    return (size if op == Sum else 1) * prescale_factor * postscale_factor


class _ReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx, grad):
        scale = _grad_scale(*ctx.args)
        gathered = synchronize(allgather_async(grad.contiguous(), process_set=ctx.args[3]))
        return gathered * scale if scale != 1 else gathered, None, None, None, None, None


class _GroupedReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return tuple(
            synchronize(
                grouped_reducescatter_async(list(tensors), name, op, process_set, prescale_factor, postscale_factor)
            )
        )

    @staticmethod
    def backward(ctx, *grads):
        scale = _grad_scale(*ctx.args)
        gathered = synchronize(grouped_allgather_async([g.contiguous() for g in grads], process_set=ctx.args[3]))
        return (None, None, None, None, None, *[g * scale if scale != 1 else g for g in gathered])


def reducescatter(
    tensor, name=None, compression=None, op=Average, process_set=None, prescale_factor=1.0, postscale_factor=1.0
) -> torch.Tensor:
    """Reduces ``tensor`` over ranks and returns this rank's rows of the result; differentiable."""
    psid = check_process_set(process_set)
    compression = compression or Compression.none
    compressed, cctx = compression.compress(tensor)
    out = _ReducescatterFn.apply(
        compressed, op_name("reducescatter", name, psid), op, prescale_factor, postscale_factor, process_set
    )
    return compression.decompress(out, cctx)


def grouped_reducescatter(
    tensors, name=None, compression=None, op=Average, process_set=None, prescale_factor=1.0, postscale_factor=1.0
) -> List[torch.Tensor]:
    """reducescatter of each tensor of a list, negotiated as one unit; differentiable."""
    psid = check_process_set(process_set)
    compression = compression or Compression.none
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedReducescatterFn.apply(
        op_name("grouped_reducescatter", name, psid),
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        *[p[0] for p in pairs],
    )
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]
