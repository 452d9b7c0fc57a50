"""Broadcast helpers with Horovod's names: parameters, optimizer state and
arbitrary picklable objects."""

import io
from typing import Any, List

import torch

from .. import runtime
from . import ops, own_state
from .handles import check_process_set, op_name


def broadcast_parameters(params, root_rank: int = 0, process_set=None) -> None:
    """Overwrites every rank's (of the process set's) tensors with root_rank's, in place.

    ``params``: a state_dict, or an iterable of (name, tensor) pairs such as
    model.named_parameters()."""
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = list(params)
        if items and not isinstance(items[0], tuple):
            raise ValueError("hvdtorch: broadcast_parameters expects a state_dict or (name, tensor) pairs")
    handles = []
    for name, p in items:
        if p is None:
            continue
        t = p.data if isinstance(p, torch.nn.Parameter) or p.requires_grad else p
        handles.append(ops.broadcast_async_(t, root_rank, name=f"broadcast_parameters.{name}", process_set=process_set))
    for h in handles:
        ops.synchronize(h)


def _to_bytes(obj: Any) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _from_bytes(t: torch.Tensor) -> Any:
    return torch.load(io.BytesIO(t.numpy().tobytes()), weights_only=False)


def broadcast_object(obj: Any, root_rank: int = 0, name: str = None, process_set=None) -> Any:
    """Returns root_rank's ``obj`` on every rank of the set (pickled with torch.save)."""
    name = op_name("broadcast_object", name, check_process_set(process_set))
    data = _to_bytes(obj) if runtime.rank() == root_rank else torch.empty(0, dtype=torch.uint8)
    size = ops.broadcast(
        torch.tensor([data.numel()], dtype=torch.int64), root_rank, name=f"{name}.size", process_set=process_set
    )
    if runtime.rank() != root_rank:
        data = torch.empty(int(size.item()), dtype=torch.uint8)
    data = ops.broadcast_(data, root_rank, name=f"{name}.data", process_set=process_set)
    return obj if runtime.rank() == root_rank else _from_bytes(data)


def allgather_object(obj: Any, name: str = None, process_set=None) -> List[Any]:
    """Returns the list of every rank's (of the set's) ``obj``, in rank order."""
    name = op_name("allgather_object", name, check_process_set(process_set))
    data = _to_bytes(obj)
    sizes = ops.allgather(
        torch.tensor([data.numel()], dtype=torch.int64), name=f"{name}.sizes", process_set=process_set
    ).tolist()
    gathered = ops.allgather(data, name=f"{name}.data", process_set=process_set)
    out, offset = [], 0
    for n in sizes:
        out.append(_from_bytes(gathered[offset : offset + n]))
        offset += n
    return out


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, root_rank: int = 0, model=None, process_set=None
) -> None:
    """Makes every rank's (of the set's) optimizer state and hyper-parameters root_rank's.

    ``model`` is accepted for Horovod compatibility and not needed. A sharded
    optimizer (shard=1/2) holds a shard of the state on each rank; it does
    this itself (gathers the state to root_rank, broadcasts, each rank takes
    its shard). State of each rank's own (Adasum's momentum, PowerSGD's
    error feedback: own_state.py) becomes the root's, on purpose."""
    sharded = getattr(optimizer, "_hvd_broadcast_state", None)
    if sharded is not None:
        sharded(root_rank)
        return
    state = broadcast_object(
        optimizer.state_dict(), root_rank, name="broadcast_optimizer_state", process_set=process_set
    )
    if runtime.rank() != root_rank:
        optimizer.load_state_dict(own_state.disown(state))
