"""What a shard=3 parameter holds at rest, and the checks that no write to
it is lost.

Contract:
  * At rest a parameter's ``.data`` is a stand-in of its shape, dtype and
    device that takes no memory: one NaN, expanded (every element reads NaN,
    any write raises). ``state_dict()`` and ``load_state_dict()`` of the
    model or any module in it raise, naming the DistributedModel's own
    (which gather) and ``gathered_parameters()`` (parameter_state_dicts.py).
  * A write to a parameter at rest that its stand-in takes without an
    error (fill_, zero_: torch.nn.init.zeros_, constant_) raises at the
    next gather of its bucket, naming it: the write was lost.
  * A parameter written in place while gathered (an in-place op on a
    weight in forward, Embedding(max_norm=...)) raises when its bucket is
    freed or, if it stays gathered, at the end of the forward, naming it:
    the write would be lost with the gathered copy (and on one host be seen
    by the other ranks mid-step), where one process keeps it.
    gathered_parameters() is where parameters are written.
  * Both checks compare each parameter's ``_version`` with the one it had
    when it became a stand-in (_rest_versions) or when its bucket was
    gathered (_versions).
  * Swapping ``.data`` for one of another dtype (a mixed-precision gather)
    keeps the parameter's gradient accumulator, where the gradient
    reducer's hooks are.
"""

from typing import List

import torch

from .. import _C, runtime


def stand_in(p: torch.Tensor) -> torch.Tensor:
    """What a parameter's ``.data`` is at rest (see the top): one NaN of its
    dtype and device, expanded to its shape."""
    return torch.full((), float("nan"), dtype=p.dtype, device=p.device).expand(p.shape)


class _StandIns:
    """ParameterUnits' stand-ins and write checks (a mixin; the state is
    ParameterUnits.__init__'s): reads _buckets, _params, _names and
    _stand_ins, keeps _rest_versions."""

    def _refuse_lost_writes(self, j: int, versions: List[int]) -> None:
        b = self._buckets[j]
        written = [self._names[i] for i, v in zip(b.params, versions) if self._params[i]._version != v]
        if written:
            raise RuntimeError(
                f"hvdtorch: rank {runtime.rank()}: parameters {written[:5]} were written in place while gathered "
                "(an in-place op on a weight in forward, Embedding(max_norm=...)): shard=3 frees the gathered "
                "copy, so the write would be lost (one process keeps it). Write parameters inside `with "
                "model.gathered_parameters():`, or keep this module out of shard=3"
            )

    def _set_data(self, p: torch.Tensor, data: torch.Tensor) -> None:
        """p.data = data. Under a mixed-precision policy the dtype changes
        with it, which makes torch forget p's gradient accumulator, where
        the gradient reducer's hooks are: kept (_C.set_data_keeping_accumulator)."""
        if data.dtype == p.dtype:
            p.data = data
        else:
            _C.set_data_keeping_accumulator(p, data)

    def _to_stand_ins(self, j: int) -> None:
        for i in self._buckets[j].params:
            p = self._params[i]
            self._set_data(p, self._stand_ins[i])
            self._rest_versions[i] = p._version

    def _refuse_writes_at_rest(self, j: int) -> None:
        """A write that a stand-in takes without an error (fill_, zero_, and
        so torch.nn.init.zeros_ and constant_) changes its version only."""
        b = self._buckets[j]
        written = [self._names[i] for i in b.params if self._params[i]._version != self._rest_versions.get(i)]
        if written:
            raise RuntimeError(
                f"hvdtorch: rank {runtime.rank()}: parameters {written[:5]} were written while sharded (outside "
                "forward: p.fill_(), torch.nn.init.zeros_() or constant_()): shard=3 keeps no full values between "
                "uses, so the write was lost (one process keeps it). Write parameters inside `with "
                "model.gathered_parameters():`"
            )
