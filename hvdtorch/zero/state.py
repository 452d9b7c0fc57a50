"""Optimizer state in two shapes, and the conversions between them.

  full     torch's own optimizer state, keyed by parameter index (the
           parameters of the optimizer's groups, in order): what an
           unsharded optimizer's state_dict() holds; tensors have their
           parameter's shape.
  bucket   the state of one bucket's flat shard, keyed by state name: what
           the inner optimizer of a sharded optimizer holds for the flat
           tensor it steps.

A state value is element-wise (one entry per parameter element: Adam's
exp_avg, SGD's momentum_buffer) when it is a tensor of its parameter's shape
and its name is not one of SCALAR_KEYS; every other value (a step count, a
learning-rate factor) is per parameter and the same for every parameter of a
bucket, since a bucket's shard steps as one tensor. Only optimizers whose
state is all of these kinds can be sharded (zero/optimizer_options.py checks).
"""

from typing import Dict, List, Optional, Sequence

import torch

from .layout import Bucket

# Per-tensor counters of torch's element-wise optimizers (Adam's step, ASGD's eta
# and mu): 0-dimensional, like a 0-dimensional parameter's element-wise state.
SCALAR_KEYS = frozenset({"step", "eta", "mu"})


def _elementwise(key, value, shape) -> bool:
    return key not in SCALAR_KEYS and isinstance(value, torch.Tensor) and tuple(value.shape) == tuple(shape)


def shard_of_full(bucket: Bucket, full: Dict[int, Dict], start: int, end: int) -> Optional[Dict]:
    """The state of elements [start, end) of ``bucket`` from the full state
    ``full`` (parameters without state there count as zeros). None when no
    parameter of the bucket has state (the optimizer creates it at its first step)."""
    present = [(k, full[i]) for k, i in enumerate(bucket.params) if full.get(i)]
    if not present:
        return None
    out: Dict = {}
    for k, state in present:
        for key, value in state.items():
            if key in out:
                continue
            if _elementwise(key, value, bucket.shapes[k]):
                out[key] = _slice(bucket, full, key, value, start, end)
            else:
                out[key] = value.clone() if isinstance(value, torch.Tensor) else value
    return out


def _slice(bucket: Bucket, full: Dict[int, Dict], key, like: torch.Tensor, start: int, end: int) -> torch.Tensor:
    pieces: List[torch.Tensor] = []
    for i, offset, shape in zip(bucket.params, bucket.offsets, bucket.shapes):
        n = 1
        for d in shape:
            n *= d
        lo, hi = max(start, offset), min(end, offset + n)
        if lo >= hi:
            continue
        value = full.get(i, {}).get(key)
        if value is None:
            pieces.append(torch.zeros(hi - lo, dtype=like.dtype, device=like.device))
        else:
            pieces.append(value.reshape(-1)[lo - offset : hi - offset].to(like.dtype))
    if not pieces:
        return torch.zeros(0, dtype=like.dtype, device=like.device)
    return torch.cat(pieces)


def is_elementwise_flat(key, value) -> bool:
    """Whether a value of a bucket's (flat, one-dimensional) state has one entry per element."""
    return key not in SCALAR_KEYS and isinstance(value, torch.Tensor) and value.dim() == 1


def full_of_bucket(bucket: Bucket, flat: Dict) -> Dict[int, Dict]:
    """Splits a bucket's whole flat state (element-wise values of
    bucket.numel entries, in bucket order, and per-parameter scalars) into
    per-parameter state shaped like the parameters."""
    out: Dict[int, Dict] = {}
    for i, offset, shape in zip(bucket.params, bucket.offsets, bucket.shapes):
        n = 1
        for d in shape:
            n *= d
        state = {}
        for key, value in flat.items():
            if is_elementwise_flat(key, value):
                state[key] = value[offset : offset + n].reshape(shape).clone()
            else:
                state[key] = value.clone() if isinstance(value, torch.Tensor) else value
        out[i] = state
    return out


def merge_shards(bucket: Bucket, shards: Sequence[Optional[Dict]]) -> Optional[Dict]:
    """A bucket's whole flat state from every rank's shard state, in set-rank
    order (element-wise values concatenated, scalars taken from the first
    shard that has them)."""
    present = [s for s in shards if s]
    if not present:
        return None
    size = len(shards)
    flat: Dict = {}
    ranges = [bucket.shard_range(r, size) for r in range(size)]
    for key, value in present[0].items():
        if is_elementwise_flat(key, value):
            parts = []
            for (start, end), s in zip(ranges, shards):
                part = (s or {}).get(key)
                parts.append(part if part is not None else torch.zeros(end - start, dtype=value.dtype))
            flat[key] = torch.cat([p.to(value.device) for p in parts])
            if flat[key].numel() != bucket.numel:
                raise ValueError(
                    f"hvdtorch: the shards of state {key!r} hold {flat[key].numel()} elements, "
                    f"the bucket {bucket.numel}"
                )
        else:
            flat[key] = value
    return flat
