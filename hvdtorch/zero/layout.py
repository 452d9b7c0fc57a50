"""Shard layout of a sharded optimizer: which parameters share a flat bucket,
and which contiguous range of every bucket each rank owns.

Rules (the same on every rank, computed without communication):
  * A bucket holds parameters of one optimizer parameter group, one dtype
    and one device (the inner optimizer steps a bucket's shard as one tensor, so it must
    have one set of hyper-parameters and one dtype), in reverse registration
    order -- the order backward produces gradients -- and closes when the
    next parameter would pass the byte cap (a smaller cap for the first one,
    so that the first reduction starts early in backward): the one bucket
    planner's rules (training/buckets.py plan_buckets), with the group in
    the key.
  * A bucket is flat: parameter i occupies [offsets[i], offsets[i] + numel),
    packed in order by the gradient core's one packing rule
    (csrc/core/gradients/bucket_packing.h, _C.packed_offsets), which the
    gradient reducer packs its buckets with too.
  * Set rank r of n owns ``bucket_numel // n`` elements, one more for the
    first ``bucket_numel % n`` ranks, in rank order: exactly the rows a
    reducescatter of the flat bucket gives rank r, and what an allgather of
    the shards puts back together. A shard may be empty (a bucket smaller
    than n).
"""

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .. import _C
from ..training.buckets import plan_buckets


@dataclass
class Bucket:
    group: int  # index of the optimizer parameter group
    dtype: torch.dtype
    params: List[int]  # indices into the flat list of the optimizer's parameters
    offsets: List[int]  # element offset of each parameter in the flat bucket
    shapes: List[Tuple[int, ...]]
    numel: int

    def shard_range(self, rank: int, size: int) -> Tuple[int, int]:
        """[start, end) of the elements set rank ``rank`` of ``size`` owns."""
        return shard_range(self.numel, rank, size)


def write_into_shard(shard: torch.Tensor, start: int, end: int, offset: int, value: torch.Tensor) -> None:
    """Copies into ``shard`` (elements [start, end) of its bucket) the part
    of ``value`` (a parameter at ``offset`` in the bucket) that falls there."""
    lo, hi = max(start, offset), min(end, offset + value.numel())
    if lo < hi:
        flat = value.detach().reshape(-1).to(shard.dtype)
        shard[lo - start : hi - start].copy_(flat[lo - offset : hi - offset])


def shard_range(numel: int, rank: int, size: int) -> Tuple[int, int]:
    """The gradient core's one shard rule (csrc/core/gradients/shard_range.h),
    which the reducer's shard strategies cut the reduced buckets with."""
    return _C.shard_range(numel, rank, size)


def plan(
    groups: Sequence[Sequence[Tuple[int, torch.Tensor]]],
    bucket_bytes: int,
    first_bucket_bytes: int,
    unit_of: Optional[Dict[int, int]] = None,
) -> List[Bucket]:
    """Buckets of the parameters of ``groups`` (one list per optimizer group
    of (index, parameter): the index is the parameter's number in torch's
    optimizer state_dict; parameters left out are not sharded).
    bucket_bytes <= 0: one parameter per bucket. Which parameters share a
    bucket is the one planner's choice (training/buckets.py), here with the
    group (and ``unit_of[index]``, shard=3's unit, zero/unit_plan.py)
    as part of a bucket's key; this adds the offsets and shapes."""
    entries = [(g, i, p) for g, group in enumerate(groups) for i, p in group]
    params = [p for _, _, p in entries]
    keys = [g if unit_of is None else (g, unit_of[i]) for g, i, _ in entries]
    layout = plan_buckets(params, reversed(range(len(entries))), bucket_bytes, first_bucket_bytes, keys)
    buckets: List[Bucket] = []
    for members in layout:
        g, _, first = entries[members[0]]
        shapes = [tuple(entries[e][2].shape) for e in members]
        buckets.append(packed(g, first.dtype, [entries[e][1] for e in members], shapes))
    return buckets


def packed(group: int, dtype: torch.dtype, params: List[int], shapes: Sequence[Tuple[int, ...]]) -> Bucket:
    """The bucket of these parameters (indices and shapes, in bucket order),
    packed by the one rule (_C.packed_offsets)."""
    numels = [int(torch.Size(s).numel()) for s in shapes]
    offsets, numel = _C.packed_offsets(numels)
    return Bucket(group, dtype, list(params), list(offsets), [tuple(s) for s in shapes], numel)


def signature(buckets: Sequence[Bucket]) -> List[Tuple]:
    """What must agree across ranks (and between a sharded checkpoint and the
    optimizer loading it): every bucket's group, dtype and parameters' shapes."""
    return [(b.group, str(b.dtype), list(b.params), [list(s) for s in b.shapes]) for b in buckets]
