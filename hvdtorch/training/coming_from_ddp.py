"""DistributedDataParallel's constructor arguments, as DistributedModel takes them.

A DDP script's wrapping line works with the class name changed, and an
argument that would mean something else here is an error naming it instead
of being ignored (docs/guide.md, "Coming from DDP").

| DDP argument | here |
|---|---|
| device_ids=[d], output_device=d | checked: d must be the device of the module's parameters (one device per process) |
| dim=0 | checked: only 0 (the module runs on one device: nothing is scattered) |
| broadcast_buffers, init_sync | DistributedModel's own arguments, same meaning (buffer_sync.py) |
| bucket_cap_mb | fusion_bytes = bucket_cap_mb MiB |
| find_unused_parameters, static_graph | accepted: unused parameters are always handled as with |
| | find_unused_parameters=True (no rank's gradient: .grad stays None); the bucket order is learnt |
| | in the first step |
| gradient_as_bucket_view, check_reduction | accepted: gradients are always views into the buckets |
| process_group | only the default (whole-job) group; use process_set= for a subset of ranks |
| anything else (mixed_precision, device_mesh, ...) | TypeError naming it |
"""

from typing import Optional

import torch


def _device_of(module: torch.nn.Module) -> Optional[torch.device]:
    devices = {p.device for p in module.parameters()}
    return next(iter(devices)) if len(devices) == 1 else None


def _as_device(d) -> torch.device:
    if isinstance(d, int):
        return torch.device("cuda", d)
    return torch.device(d)


def ddp_arguments(
    module: torch.nn.Module,
    fusion_bytes: int,
    *,
    device_ids,
    output_device,
    dim: int,
    process_group,
    bucket_cap_mb,
    unsupported: dict,
) -> int:
    """Checks DDP's arguments against ``module``; returns the bucket cap in bytes."""
    if unsupported:
        raise TypeError(
            f"hvdtorch: DistributedModel got unexpected arguments {sorted(unsupported)}; of "
            "DistributedDataParallel's it takes device_ids, output_device, dim, broadcast_buffers, init_sync, "
            "process_group, bucket_cap_mb, find_unused_parameters, check_reduction, gradient_as_bucket_view and "
            "static_graph (docs/guide.md, 'Coming from DDP')"
        )
    here = _device_of(module)
    if device_ids is not None:
        ids = list(device_ids)
        if len(ids) != 1 or here is None or _as_device(ids[0]) != here:
            raise ValueError(
                f"hvdtorch: DistributedModel: device_ids={device_ids!r}, but the module's parameters are on "
                f"{here if here is not None else 'several devices'}; pass the one device of the module "
                "(or leave device_ids out: the module's device is used)"
            )
    if output_device is not None and (here is None or _as_device(output_device) != here):
        raise ValueError(
            f"hvdtorch: DistributedModel: output_device={output_device!r}, but the module's parameters are on "
            f"{here}; outputs stay where the module puts them (leave output_device out)"
        )
    if dim != 0:
        raise ValueError(f"hvdtorch: DistributedModel: dim={dim}; only 0 (the module runs on one device per process)")
    if process_group is not None:
        import torch.distributed as dist

        world = dist.group.WORLD if dist.is_initialized() else None
        if process_group is not world:
            raise ValueError(
                "hvdtorch: DistributedModel: process_group= other than the whole job is not supported; pass "
                "process_set=hvd.add_process_set(ranks) for gradients averaged over some ranks"
            )
    if bucket_cap_mb is not None:
        if bucket_cap_mb <= 0:
            raise ValueError(f"hvdtorch: DistributedModel: bucket_cap_mb={bucket_cap_mb} must be positive")
        return int(float(bucket_cap_mb) * (1 << 20))
    return fusion_bytes
