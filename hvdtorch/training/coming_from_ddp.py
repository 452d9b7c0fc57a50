"""DistributedDataParallel's constructor arguments, as DistributedModel takes them.

A DDP script's wrapping line works with the class name changed, and an
argument that would mean something else here is an error naming it instead
of being ignored (docs/guide.md, "Coming from DDP"). torch 2.13's DDP is the
reference.

| DDP argument | here |
|---|---|
| device_ids=[d], output_device=d | checked: d must be the device of the module's parameters, by type and index |
| dim=0 | checked: only 0 (the module runs on one device: nothing is scattered) |
| forward_sync_buffers, broadcast_buffers | DDP's rules (resolve_buffer_sync): forward_sync_buffers given: buffers |
| | synced before forwards as it says, and always at the wrap; else broadcast_buffers (default True) |
| | decides both |
| init_sync | the same meaning: parameters (and buffers, as above) from the first rank at the wrap |
| bucket_cap_mb | fusion_bytes = bucket_cap_mb MiB |
| bucket_cap_mb_list | a cap per bucket, in MiB, in the order buckets fill (the last for any later one); |
| | fusion_bytes = the largest |
| mixed_precision | DDP's _MixedPrecision or an hvd.MixedPrecisionPolicy (training/mixed_precision.py) |
| device_mesh | only a 1-D mesh over the whole job; use process_set= for a subset of ranks |
| find_unused_parameters, static_graph, skip_all_reduce_unused_params | accepted: a parameter no rank gave a |
| | gradient keeps .grad None (as DDP's find_unused_parameters=True and skip_all_reduce_unused_params); the |
| | bucket order is learnt in the first step |
| gradient_as_bucket_view, check_reduction, batched_grad_copy | accepted: gradients are always views into |
| | the buckets (nothing is copied per parameter after the first step) |
| process_group | only the default (whole-job) group; use process_set= for a subset of ranks |
| anything else (delay_all_reduce_named_params, ...) | TypeError naming it |
"""

from dataclasses import dataclass
from typing import List, Optional

import torch

# Every DDP argument DistributedModel takes, for the TypeError's list.
TAKEN = (
    "device_ids",
    "output_device",
    "dim",
    "broadcast_buffers",
    "forward_sync_buffers",
    "init_sync",
    "process_group",
    "device_mesh",
    "bucket_cap_mb",
    "bucket_cap_mb_list",
    "mixed_precision",
    "find_unused_parameters",
    "check_reduction",
    "gradient_as_bucket_view",
    "static_graph",
    "skip_all_reduce_unused_params",
    "batched_grad_copy",
)


@dataclass
class DDPOptions:
    """What DDP's arguments decide for DistributedModel."""

    fusion_bytes: int
    bucket_caps: Optional[List[int]]  # bytes per bucket in fill order (bucket_cap_mb_list), or None
    forward_sync_buffers: bool  # buffers from the first rank before forwards (DDP's rule, buffer_sync.py)
    init_sync_buffers: bool  # buffers too in the wrap's broadcast


def resolve_buffer_sync(broadcast_buffers: Optional[bool], forward_sync_buffers: Optional[bool]):
    """DDP's rule (torch 2.13): ``forward_sync_buffers`` given decides the
    forward sync and the wrap always syncs buffers; otherwise
    ``broadcast_buffers`` (None: True) decides both. Returns (forward, init)."""
    if forward_sync_buffers is not None:
        return bool(forward_sync_buffers), True
    effective = True if broadcast_buffers is None else bool(broadcast_buffers)
    return effective, effective


def _device_of(module: torch.nn.Module) -> Optional[torch.device]:
    devices = {p.device for p in module.parameters()}
    return next(iter(devices)) if len(devices) == 1 else None


def _as_device(d) -> torch.device:
    if isinstance(d, int):
        return torch.device("cuda", d)
    return torch.device(d)


def _same_device(given, here: Optional[torch.device]) -> bool:
    """``given`` names ``here``: the same type and, where ``given`` has one,
    the same index (torch.device("cuda") means the current device)."""
    if here is None:
        return False
    d = _as_device(given)
    if d.type != here.type:
        return False
    if d.index is None:
        return here.type != "cuda" or here.index in (None, torch.cuda.current_device())
    return d.index == (here.index if here.index is not None else 0)


def _check_whole_job(group, what: str) -> None:
    import torch.distributed as dist

    world = dist.group.WORLD if dist.is_initialized() else None
    if group is not world:
        raise ValueError(
            f"hvdtorch: DistributedModel: {what} other than the whole job is not supported; pass "
            "process_set=hvd.add_process_set(ranks) for gradients averaged over some ranks"
        )


def ddp_arguments(
    module: torch.nn.Module,
    fusion_bytes: int,
    *,
    device_ids,
    output_device,
    dim: int,
    process_group,
    device_mesh,
    bucket_cap_mb,
    bucket_cap_mb_list,
    broadcast_buffers,
    forward_sync_buffers,
    unsupported: dict,
) -> DDPOptions:
    """Checks DDP's arguments against ``module``."""
    if unsupported:
        raise TypeError(
            f"hvdtorch: DistributedModel got unexpected arguments {sorted(unsupported)}; of "
            f"DistributedDataParallel's it takes {', '.join(TAKEN)} (docs/guide.md, 'Coming from DDP')"
        )
    here = _device_of(module)
    if device_ids is not None:
        ids = list(device_ids)
        if len(ids) != 1 or not _same_device(ids[0], here):
            raise ValueError(
                f"hvdtorch: DistributedModel: device_ids={device_ids!r}, but the module's parameters are on "
                f"{here if here is not None else 'several devices'}; pass the one device of the module "
                "(or leave device_ids out: the module's device is used)"
            )
    if output_device is not None and not _same_device(output_device, here):
        raise ValueError(
            f"hvdtorch: DistributedModel: output_device={output_device!r}, but the module's parameters are on "
            f"{here}; outputs stay where the module puts them (leave output_device out)"
        )
    if dim != 0:
        raise ValueError(f"hvdtorch: DistributedModel: dim={dim}; only 0 (the module runs on one device per process)")
    if process_group is not None and device_mesh is not None:
        raise ValueError("hvdtorch: DistributedModel: process_group and device_mesh given both (as DDP, pass one)")
    if process_group is not None:
        _check_whole_job(process_group, "process_group=")
    if device_mesh is not None:
        if device_mesh.ndim != 1:
            raise ValueError(f"hvdtorch: DistributedModel: device_mesh must be 1-D (as DDP's), got {device_mesh}")
        _check_whole_job(device_mesh.get_group(mesh_dim=0), "a device_mesh")
    caps = None
    if bucket_cap_mb_list:
        if any(c <= 0 for c in bucket_cap_mb_list):
            raise ValueError(
                f"hvdtorch: DistributedModel: bucket_cap_mb_list={bucket_cap_mb_list}: caps must be positive"
            )
        caps = [int(float(c) * (1 << 20)) for c in bucket_cap_mb_list]
        fusion_bytes = max(caps)
    elif bucket_cap_mb is not None:
        if bucket_cap_mb <= 0:
            raise ValueError(f"hvdtorch: DistributedModel: bucket_cap_mb={bucket_cap_mb} must be positive")
        fusion_bytes = int(float(bucket_cap_mb) * (1 << 20))
    forward, init = resolve_buffer_sync(broadcast_buffers, forward_sync_buffers)
    return DDPOptions(fusion_bytes, caps, forward, init)
