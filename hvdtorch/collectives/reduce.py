"""reduce: the reduction over ranks of one tensor, which one root keeps.

torch.distributed.reduce's semantics with Horovod's conventions (Horovod
itself has no reduce): every rank passes a tensor of the same shape and
dtype; the root gets the element-wise reduction (Average by default, as
``allreduce``; Sum, Min, Max, Product; not Adasum), and every other rank
gets its own input back unchanged (``reduce`` returns a copy of it,
``reduce_`` leaves the tensor as it was). ``root_rank`` is a global rank,
also in a process set, and must be a member of the set (as for broadcast).

Not differentiable. For now it costs what an all-reduce of the tensor
costs: the engine all-reduces a copy and only the root keeps the result;
device tensors go through host memory.
"""

import torch

from .. import _C
from .handles import check_process_set, contiguous, fresh_output, op_name, register, submit, synchronize
from .ops import Average


def _submit(src: torch.Tensor, out: torch.Tensor, root_rank: int, op: int, name: str, psid: int) -> int:
    return submit(_C.ReduceOptions(), [src], [out], name=name, root=root_rank, op=op, process_set_id=psid)


def reduce_async(tensor, root_rank=0, op=Average, name=None, process_set=None) -> int:
    """Starts a reduce to ``root_rank``; synchronize() returns the result on the
    root and a copy of the input elsewhere."""
    psid = check_process_set(process_set)
    src = contiguous(tensor, "reduce")
    out = fresh_output(src)
    h = _submit(src, out, root_rank, op, op_name("reduce", name, psid), psid)
    return register(h, lambda _outs: out)


def reduce_async_(tensor, root_rank=0, op=Average, name=None, process_set=None) -> int:
    """Starts an in-place reduce: ``tensor`` holds the result on the root and is left as it was elsewhere."""
    psid = check_process_set(process_set)
    buf = contiguous(tensor, "reduce_")
    h = _submit(buf, buf, root_rank, op, op_name("reduce", name, psid), psid)
    if buf is tensor:
        return register(h, lambda _outs: tensor)
    return register(h, lambda _outs: tensor.copy_(buf))


def reduce(tensor, root_rank=0, op=Average, name=None, process_set=None) -> torch.Tensor:
    """Reduces ``tensor`` over ranks to ``root_rank``; every other rank gets a copy of its input."""
    return synchronize(reduce_async(tensor, root_rank, op, name, process_set))


def reduce_(tensor, root_rank=0, op=Average, name=None, process_set=None) -> torch.Tensor:
    return synchronize(reduce_async_(tensor, root_rank, op, name, process_set))
