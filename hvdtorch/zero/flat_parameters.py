"""How a ShardedOptimizer holds its parameters: as views of flat buckets,
with this rank's shard of each bucket stepped by an inner optimizer.

Contract:
  * The trainable parameters are laid out in flat buckets (zero/layout.py);
    every parameter becomes a view of its bucket, and rank r's shard of a
    bucket is one contiguous range of it. The wrapped optimizer is rebuilt
    (same class, same hyper-parameters, group by group) over the shards:
    one flat tensor per bucket, so its state exists for the shard only.
  * shard=3: the shards are tensors of their own, and the flat buckets
    exist only while gathered (zero/parameter_units.py); a model built on
    the meta device gets its shards module by module (zero/meta_init.py).
  * Every rank must build the same buckets: _agree_layout_and_gather checks
    it (collective), and tells whether the buckets are reduced and gathered
    in place (every rank on one host, every flat in registered memory).
"""

import inspect
from typing import List, Optional

import torch

from .. import runtime
from ..collectives.broadcast import allgather_object
from .layout import signature
from .meta_init import build_shards


class _FlatParameters:
    """ShardedOptimizer's flat buckets and shards (a mixin; the state is
    ShardedOptimizer.__init__'s): reads _buckets, _all_params, _process_set,
    _rank, _size, _stage and _name; takes _from_meta (and clears it); keeps
    _flats, _shards and _inner_index."""

    def _flatten_parameters(self) -> None:
        """Parameters become views of flat buckets (in registered memory where
        the engine has it, see _gather); this rank's shards are views too.
        shard=3: the shards are tensors of their own, and the flat buckets
        exist only while gathered (zero/parameter_units.py)."""
        engine = runtime.state().engine
        self._flats: List[Optional[torch.Tensor]] = []
        self._shards: List[torch.Tensor] = []
        if self._from_meta is not None:
            module, device, init_fn, broadcast = self._from_meta
            self._from_meta = None
            self._flats = [None] * len(self._buckets)
            self._shards = build_shards(
                module, self._all_params, self._buckets, self._process_set, self._name, device, init_fn, broadcast
            )
            return
        with torch.no_grad():
            for b in self._buckets:
                device = self._all_params[b.params[0]].device
                if self._stage == 3:
                    flat = torch.empty(b.numel, dtype=b.dtype, device=device)
                    for i, offset in zip(b.params, b.offsets):
                        p = self._all_params[i]
                        flat[offset : offset + p.numel()].copy_(p.detach().reshape(-1))
                    start, end = b.shard_range(self._rank, self._size)
                    self._flats.append(None)
                    self._shards.append(flat[start:end].clone())
                    continue
                if device.type == "cpu" and self._size > 1:
                    flat = engine.registered_zeros(b.numel, b.dtype)
                else:
                    flat = torch.zeros(b.numel, dtype=b.dtype, device=device)
                for i, offset in zip(b.params, b.offsets):
                    p = self._all_params[i]
                    flat[offset : offset + p.numel()].copy_(p.detach().reshape(-1))
                    p.data = flat[offset : offset + p.numel()].view_as(p)
                start, end = b.shard_range(self._rank, self._size)
                self._flats.append(flat)
                self._shards.append(flat[start:end])

    def _inner_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The caller's class and hyper-parameters, over this rank's shards."""
        inner_groups, self._inner_index = [], {}
        for g, group in enumerate(optimizer.param_groups):
            hyper = {k: v for k, v in group.items() if k not in ("params", "param_names")}
            shards = []
            for j, b in enumerate(self._buckets):
                if b.group == g:
                    self._inner_index[j] = len(self._inner_index)
                    shards.append(self._shards[j])
            inner_groups.append(dict(hyper, params=shards))
        accepted = inspect.signature(type(optimizer).__init__).parameters
        return type(optimizer)(inner_groups, **{k: v for k, v in optimizer.defaults.items() if k in accepted})

    def _agree_layout_and_gather(self) -> bool:
        """Checks that every rank has the same buckets; returns whether the
        parameters are gathered in place (every rank on one host, every flat in
        registered memory)."""
        mine = signature(self._buckets)
        # shard=3 has no flats to reduce or gather in place: its gradient buffers are released (reduce-scattered).
        registered = (
            self._stage < 3 and runtime.state().engine.registered_stats()[0] > 0 and self._flats[0].device.type == "cpu"
        )
        here = (mine, runtime.cross_rank(), registered)
        every = allgather_object(here, name=f"{self._name}.layout", process_set=self._process_set)
        differ = [self._process_set.ranks[k] for k, theirs in enumerate(every) if theirs[0] != mine]
        if differ:
            raise ValueError(
                f"hvdtorch: rank {self._process_set.ranks[self._rank]}: the sharded optimizer's parameters differ "
                f"on ranks {differ} (number, shapes, dtypes or parameter groups): every rank must build the same "
                "model and optimizer"
            )
        return len({host for _, host, _ in every}) == 1 and all(registered for _, _, registered in every)
