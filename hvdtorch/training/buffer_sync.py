"""DistributedDataParallel's module-state semantics for DistributedModel.

* check_same_model(): at the wrap, before anything is broadcast, the ranks
  compare a digest of the module's parameters and buffers (names, shapes,
  dtypes; one Min and one Max all-reduce of it); where they differ, every
  rank raises naming the first parameter or buffer that differs and what
  each rank has, instead of a broadcast's mismatch of packed sizes.
* broadcast_state(buffers): when the model is wrapped, every rank of the
  process set takes the set's first rank's parameters, and its buffers
  unless told otherwise (DDP's ``init_sync``; which buffers go is DDP's rule,
  coming_from_ddp.resolve_buffer_sync), so that forgetting
  hvd.broadcast_parameters() cannot train one model per rank.
* sync_buffers(): every rank takes the first rank's buffers (DDP's forward
  sync). When is the caller's: DDP's ``require_forward_param_sync`` rule
  (ForwardSyncRule below), so that BatchNorm's running statistics are rank
  0's wherever DDP has them so: in every training step's forward, and in the
  first evaluation forward after training (what each rank evaluates and
  saves). Buffers of SyncBatchNorm layers (ours and torch's) are left out:
  they are equal on every rank by construction. A model without other
  buffers broadcasts nothing.

Tensors are packed per device and dtype into one flat tensor each, and each
is one broadcast: a BatchNorm network's few hundred small buffers cost two
collectives a step, not hundreds. Buffers are looked up at every call, so a
buffer the module replaced (``module.running_mean = ...``) is the one synced.

Uneven data (hvd.join()): once the first rank has joined it has nothing to
send, and every rank still training gets the engine's refusal of that
broadcast alike. They then agree which ranks still train (a Sum of one-hot
rows, to which joined ranks add zeros) and take the buffers from the first of
them, so training goes on as under DDP's join (which takes them from a rank
still training too: the last).
"""

import hashlib
import re
from typing import Dict, List, Tuple

import torch

from .. import runtime
from ..collectives import ops
from ..collectives.broadcast import allgather_object
from .sync_batch_norm import SyncBatchNorm

# How the engine refuses an op whose root has joined (Coordinator::whileJoinedError: "...: its root
# rank [0] has joined (...)"); tests/workers/join.py pins the same words.
_ROOT_JOINED = re.compile(r"its root rank \[\d+\] has joined")


def _synced_by_construction(module: torch.nn.Module) -> set:
    """ids of the buffers of SyncBatchNorm layers."""
    out = set()
    for m in module.modules():
        if isinstance(m, (SyncBatchNorm, torch.nn.SyncBatchNorm)):
            out.update(id(b) for b in m.buffers(recurse=False))
    return out


def _described(row) -> str:
    """One rank's entry of check_same_model's signature, for the message."""
    return "nothing (fewer tensors)" if row is None else f"{row[0]} {row[1]!r} {list(row[2])} {row[3]}"


class ForwardSyncRule:
    """DDP's ``require_forward_param_sync``: a forward syncs the buffers
    exactly when the forward before it was a training forward (autograd on)
    whose backward reduces (``require_backward_grad_sync``, i.e. outside
    no_sync()); the first forward syncs. So train -> eval syncs, eval ->
    train and a forward after a no_sync() one do not."""

    def __init__(self):
        self.due = True

    def after_forward(self, grad_enabled: bool, backward_syncs: bool) -> None:
        self.due = bool(grad_enabled and backward_syncs)


class BufferSync:
    def __init__(self, module: torch.nn.Module, process_set, name: str, enabled: bool):
        """``enabled``: buffers are synced before forwards at all (DDP's forward_sync_buffers)."""
        self._module = module
        self._set = process_set
        self._name = name
        self.enabled = bool(enabled)

    def _signature(self) -> List[Tuple[str, str, Tuple[int, ...], str]]:
        """(kind, name, shape, dtype) of every parameter and buffer, in module order."""
        out = [("parameter", n, tuple(p.shape), str(p.dtype)) for n, p in self._module.named_parameters()]
        return out + [("buffer", n, tuple(b.shape), str(b.dtype)) for n, b in self._module.named_buffers()]

    def check_same_model(self, where: str) -> None:
        """Every rank of the set holds a module of the same parameters and
        buffers (collective); raises on every rank naming the first that
        differs. ``where`` names the wrapper in the message."""
        if self._set.size() <= 1:
            return
        mine = self._signature()
        digest = int.from_bytes(hashlib.sha256(repr(mine).encode()).digest()[:8], "little", signed=True)
        t = torch.tensor([digest], dtype=torch.int64)
        low = ops.allreduce(t, op=ops.Min, name=f"{self._name}.same_model.min", process_set=self._set)
        high = ops.allreduce(t, op=ops.Max, name=f"{self._name}.same_model.max", process_set=self._set)
        if int(low) == int(high):
            return
        every = allgather_object(mine, name=f"{self._name}.same_model.signatures", process_set=self._set)
        ranks = self._set.ranks
        me = runtime.rank()
        for k in range(max(len(sig) for sig in every)):
            rows = [sig[k] if k < len(sig) else None for sig in every]
            if all(r == rows[0] for r in rows):
                continue
            first = next(r for r in rows if r is not None)
            shown = "; ".join(f"rank {ranks[i]}: {_described(r)}" for i, r in enumerate(rows))
            raise ValueError(
                f"hvdtorch: rank {me}: {where}: the models differ across ranks, first at {first[0]} {first[1]!r} "
                f"({shown}). Every rank must build the same model (the same code, arguments and order) before "
                "wrapping it"
            )

    def broadcast_state(self, buffers: bool = True) -> None:
        """Parameters, and buffers if ``buffers``, from the set's first rank (once, at wrap)."""
        with torch.no_grad():
            tensors = [p.data for p in self._module.parameters()]
            if buffers:
                tensors += list(self._module.buffers())
            self._broadcast(tensors, "init_sync")

    def sync_buffers(self) -> None:
        """The first rank's buffers on every rank (collective), unless disabled."""
        if not self.enabled:
            return
        skip = _synced_by_construction(self._module)
        buffers = [b for b in self._module.buffers() if id(b) not in skip]
        with torch.no_grad():
            self._broadcast(buffers, "buffers")

    def _broadcast(self, tensors: List[torch.Tensor], what: str) -> None:
        if self._set.size() <= 1:
            return
        groups: Dict[Tuple[torch.device, torch.dtype], List[torch.Tensor]] = {}
        seen = set()
        for t in tensors:
            if id(t) in seen or t.numel() == 0:
                continue  # tied tensors once
            seen.add(id(t))
            if t.is_complex():
                t = torch.view_as_real(t)  # the same memory, as real pairs
            groups.setdefault((t.device, t.dtype), []).append(t)
        root = self._set.ranks[0]
        # In an order, and under names, that hold on every rank (ranks may use different GPUs).
        order = sorted(groups, key=lambda k: (k[0].type, k[0].index if k[0].index is not None else -1, str(k[1])))
        for k, key in enumerate(order):
            group = groups[key]
            flat = torch.cat([t.reshape(-1) for t in group])
            try:
                ops.broadcast_(flat, root, name=f"{self._name}.{what}.{k}", process_set=self._set)
            except ops.HvdError as e:
                if not _ROOT_JOINED.search(str(e)):
                    raise
                root = self._first_rank_training(f"{self._name}.{what}.{k}")
                ops.broadcast_(flat, root, name=f"{self._name}.{what}.{k}.joined", process_set=self._set)
            if runtime.rank() == root:
                continue  # the root's tensors are what was sent
            offset = 0
            for t in group:
                n = t.numel()
                t.copy_(flat[offset : offset + n].view_as(t))
                offset += n

    def _first_rank_training(self, name: str) -> int:
        """The lowest global rank that has not joined (joined ranks add zeros to the Sum)."""
        mine = torch.zeros(runtime.size())
        mine[runtime.rank()] = 1.0
        training = ops.allreduce(mine, op=ops.Sum, name=f"{name}.training_ranks", process_set=self._set)
        return int(torch.nonzero(training)[0])
