"""Bucket layouts: which parameters' gradients travel together.

Buckets hold one dtype, are filled in the order gradients are expected to
become ready (reverse registration order at first, the observed order after
one iteration), and close when the next gradient would overflow the cap. The
first bucket gets a smaller cap so communication starts early in backward.
"""

from typing import Dict, Iterable, List, Sequence

import torch


def plan_buckets(
    params: Sequence[torch.Tensor], order: Iterable[int], fusion_bytes: int, first_bucket_bytes: int
) -> List[List[int]]:
    """Returns bucket layouts (lists of parameter indices).

    fusion_bytes == 0 puts every parameter in its own bucket."""
    layout: List[List[int]] = []
    open_bucket: Dict[torch.dtype, int] = {}  # dtype -> index in layout
    open_bytes: Dict[torch.dtype, int] = {}
    for i in order:
        p = params[i]
        nbytes = p.numel() * p.element_size()
        if fusion_bytes <= 0:
            layout.append([i])
            continue
        cap = first_bucket_bytes if len(layout) <= 1 and first_bucket_bytes > 0 else fusion_bytes
        b = open_bucket.get(p.dtype)
        if b is None or (open_bytes[p.dtype] + nbytes > cap and layout[b]):
            layout.append([])
            b = open_bucket[p.dtype] = len(layout) - 1
            open_bytes[p.dtype] = 0
        layout[b].append(i)
        open_bytes[p.dtype] += nbytes
    return layout


def complete_order(order: Sequence[int], count: int) -> List[int]:
    """The observed ready order, with parameters that never became ready
    (unused this iteration) appended in reverse registration order."""
    seen = set(order)
    return list(order) + [i for i in reversed(range(count)) if i not in seen]
