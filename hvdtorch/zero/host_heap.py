"""Where glibc's malloc puts a sharded step's temporaries (nothing changes
where the C library has no mallopt).

Why: the inner optimizer's temporaries on CPU shards (Adam's are a few
tensors the size of each shard) are freed when its step returns. glibc
maps a block at or above its mmap threshold (and unmaps it when freed) and
serves smaller ones from the heap, which keeps them once freed; by default
it raises that threshold to the largest mapped block freed, up to 32 MiB.
A shard's temporaries, a shard count times smaller than unsharded
training's, so came from the heap in some steps and from fresh mappings in
others, and what the heap kept sat under the next forward and backward: the
peak RSS of a sharded job fell by 0.64 of the optimizer state it saves
(median of 5 rounds; single rounds 0.3 to 1.1), against 1.37 with the
thresholds fixed (BENCHMARKS.md, "Peak memory per rank").

What: the first step on CPU shards fixes the thresholds (which turns glibc's
dynamic rule off for the rest of the process): blocks of MMAP_THRESHOLD or
more are always mapped, so the temporaries of a shard of that size or more
never stay on the heap; smaller blocks (activations, small shards) come
from the heap and are reused every step. The heap's top is handed back once
TRIM_THRESHOLD is free there. An earlier design trimmed the whole heap after
every step (malloc_trim): it handed back the freed activations too, and the
page faults of touching them again in the next forward cost 15-20% of
GoogLeNet's throughput (benchmarks/zero.py, the alwaystrim configurations).

Contract: process-wide and for the rest of the process, as every mallopt
setting is; idempotent.
"""

import ctypes

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

# Below the shard of a bucket of the sharded optimizer's default size
# (fusion_bytes, 25 MiB) on 2 or 3 ranks; above most activations of a CPU
# batch, which then keep coming from the heap.
MMAP_THRESHOLD = 8 << 20
# Twice glibc's largest dynamic mmap threshold, where its own rule would put
# the trim threshold at most.
TRIM_THRESHOLD = 64 << 20


def _find_mallopt():
    try:
        return getattr(ctypes.CDLL(None), "mallopt", None)
    except OSError:
        return None


_mallopt = _find_mallopt()
_fixed = False


def fix_mmap_threshold() -> None:
    """Fixes glibc's mmap and trim thresholds at MMAP_THRESHOLD and
    TRIM_THRESHOLD (once per process)."""
    global _fixed
    if _fixed or _mallopt is None:
        return
    _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    _mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    _fixed = True
