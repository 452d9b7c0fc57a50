"""Bucket layouts: which parameters' gradients travel together. The one
bucket planner of every gradient path: DistributedModel and
DistributedOptimizer call plan_buckets, the sharded optimizer too, through
zero/layout.py's plan (which adds each bucket's offsets and shard ranges).

Buckets hold one device, one dtype (and, given ``group_of``, one optimizer
parameter group), are filled in the order gradients are expected to become
ready (reverse registration order at first, the observed order after one
iteration), and close when the next gradient would overflow the cap. The
first bucket gets a smaller cap so communication starts early in backward.
"""

from typing import Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

import torch


def plan_buckets(
    params: Sequence[torch.Tensor],
    order: Iterable[int],
    fusion_bytes: int,
    first_bucket_bytes: int,
    group_of: Optional[Sequence[Hashable]] = None,
) -> List[List[int]]:
    """Returns bucket layouts (lists of parameter indices), in ``order``.

    fusion_bytes <= 0 puts every parameter in its own bucket. ``group_of[i]``
    (optional): parameters of different groups never share a bucket."""
    layout: List[List[int]] = []
    Key = Tuple[Hashable, torch.device, torch.dtype]
    open_bucket: Dict[Key, int] = {}  # (group, device, dtype) -> index in layout
    open_bytes: Dict[Key, int] = {}
    for i in order:
        p = params[i]
        nbytes = p.numel() * p.element_size()
        if fusion_bytes <= 0:
            layout.append([i])
            continue
        cap = first_bucket_bytes if len(layout) <= 1 and first_bucket_bytes > 0 else fusion_bytes
        key = (None if group_of is None else group_of[i], p.device, p.dtype)
        b = open_bucket.get(key)
        if b is None or (open_bytes[key] + nbytes > cap and layout[b]):
            layout.append([])
            b = open_bucket[key] = len(layout) - 1
            open_bytes[key] = 0
        layout[b].append(i)
        open_bytes[key] += nbytes
    return layout


def complete_order(order: Sequence[int], count: int) -> List[int]:
    """The observed ready order, with parameters that never became ready
    (unused this iteration) appended in reverse registration order."""
    seen = set(order)
    return list(order) + [i for i in reversed(range(count)) if i not in seen]
