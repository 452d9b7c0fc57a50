"""hvdtorch: Horovod-style data-parallel training for PyTorch.

    import hvdtorch as hvd
    hvd.init()
    model = hvd.DistributedModel(model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

A script written for ``horovod.torch`` runs with ``import hvdtorch as hvd``.
"""
from .broadcast import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .compression import Compression
from .distributed_model import DistributedModel
from .ops import (
    Adasum,
    Average,
    HvdError,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    global_process_set,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    poll,
    synchronize,
)
from .optimizer import DistributedOptimizer
from .runtime import (
    cross_rank,
    cross_size,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    shutdown,
    size,
)

__version__ = "0.1.0"


def knobs():
    """Every HVDTORCH_* environment variable as (name, default, meaning)."""
    from . import _C
    return _C.knobs()
