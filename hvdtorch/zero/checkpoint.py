"""Checkpoints of a ShardedOptimizer: its state_dict (this rank's shard),
the full state gathered from every shard, and loading either.

Formats:
  shard  sharded_state_dict(): ``{"state": {bucket: state}, "param_groups": [...], "hvdtorch_shard":
         {"rank", "size", "buckets"}}``: this rank's shard of every bucket,
         the caller's groups (hyper-parameters, parameter numbers) and the
         layout it was cut from (signature in zero/layout.py), which is all it
         takes to put the shards of every rank back together anywhere.
  full   torch's format over the caller's parameters, as the unsharded
         optimizer's state_dict() holds it (zero/state.py): what
         consolidate_state_dict() returns (and state_dict() after it, on the
         ranks it went to) and what a plain optimizer loads.

Loading a full state (or the list of every rank's shards, merged into one)
works at any number of ranks and with any bucket cap: each rank cuts its own
shard out of it. A single shard loads only into the rank and job size it
came from (TorchState's in-memory restore).
"""

from typing import Dict, List, Optional

import torch

from .. import runtime
from ..collectives import ops
from ..collectives.alltoall import alltoall_async
from ..collectives.broadcast import allgather_object
from .layout import Bucket, packed, signature
from .state import full_of_bucket, is_elementwise_flat, merge_shards, shard_of_full

_HYPER_SKIP = ("params", "param_names")


def _outer_groups(opt) -> List[Dict]:
    """The caller's groups: hyper-parameters and parameter numbers (torch's state_dict form)."""
    out, n = [], 0
    for group in opt.param_groups:
        g = {k: v for k, v in group.items() if k != "params"}
        g["params"] = list(range(n, n + len(group["params"])))
        n += len(group["params"])
        out.append(g)
    return out


def consolidated_state_dict(opt) -> Dict:
    """state_dict(): the full state consolidate_state_dict() left here, or the error naming the way."""
    if opt._consolidated is not None:
        return opt._consolidated
    raise RuntimeError(
        f"hvdtorch: rank {runtime.rank()}: state_dict() of a sharded optimizer (shard={opt._stage}) needs "
        "consolidate_state_dict() first: each rank holds only its shard of the state, so a checkpoint of it "
        "would silently hold one rank's part. Call optimizer.consolidate_state_dict(to=0) on every rank, then "
        "state_dict() on rank 0 (to=None: on every rank), after the last step(); a checkpoint block that only "
        "rank 0 runs (`if rank == 0: torch.save(...)`) needs the consolidate_state_dict(to=0) line just before "
        "its `if`, where every rank runs it. Or save each rank's optimizer.sharded_state_dict() and load the "
        "list of them"
    )


def shard_state_dict(opt) -> Dict:
    inner = opt.optim.state_dict()
    bucket_of = {v: j for j, v in opt._inner_index.items()}
    return {
        "state": {bucket_of[k]: v for k, v in inner["state"].items()},
        "param_groups": _outer_groups(opt),
        "hvdtorch_shard": {"rank": opt._rank, "size": opt._size, "buckets": signature(opt._buckets)},
    }


def _buckets_of(sig) -> List[Bucket]:
    """Buckets back from their signature."""
    return [packed(group, getattr(torch, dtype.split(".")[-1]), params, shapes) for group, dtype, params, shapes in sig]


def merge(shards) -> Dict:
    """The full state from every rank's shard state_dict (any order)."""
    metas = [s.get("hvdtorch_shard") if isinstance(s, dict) else None for s in shards]
    if not shards or any(m is None for m in metas):
        raise ValueError("hvdtorch: a list given to load_state_dict must hold every rank's sharded state_dict()")
    size = metas[0]["size"]
    ranks = sorted(m["rank"] for m in metas)
    if ranks != list(range(size)) or any(m["size"] != size or m["buckets"] != metas[0]["buckets"] for m in metas):
        raise ValueError(
            f"hvdtorch: the list must hold the shards of one job, one per rank: got ranks {ranks} of a job of "
            f"{size} (or shards of different jobs)"
        )
    by_rank = sorted(shards, key=lambda s: s["hvdtorch_shard"]["rank"])
    state: Dict[int, Dict] = {}
    for j, bucket in enumerate(_buckets_of(metas[0]["buckets"])):
        flat = merge_shards(bucket, [s["state"].get(j) for s in by_rank])
        if flat:
            state.update(full_of_bucket(bucket, flat))
    return {"state": state, "param_groups": by_rank[0]["param_groups"]}


def load(opt, state_dict) -> None:
    if isinstance(state_dict, (list, tuple)):
        state_dict = merge(state_dict)
    meta = state_dict.get("hvdtorch_shard")
    if meta is None:
        _load_full(opt, state_dict)
        return
    if meta["buckets"] != signature(opt._buckets):
        raise ValueError(
            "hvdtorch: this sharded state was cut from another bucket layout (other parameters, groups or "
            "fusion_bytes): load the full state (consolidate_state_dict()) or the list of every rank's shards"
        )
    if (meta["rank"], meta["size"]) != (opt._rank, opt._size):
        raise ValueError(
            f"hvdtorch: this is rank {meta['rank']}'s shard of a job of {meta['size']} ranks, and this is rank "
            f"{opt._rank} of {opt._size}: load the full state (consolidate_state_dict()) or the list of every "
            "rank's shards"
        )
    _load_inner(opt, {j: s for j, s in state_dict["state"].items()}, state_dict["param_groups"])


def _load_full(opt, state_dict) -> None:
    saved_groups = state_dict["param_groups"]
    if len(saved_groups) != len(opt.param_groups) or any(
        len(s["params"]) != len(g["params"]) for s, g in zip(saved_groups, opt.param_groups)
    ):
        raise ValueError(
            "hvdtorch: the loaded state has "
            f"{[len(s['params']) for s in saved_groups]} parameters per group, this optimizer "
            f"{[len(g['params']) for g in opt.param_groups]}"
        )
    # Saved parameter numbers -> this optimizer's, by position (torch's rule).
    number = {}
    for s in saved_groups:
        for k in s["params"]:
            number[k] = len(number)
    full = {number[k]: v for k, v in state_dict["state"].items()}
    shards = {}
    for j, b in enumerate(opt._buckets):
        start, end = b.shard_range(opt._rank, opt._size)
        st = shard_of_full(b, full, start, end)
        if st is not None:
            shards[j] = st
    _load_inner(opt, shards, saved_groups)


def _load_inner(opt, shards: Dict[int, Dict], saved_groups) -> None:
    """Gives the inner optimizer these bucket states and everyone the saved hyper-parameters."""
    inner_groups = []
    buckets_of_group = [[] for _ in opt.param_groups]
    for j, b in enumerate(opt._buckets):
        buckets_of_group[b.group].append(j)
    for g, saved in enumerate(saved_groups):
        hyper = {k: v for k, v in saved.items() if k not in _HYPER_SKIP}
        opt.param_groups[g].update(hyper)
        inner_groups.append(dict(hyper, params=[opt._inner_index[j] for j in buckets_of_group[g]]))
    opt.optim.load_state_dict(
        {"state": {opt._inner_index[j]: s for j, s in shards.items()}, "param_groups": inner_groups}
    )


def _set_ranks(opt, to) -> Optional[List[int]]:
    if to is None:
        return None
    ranks = [to] if isinstance(to, int) else list(to)
    members = opt._process_set.ranks
    outside = [r for r in ranks if r not in members]
    if outside:
        raise ValueError(f"hvdtorch: consolidate_state_dict(to={to!r}): ranks {outside} are not in the process set")
    return sorted({members.index(r) for r in ranks})


def consolidate(opt, to) -> Optional[Dict]:
    dests = _set_ranks(opt, to)
    receive = dests is None or opt._rank in dests
    local = shard_state_dict(opt)["state"]
    n, ps, name = opt._size, opt._process_set, opt._name
    if n > 1:
        keys = {j: sorted(map(str, s)) for j, s in local.items()}
        every = allgather_object(keys, name=f"{name}.consolidate.keys", process_set=ps)
        if any(k != keys for k in every):
            raise ValueError("hvdtorch: the ranks' optimizer shards hold different state (did every rank step?)")
    full: Dict[int, Dict] = {}
    for j, bucket in enumerate(opt._buckets):
        st = local.get(j)
        if not st:
            continue
        flat, started = {}, {}
        for key, value in st.items():
            if not is_elementwise_flat(key, value) or n == 1:
                flat[key] = value
            elif dests is None:
                started[key] = ops.allgather_async(value, name=f"{name}.consolidate.{j}.{key}", process_set=ps)
            else:  # a gather: every rank sends its shard to each destination, and nothing elsewhere
                src = value.repeat(len(dests)) if len(dests) > 1 else value
                splits = [value.numel() if d in dests else 0 for d in range(n)]
                started[key] = alltoall_async(src, splits, name=f"{name}.consolidate.{j}.{key}", process_set=ps)
        for key, handle in started.items():
            out = ops.synchronize(handle)
            flat[key] = out if dests is None else out[0]
        if receive:
            cpu = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in flat.items()}
            full.update(full_of_bucket(bucket, cpu))
    if not receive:
        return None
    return {"state": full, "param_groups": _outer_groups(opt)}
