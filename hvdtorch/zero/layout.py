"""Shard layout of a sharded optimizer: which parameters share a flat bucket,
and which contiguous range of every bucket each rank owns.

Rules (the same on every rank, computed without communication):
  * A bucket holds parameters of one optimizer parameter group, one dtype
    and one device (the inner optimizer steps a bucket's shard as one tensor, so it must
    have one set of hyper-parameters and one dtype), in reverse registration
    order -- the order backward produces gradients -- and closes when the
    next parameter would pass the byte cap (a smaller cap for the first one,
    so that the first reduction starts early in backward).
  * A bucket is flat: parameter i occupies [offsets[i], offsets[i] + numel).
  * Set rank r of n owns ``bucket_numel // n`` elements, one more for the
    first ``bucket_numel % n`` ranks, in rank order: exactly the rows a
    reducescatter of the flat bucket gives rank r, and what an allgather of
    the shards puts back together. A shard may be empty (a bucket smaller
    than n).
"""

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch


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


def shard_range(numel: int, rank: int, size: int) -> Tuple[int, int]:
    base, extra = divmod(numel, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def plan(
    groups: Sequence[Sequence[Tuple[int, torch.Tensor]]], bucket_bytes: int, first_bucket_bytes: int
) -> List[Bucket]:
    """Buckets of the parameters of ``groups`` (one list per optimizer group
    of (index, parameter): the index is the parameter's number in torch's
    optimizer state_dict; parameters left out are not sharded).
    bucket_bytes <= 0: one parameter per bucket."""
    entries = [(g, i, p) for g, group in enumerate(groups) for i, p in group]
    buckets: List[Bucket] = []
    open_bucket = {}  # (group, dtype, device) -> index of the bucket being filled
    for g, i, p in reversed(entries):
        key = (g, p.dtype, p.device)
        nbytes = p.numel() * p.element_size()
        cap = first_bucket_bytes if len(buckets) <= 1 and first_bucket_bytes > 0 else bucket_bytes
        b = open_bucket.get(key)
        if b is None or bucket_bytes <= 0 or (buckets[b].numel * p.element_size() + nbytes > cap and buckets[b].params):
            buckets.append(Bucket(g, p.dtype, [], [], [], 0))
            b = open_bucket[key] = len(buckets) - 1
        bucket = buckets[b]
        bucket.params.append(i)
        bucket.offsets.append(bucket.numel)
        bucket.shapes.append(tuple(p.shape))
        bucket.numel += p.numel()
    return buckets


def signature(buckets: Sequence[Bucket]) -> List[Tuple]:
    """What must agree across ranks (and between a sharded checkpoint and the
    optimizer loading it): every bucket's group, dtype and parameters' shapes."""
    return [(b.group, str(b.dtype), list(b.params), [list(s) for s in b.shapes]) for b in buckets]
