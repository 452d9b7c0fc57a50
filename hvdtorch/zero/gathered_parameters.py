"""shard=3's gathered_parameters(): every parameter whole inside, and the
write-back of what the modifier rank wrote.

Contract:
  * ``gathered_parameters(modifier_rank)`` pins every bucket gathered for
    its body (nothing is freed, forward and backward inside included); on a
    clean exit each bucket is broadcast from ``modifier_rank`` (the set's
    rank: global rank ``process_set.ranks[modifier_rank]``) and every rank
    takes its range back into its shard, and the module's other state
    (buffers, frozen parameters) that any rank wrote inside is broadcast
    from it too, so that what the modifier holds (a load_state_dict() of
    the module inside, say) is what every rank holds after (None: read
    only; a write to a sharded parameter inside is then an error at exit).
    Inside, the module's own state_dict() and load_state_dict() work, as on
    a plain module.
  * Collective: every rank of the process set enters and leaves it. Nested,
    only the outermost exit writes back and frees.
  * Inside, the buckets are gathers of the rank's own in the shards' own
    precision (gather_routes.py): what was in the host's copy, or in the
    policy's dtype, is freed first. At the outermost exit every bucket is
    freed, the kept ones too: a write inside went to the shards (the
    write-back) or nowhere (an exception, read only).
  * A write-back changes the shards: the secondary copies are dropped.
"""

import contextlib
import itertools
from typing import Dict, List, Optional

import torch

from .. import runtime
from ..collectives import ops


class _GatheredParameters:
    """ParameterUnits' gathered_parameters() (a mixin; the state is
    ParameterUnits.__init__'s): reads _buckets, _params, _names, _module,
    _index_of, _process_set, _rank, _size, _gathers, _on_host and
    _gather_dtype; keeps _pins and _private, writes _shards and clears
    _secondary; frees and gathers through _free, free_all and _gather."""

    @contextlib.contextmanager
    def gathered_parameters(self, modifier_rank: Optional[int] = 0):
        """Every parameter whole inside (collective); see the top for writes."""
        if modifier_rank is not None and not 0 <= int(modifier_rank) < self._size:
            raise ValueError(
                f"hvdtorch: gathered_parameters(modifier_rank={modifier_rank}): a rank of the process set "
                f"(0..{self._size - 1}), or None"
            )
        if self._pins == 0:  # writes inside must land in copies of the rank's own (see _write_back)
            for j in list(self._on_host) + [j for j, (handle, _) in self._gathers.items() if handle is None]:
                self._free(j)
            if self._gather_dtype is not None:  # inside, the parameters hold the shards' own precision
                self.free_all(kept_too=True)
        self._private += 1
        try:
            self._gather(list(reversed(range(len(self._buckets)))))
        finally:
            self._private -= 1
        self._pins += 1
        versions = {i: self._params[i]._version for b in self._buckets for i in b.params}
        rest_versions = {id(t): t._version for t in self._unsharded_state()}
        clean = False
        try:
            yield
            clean = True
        finally:
            self._pins -= 1
            try:
                if clean and self._pins == 0:
                    self._write_back(modifier_rank, versions, rest_versions)
            finally:
                # The kept buckets too: a write inside went to the shards (the write-back) or nowhere (an
                # exception, read only), so no gathered copy may keep it.
                if self._pins == 0:
                    self.free_all(kept_too=True, writes_taken=True)

    def _unsharded_state(self) -> List[torch.Tensor]:
        """The module's tensors shard=3 does not hold (buffers, frozen
        parameters, parameters the optimizer does not step), in the
        module's order (the same on every rank)."""
        module = self._module()
        if module is None:
            return []
        return [t for t in itertools.chain(module.parameters(), module.buffers()) if id(t) not in self._index_of]

    def _write_back(
        self, modifier_rank: Optional[int], versions: Dict[int, int], rest_versions: Dict[int, int]
    ) -> None:
        if modifier_rank is None:
            written = [self._names[i] for i, v in versions.items() if self._params[i]._version != v]
            if written:
                raise RuntimeError(
                    f"hvdtorch: rank {runtime.rank()}: parameters {written[:5]} were written inside "
                    "gathered_parameters(modifier_rank=None), which is read only: the write would be lost. Pass "
                    "modifier_rank= (the rank whose values every rank takes)"
                )
            return
        root = self._process_set.ranks[int(modifier_rank)]
        self._secondary.clear()  # the shards take the written values
        with torch.no_grad():
            for j, b in enumerate(self._buckets):
                full = self._full[j]
                if self._size > 1:
                    ops.broadcast_(full, root, name=f"{self._name}.write_back.{j}", process_set=self._process_set)
                start, end = b.shard_range(self._rank, self._size)
                self._shards[j].copy_(full[start:end])
            # The module's other state (a load_state_dict() inside loads buffers and frozen parameters too):
            # where any rank wrote one, every rank takes modifier_rank's.
            rest = self._unsharded_state()
            if rest and self._size > 1:
                written = torch.tensor(
                    [float(rest_versions.get(id(t)) != t._version) for t in rest], dtype=torch.float64
                )
                written = ops.allreduce(
                    written, op=ops.Max, name=f"{self._name}.write_back.rest", process_set=self._process_set
                )
                for k, (t, w) in enumerate(zip(rest, written.tolist())):
                    if w > 0:
                        ops.broadcast_(
                            t.data, root, name=f"{self._name}.write_back.rest.{k}", process_set=self._process_set
                        )
