"""The torch.distributed process groups under a job: the default group that
init() joins from the launcher's environment and shutdown() leaves, the
backend of the device groups, and the destruction of groups.

Contract:
  * _join_default_group() creates the default group ("gloo", and
    "cuda:nccl" beside it where torch has CUDA and NCCL) through a store of
    this init()'s own: a HashStore for a job of one rank, the env:// store
    (torchrun, or MASTER_ADDR/MASTER_PORT) under a key prefix of each
    generation and torchrun restart (_open_env_store), or else a FileStore
    on the one host, whose path it returns for shutdown() to remove; ranks
    on several hosts without MASTER_ADDR and MASTER_PORT are refused.
  * _leave_default_group() undoes that: the group, torch's excepthook
    wrapper and rank 0's FileStore file. A default group the script made
    itself is adopted by init() and never left (runtime.py).
  * _device_backend(): the backend of the groups device tensors move
    through, the engine's (_device_group()) and a process set's
    (runtime.make_set_groups): NCCL, Gloo under HVDTORCH_SIM_DEVICE=1, or
    none.
  * destroy_groups() destroys each group given, skipping None and ignoring
    a group already gone with a dead peer.
"""

import datetime
import os
import sys
import time
from typing import Optional

import torch
import torch.distributed as dist

from . import launch

# How many times this process has joined a job through env:// (torchrun, or
# MASTER_ADDR/MASTER_PORT): each init() meets under a key prefix of its own.
_generation = 0


def _open_env_store(info: launch.LaunchInfo, timeout: datetime.timedelta):
    """The env:// rendezvous store of this init(), under this generation's prefix.

    The store lives as long as the default group and goes with it at
    shutdown(), so nothing (server thread, sockets) outlives hvdtorch. After
    shutdown(); init(), a fast rank can still reach rank 0's previous store
    (rank 0 has not shut down yet): rank 0 marks each generation's store as
    open, and a rank that does not see the mark in time reconnects, until the
    overall timeout."""
    global _generation
    _generation += 1
    # torchrun's agent may share its store with the workers across restarts
    # (restarted workers count generations from 1 again): the restart count
    # keeps each round's keys apart.
    prefix = f"hvdtorch.restart{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}.init{_generation}"
    if info.rank == 0:  # hosts the store: nothing old to run into
        base, _, _ = next(dist.rendezvous("env://", rank=0, world_size=info.size, timeout=timeout))
        store = dist.PrefixStore(prefix, base)
        store.set("open", "1")
        return store
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        left = deadline - time.monotonic()
        try:
            # Connecting can itself fail on an old store that closes under it.
            base, _, _ = next(dist.rendezvous("env://", rank=info.rank, world_size=info.size, timeout=timeout))
            store = dist.PrefixStore(prefix, base)
            store.wait(["open"], datetime.timedelta(seconds=max(0.1, min(2.0, left))))
            return store
        except Exception as e:  # an old store that closed, or one that never gets the mark
            store = base = None
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"hvdtorch: rank {info.rank} did not meet rank 0's rendezvous store at "
                    f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} "
                    f"within {timeout.total_seconds():.0f} s: {e}"
                ) from e
            time.sleep(0.05)


def _join_default_group(info: launch.LaunchInfo, timeout: datetime.timedelta):
    """Creates the default process group from the launcher's environment.

    Returns the FileStore path to remove at shutdown (or None)."""
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    if info.size == 1:
        store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)
        return None
    if info.launcher == "torchrun" or (info.master_addr and info.master_port):
        os.environ.setdefault("MASTER_ADDR", info.master_addr or "127.0.0.1")
        if info.master_port is None:
            raise ValueError("hvdtorch: MASTER_PORT is not set")
        store = _open_env_store(info, timeout)
        dist.init_process_group(backend, store=store, rank=info.rank, world_size=info.size, timeout=timeout)
        return None
    if not info.single_host_by_launcher:
        raise ValueError(
            f"hvdtorch: {info.launcher} started {info.size} ranks on several hosts; set MASTER_ADDR "
            "(the host of rank 0) and MASTER_PORT (a free port there) so the ranks can meet"
        )
    path = launch.file_store_path(info)
    store = dist.FileStore(path, info.size)
    dist.init_process_group(backend, store=store, rank=info.rank, world_size=info.size, timeout=timeout)
    return path


def _leave_default_group(store_path: Optional[str], rank: int, excepthook) -> None:
    """Undoes what init() did to join the default group it created."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            pass
        # init_process_group() chains a "[rank N]" prefixing hook onto
        # sys.excepthook on every call; unchained, init/shutdown cycles would
        # grow the chain (and the prefixes) forever. A hook the user set since
        # is left alone.
        if getattr(sys.excepthook, "__qualname__", "").endswith("_distributed_excepthook"):
            sys.excepthook = excepthook
    if store_path and rank == 0:
        try:
            os.remove(store_path)
        except OSError:
            pass


def _device_backend() -> Optional[str]:
    """The backend of the groups the engine moves device tensors through,
    without the host (reducers "native" and "auto" where it serves, and the
    broadcast, all-gather, reduce-scatter and alltoall): NCCL
    where torch has CUDA and NCCL (made lazily by torch: no communicator
    until the first such collective); Gloo standing in for it under
    HVDTORCH_SIM_DEVICE=1, so that path runs without a GPU; else none, and
    device tensors are staged through the host."""
    from . import _C

    if torch.cuda.is_available() and dist.is_nccl_available():
        return "nccl"
    if _C.sim_device_mode():
        return "gloo"
    return None


def _device_group(timeout: datetime.timedelta):
    backend = _device_backend()
    return dist.new_group(backend=backend, timeout=timeout) if backend else None


def destroy_groups(groups) -> None:
    for group in groups:
        if group is None:
            continue
        try:
            dist.destroy_process_group(group)
        except Exception:  # the group may already be gone with a dead peer
            pass
