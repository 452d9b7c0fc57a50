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
    [phase, clip arguments, folds, the check, hyper-parameters]; a joined
    rank adds [NONE, -inf, ...], so it learns the phase and every value
    exactly. ``folds`` (shard=3): the announcing ranks are about to take in
    the results of a backward pass that ended (zero/gradients.py: each pass
    is reduce-scattered as it ends), so the joined rank reduces zeros once
    to match it.
  * The check: every announcement also carries what each rank with data is
    about to do (the phase, and for PASS whether autograd records the
    forward), folded so that the Max gives the largest and smallest kind
    and, for each, the lowest and highest rank with it. Ranks whose kinds
    differ have diverged (a forward that one rank runs alone, the usual
    rank-0-only evaluation; a step on one rank where another runs a
    forward): every rank raises, naming the ranks and what each was doing,
    instead of waiting for the engine's timeout. PASS announcements are
    waited for at once (a forward's gathers would otherwise pair with
    another rank's other gathers); the others when the next one is made.
  * shard=3: a rank with data also announces each forward (PASS, with
    whether autograd records it); the joined rank replays the gathers and
    frees of its own last pass of that kind (zero/join_replay.py), so
    that every gather of the others finds its shard, and the reduce-scatters
    take its zeros in SYNC. Every pass must gather the same units then
    (fixed control flow, as under FSDP).
  * Inside join(), the joined rank listens to every sharded optimizer it
    has at once (runtime.run_joined_rounds): it runs each announced phase
    with zero gradients, in the order the phases are announced, and leaves
    once each optimizer's announcement comes back NONE (every rank is
    listening: every rank has joined).
Every rank with data must run the same phases: a rank that clips while
another does not is a divergence, which the check names.
"""

import math
from typing import List, Sequence, Tuple

import torch

from .. import _C
from ..collectives import ops

NO_STAND_IN_PREFIX = _C.NO_STAND_IN_PREFIX

NONE, SYNC, CLIP, STEP, PASS = 0, 1, 2, 3, 4

# Ranks below this fit the check's encoding exactly in a float64 (kind * _RANKS + rank).
_RANKS = 1 << 20
# Slots before the check: phase, max_norm, norm_type, error_if_nonfinite, folds.
_HEAD = 5
_CHECK = 4


def _kind(phase: int, grad_enabled: bool) -> int:
    """What the check compares: the phase, and for PASS the grad mode."""
    return 2 * phase + (1 if phase == PASS and grad_enabled else 0)


def describe_kind(kind: int) -> str:
    phase, grad = divmod(kind, 2)
    if phase == PASS:
        return "a forward with autograd (training)" if grad else "a forward without autograd (an evaluation)"
    return {SYNC: "optimizer.synchronize()", CLIP: "optimizer.clip_grad_norm_()", STEP: "optimizer.step()"}.get(
        phase, f"phase {phase}"
    )


def check_values(kind: int, rank: int) -> List[float]:
    """This rank's four check slots (see the top)."""
    return [
        float(kind * _RANKS + rank),
        float(kind * _RANKS + (_RANKS - 1 - rank)),
        float(-kind * _RANKS + rank),
        float(-kind * _RANKS + (_RANKS - 1 - rank)),
    ]


def decode_check(values: Sequence[float]):
    """(largest kind, its lowest rank, its highest rank, smallest kind, its
    lowest rank, its highest rank) from the Max of every rank's
    check_values; None when no rank with data took part."""
    if any(math.isinf(v) for v in values):
        return None
    hi = int(values[0]) // _RANKS
    hi_top = int(values[0]) - hi * _RANKS
    hi_low = _RANKS - 1 - (int(values[1]) - hi * _RANKS)
    q = math.floor(values[2] / _RANKS)
    lo = -q
    lo_top = int(values[2]) - q * _RANKS
    lo_low = _RANKS - 1 - (int(values[3]) - q * _RANKS)
    return hi, hi_low, hi_top, lo, lo_low, lo_top


def _ranks(low: int, high: int) -> str:
    return f"rank {low}" if low == high else f"ranks {low}..{high} (some of them)"


class DivergedError(RuntimeError):
    """The ranks of a sharded optimizer were about to run different things."""


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

    def __init__(self, name: str, groups: Sequence[dict], process_set, what: str = "sharded optimizer"):
        self._name = f"{name}.announce"
        self._groups = groups  # the optimizer's param_groups (the caller's)
        self._process_set = process_set
        self._what = what  # how the check's error names the optimizer
        self._pending = None  # the last announcement's (handle, kind) (announce does not wait for it)

    def _allreduce(self, values: List[float]) -> int:
        return ops.allreduce_async(
            torch.tensor(values, dtype=torch.float64), op=ops.Max, name=self._name, process_set=self._process_set
        )

    def _finish_pending(self) -> None:
        if self._pending is not None:
            (handle, kind), self._pending = self._pending, None
            self._check(ops.synchronize(handle).tolist(), kind)

    def _check(self, got: List[float], kind: int) -> None:
        seen = decode_check(got[_HEAD : _HEAD + _CHECK])
        if seen is None or seen[0] == seen[3]:
            return
        hi, hi_low, hi_top, lo, lo_low, lo_top = seen
        me = self._process_set.ranks[self._process_set.rank()]
        ranks = self._process_set.ranks
        raise DivergedError(
            f"hvdtorch: rank {me}: the ranks of {self._what} diverged: {_ranks(ranks[hi_low], ranks[hi_top])} "
            f"began {describe_kind(hi)}, while {_ranks(ranks[lo_low], ranks[lo_top])} began {describe_kind(lo)} "
            f"(this rank: {describe_kind(kind)}). Every rank must run each forward of a shard=3 model (each "
            "gathers the parameters from every rank's shard) and each phase of the optimizer's step. Evaluate "
            "on every rank (and log or save on one), or, for a model that fits one rank, enter `with "
            "model.gathered_parameters(modifier_rank=None):` on every rank and run the forwards inside on one "
            "rank alone"
        )

    def announce(
        self,
        phase: int,
        clip: Tuple[float, float, bool] = (0.0, 0.0, False),
        folds: bool = False,
        grad_enabled: bool = False,
        wait: bool = False,
    ) -> None:
        """A rank with data is about to run ``phase``; returns without
        waiting unless ``wait`` (then a divergence raises here)."""
        self._finish_pending()
        max_norm, norm_type, error_if_nonfinite = clip
        kind = _kind(phase, grad_enabled)
        values = [float(phase), float(max_norm), float(norm_type), float(error_if_nonfinite), float(folds)]
        values += check_values(kind, self._process_set.rank())
        self._pending = (self._allreduce(values + encode_hyper_parameters(self._groups)), kind)
        if wait:
            self._finish_pending()

    def listen(self) -> int:
        """A joined rank: starts waiting for the next announcement; returns its handle."""
        self._finish_pending()
        n = _HEAD + _CHECK + len(encode_hyper_parameters(self._groups))
        return self._allreduce([float(NONE)] + [-math.inf] * (n - 1))

    @staticmethod
    def arrived(handle: int) -> bool:
        return ops.poll(handle)

    def heard(self, handle: int) -> Tuple[int, Tuple[float, float, bool], bool]:
        """The announcement listen() waits for (blocking until it arrives):
        sets the announced hyper-parameters on the groups; returns the phase
        (NONE: every rank has joined), the clip arguments and ``folds``."""
        got = ops.synchronize(handle).tolist()
        phase = int(got[0])
        if phase == NONE:
            return phase, (0.0, 0.0, False), False
        decode_hyper_parameters(self._groups, got[_HEAD + _CHECK :])
        return phase, (got[1], got[2], bool(got[3])), got[4] > 0
