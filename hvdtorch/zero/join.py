"""How a sharded optimizer goes on after a rank has joined (hvd.join(), out
of data): that rank holds the only optimizer state of its shard, so the
engine cannot stand in for it with zeros as it does in a plain all-reduce.
Instead the joined rank keeps stepping its shard with the others, on the
averaged gradients (to which it adds zeros), until every rank has joined.

Protocol, per sharded optimizer, on every rank of its process set:
  * Every collective of the optimizer is named with _C.NO_STAND_IN_PREFIX,
    so the engine waits for a joined rank to submit it itself.
  * A rank with data announces each phase of a step before its collectives
    (announce): SYNC (synchronize(): the gradients are reduced), CLIP
    (clip_grad_norm_: the norm across the shards) or STEP (step(): the
    shards step, with the parameter groups' hyper-parameters of that moment,
    and are gathered). The announcement is a Max all-reduce of
    [phase, clip arguments, hyper-parameters]; a joined rank adds
    [NONE, -inf, ...], so it learns the phase and every value exactly.
  * shard=3: a rank with data also announces each forward (PASS, with
    whether autograd records it); the joined rank replays the gathers and
    frees of its own last pass of that kind (zero/parameter_units.py), so
    that every gather of the others finds its shard, and the reduce-scatters
    take its zeros in SYNC. Every pass must gather the same units then
    (fixed control flow, as under FSDP).
  * Inside join(), the joined rank listens to every sharded optimizer it
    has at once (runtime.run_joined_rounds): it runs each announced phase
    with zero gradients, in the order the phases are announced, and leaves
    once each optimizer's announcement comes back NONE (every rank is
    listening: every rank has joined).
Every rank with data must run the same phases: a rank that clips while
another does not is a divergence, which the engine's stall timeout names.
"""

import math
from typing import List, Sequence, Tuple

import torch

from .. import _C
from ..collectives import ops

NO_STAND_IN_PREFIX = _C.NO_STAND_IN_PREFIX

NONE, SYNC, CLIP, STEP, PASS = 0, 1, 2, 3, 4


def _numbers(value) -> List[float]:
    """The numbers a hyper-parameter holds (a float, an int, a 0-dim tensor,
    or a tuple of them such as Adam's betas); [] for anything else."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return [float(value.item())]
    if isinstance(value, (tuple, list)):
        out = [_numbers(v) for v in value]
        return [x[0] for x in out] if all(len(x) == 1 for x in out) else []
    return []


def _keys(group) -> List[str]:
    return sorted(k for k in group if k not in ("params", "param_names"))


def encode_hyper_parameters(groups: Sequence[dict]) -> List[float]:
    return [x for g in groups for k in _keys(g) for x in _numbers(g[k])]


def _like(old, x: float):
    if isinstance(old, int):
        return int(round(x))
    if isinstance(old, torch.Tensor):
        return old.fill_(x)
    return x


def decode_hyper_parameters(groups: Sequence[dict], values: Sequence[float]) -> None:
    """Sets the groups' numeric hyper-parameters from encode_hyper_parameters' list."""
    i = 0
    for g in groups:
        for k in _keys(g):
            n = len(_numbers(g[k]))
            if n == 0:
                continue
            old, got = g[k], values[i : i + n]
            g[k] = (
                type(old)(_like(o, x) for o, x in zip(old, got))
                if isinstance(old, (tuple, list))
                else _like(old, got[0])
            )
            i += n


class Announcer:
    """One sharded optimizer's announcements (see the module docstring)."""

    def __init__(self, name: str, groups: Sequence[dict], process_set):
        self._name = f"{name}.announce"
        self._groups = groups  # the optimizer's param_groups (the caller's)
        self._process_set = process_set
        self._pending = None  # the last announcement's handle (announce does not wait for it)

    def _allreduce(self, values: List[float]) -> int:
        return ops.allreduce_async(
            torch.tensor(values, dtype=torch.float64), op=ops.Max, name=self._name, process_set=self._process_set
        )

    def _finish_pending(self) -> None:
        if self._pending is not None:
            handle, self._pending = self._pending, None
            ops.synchronize(handle)

    def announce(self, phase: int, clip: Tuple[float, float, bool] = (0.0, 0.0, False)) -> None:
        """A rank with data is about to run ``phase``; returns without waiting."""
        self._finish_pending()
        max_norm, norm_type, error_if_nonfinite = clip
        values = [float(phase), float(max_norm), float(norm_type), float(error_if_nonfinite)]
        self._pending = self._allreduce(values + encode_hyper_parameters(self._groups))

    def listen(self) -> int:
        """A joined rank: starts waiting for the next announcement; returns its handle."""
        self._finish_pending()
        n = 4 + len(encode_hyper_parameters(self._groups))
        return self._allreduce([float(NONE)] + [-math.inf] * (n - 1))

    @staticmethod
    def arrived(handle: int) -> bool:
        return ops.poll(handle)

    def heard(self, handle: int) -> Tuple[int, Tuple[float, float, bool]]:
        """The announcement listen() waits for (blocking until it arrives):
        sets the announced hyper-parameters on the groups; returns the phase
        (NONE: every rank has joined) and the clip arguments."""
        got = ops.synchronize(handle).tolist()
        phase = int(got[0])
        if phase != NONE:
            decode_hyper_parameters(self._groups, got[4:])
        return phase, (got[1], got[2], bool(got[3]))
