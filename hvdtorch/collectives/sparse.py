"""Reduction of sparse (COO) tensors, as Horovod does it: every rank's
indices and values are all-gathered (ranks may hold different numbers of
non-zeros) and the concatenation, coalesced, is the sum; Average divides it by
the number of ranks afterwards, so it equals the dense Average of the
densified tensors (integer values truncate toward zero, as the dense op does).

    handle = hvd.sparse_allreduce_async(emb.weight.grad, name="emb", op=hvd.Average)
    summed = hvd.synchronize(handle)     # or handle(), as with Horovod
"""

from typing import List, Optional, Sequence

import torch

from .. import runtime
from ..exceptions import InvalidArgumentError
from . import ops
from .handles import check_process_set, op_name


class SparseHandle:
    """What sparse_allreduce_async returns: calling it (or hvd.synchronize on
    it) waits and returns the reduced sparse tensor; poll() says whether both
    all-gathers have finished."""

    def __init__(self, indices_handle: int, values_handle: int, like: torch.Tensor, op: int, ranks: int):
        self._indices_handle, self._values_handle = indices_handle, values_handle
        self._like, self._op, self._ranks = like, op, ranks
        self._result: Optional[torch.Tensor] = None

    def poll(self) -> bool:
        return self._result is not None or (ops.poll(self._indices_handle) and ops.poll(self._values_handle))

    def __call__(self) -> torch.Tensor:
        if self._result is None:
            values = ops.synchronize(self._values_handle)
            indices = ops.synchronize(self._indices_handle)
            summed = torch.sparse_coo_tensor(
                indices.t(),
                values,
                self._like.shape,
                dtype=self._like.dtype,
                device=self._like.device,
                check_invariants=True,
            ).coalesce()
            if self._op == ops.Average:
                v = summed.values()
                v = v / self._ranks if v.is_floating_point() else torch.div(v, self._ranks, rounding_mode="trunc")
                summed = torch.sparse_coo_tensor(
                    summed.indices(), v, summed.shape, is_coalesced=True, check_invariants=False
                )  # indices checked above
            self._result = summed
        return self._result


def sparse_allreduce_async(
    tensor: torch.Tensor, name: Optional[str] = None, op: Optional[int] = None, process_set=None
) -> SparseHandle:
    """Starts the reduction of a sparse COO tensor (op: Average, the default, or Sum)."""
    check_process_set(process_set)
    process_set = process_set or ops.global_process_set
    op = ops.Average if op is None else op
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.sparse_coo:
        got = type(tensor).__name__ if not isinstance(tensor, torch.Tensor) else f"a {tensor.layout} tensor"
        raise InvalidArgumentError(
            f"hvdtorch: rank {runtime.rank()}: sparse_allreduce expects a sparse COO tensor, got {got}"
        )
    if op not in (ops.Average, ops.Sum):
        raise InvalidArgumentError(
            f"hvdtorch: rank {runtime.rank()}: sparse_allreduce reduces with Average or Sum only (got op {op!r})"
        )
    name = op_name("sparse_allreduce", name, process_set.process_set_id)
    local = tensor.coalesce()  # merge duplicates before sending them
    # All-gather concatenates along dim 0, so indices travel as (nnz, sparse_dim).
    indices_handle = ops.allgather_async(
        local.indices().t().contiguous(), name=f"{name}.indices", process_set=process_set
    )
    values_handle = ops.allgather_async(local.values().contiguous(), name=f"{name}.values", process_set=process_set)
    return SparseHandle(indices_handle, values_handle, tensor, op, process_set.size())


def agree_sparse_dims(grads: Sequence[Optional[torch.Tensor]], name: str, process_set=None) -> List[int]:
    """For each gradient slot, the sparse_dim it has on the ranks where it is
    sparse (0: dense or absent everywhere). A collective: every rank must call
    it with the same number of slots (every member of ``process_set``), and
    all learn the same answer."""
    mine = torch.tensor([g.sparse_dim() if g is not None and g.is_sparse else 0 for g in grads], dtype=torch.int32)
    if mine.numel() == 0:
        return []
    return [int(d) for d in ops.allreduce(mine, op=ops.Max, name=name, process_set=process_set)]


def as_sparse(grad: Optional[torch.Tensor], like: torch.Tensor, sparse_dim: int) -> torch.Tensor:
    """``grad`` as a sparse COO tensor with ``sparse_dim`` sparse dimensions:
    an empty one when this rank has no gradient, the sparse form of a dense one."""
    if grad is None:
        values = torch.zeros((0,) + tuple(like.shape[sparse_dim:]), dtype=like.dtype, device=like.device)
        return torch.sparse_coo_tensor(
            torch.zeros(sparse_dim, 0, dtype=torch.int64, device=like.device), values, like.shape, device=like.device
        )
    if not grad.is_sparse:
        return grad.to_sparse(sparse_dim)
    if grad.sparse_dim() != sparse_dim:
        raise InvalidArgumentError(
            f"hvdtorch: rank {runtime.rank()}: a sparse gradient has {grad.sparse_dim()} sparse "
            f"dimensions here and {sparse_dim} on another rank"
        )
    return grad
