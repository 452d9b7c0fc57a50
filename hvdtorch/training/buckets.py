"""Bucket layouts: which parameters' gradients travel together. The one
bucket planner of every gradient path: DistributedModel and
DistributedOptimizer call plan_buckets, the sharded optimizer too, through
zero/layout.py's plan (which adds each bucket's offsets and shard ranges).

Buckets hold one device, one dtype (and, given ``group_of``, one optimizer
parameter group), are filled in the order gradients are expected to become
ready (reverse registration order at first, the observed order after one
iteration), and close when the next gradient would overflow the cap. The
first bucket gets a smaller cap so communication starts early in backward.

A layer's parameters (given ``layer_of``) stay in one bucket where they fit:
backward computes a layer's weight and bias gradients in one autograd node,
so a bucket that ended with the bias of the next layer would wait for that
layer's whole backward, although the rest of it was ready long before.
Across hosts that wait is idle wire (a 16 MiB bucket held back by an 8 KiB
bias until a 33 MiB layer's backward is done).
"""

from typing import Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

import torch


def plan_buckets(
    params: Sequence[torch.Tensor],
    order: Iterable[int],
    fusion_bytes: int,
    first_bucket_bytes: int,
    group_of: Optional[Sequence[Hashable]] = None,
    layer_of: Optional[Sequence[Hashable]] = None,
    bucket_caps: Optional[Sequence[int]] = None,
) -> List[List[int]]:
    """Returns bucket layouts (lists of parameter indices), in ``order``.

    fusion_bytes <= 0 puts every parameter in its own bucket. ``group_of[i]``
    (optional): parameters of different groups never share a bucket.
    ``layer_of[i]`` (optional; None: no layer): when a parameter opens a new
    bucket, the parameters of its layer at the end of the bucket it
    overflowed move with it, unless they are all that bucket holds.
    ``bucket_caps`` (optional, DDP's bucket_cap_mb_list in bytes): the cap
    of the k-th bucket opened is bucket_caps[k] (the last one for every later
    bucket), in place of first_bucket_bytes and fusion_bytes."""
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
        key = (None if group_of is None else group_of[i], p.device, p.dtype)
        b = open_bucket.get(key)
        if bucket_caps:
            cap = bucket_caps[min(len(layout) if b is None else b, len(bucket_caps) - 1)]
        else:
            cap = first_bucket_bytes if len(layout) <= 1 and first_bucket_bytes > 0 else fusion_bytes
        if b is None or (open_bytes[key] + nbytes > cap and layout[b]):
            moved = _same_layer_tail(layout[b], layer_of, i) if b is not None else []
            layout.append(moved)
            b = open_bucket[key] = len(layout) - 1
            open_bytes[key] = sum(params[j].numel() * params[j].element_size() for j in moved)
        layout[b].append(i)
        open_bytes[key] += nbytes
    return layout


def _same_layer_tail(bucket: List[int], layer_of, i: int) -> List[int]:
    """Removes from the end of ``bucket`` the parameters of parameter i's
    layer and returns them, in order; nothing when they are the whole bucket."""
    layer = None if layer_of is None else layer_of[i]
    if layer is None:
        return []
    k = len(bucket)
    while k > 0 and layer_of[bucket[k - 1]] == layer:
        k -= 1
    if k == 0:
        return []
    moved = bucket[k:]
    del bucket[k:]
    return moved


def layers_by_name(names: Sequence[Optional[str]]) -> List[Optional[str]]:
    """The layer of each parameter from its qualified name: the owning
    module's path ("classifier.0" of "classifier.0.weight"). A parameter with
    no name, or registered on the root module, has no layer (None)."""
    return [n.rpartition(".")[0] or None if n else None for n in names]


def complete_order(order: Sequence[int], count: int) -> List[int]:
    """The observed ready order, with parameters that never became ready
    (unused this iteration) appended in reverse registration order."""
    seen = set(order)
    return list(order) + [i for i in reversed(range(count)) if i not in seen]
