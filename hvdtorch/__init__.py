"""hvdtorch: Horovod-style data-parallel training for PyTorch.

    import hvdtorch as hvd
    hvd.init()
    model = hvd.DistributedModel(model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

A script written for ``horovod.torch`` runs with ``import hvdtorch as hvd``.
"""

try:
    from . import _C  # noqa: F401  (the compiled core; everything below needs it)
except ImportError as _error:
    raise ImportError(
        f"hvdtorch: the compiled extension hvdtorch._C cannot be loaded ({_error}); build it with "
        "`pip install --no-build-isolation .` (or `make build`) against the torch installed here, "
        "then run `python -m hvdtorch.check`"
    ) from _error
from . import (  # noqa: F401  (horovod.torch's submodules, for scripts importing from them)
    elastic,  # noqa: F401  (hvd.elastic.run, TorchState, ElasticSampler)
    functions,
    mpi_ops,
)
from .alltoall import alltoall, alltoall_async
from .broadcast import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .compression import Compression
from .distributed_model import DistributedModel
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt, InvalidArgumentError
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
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    join,
    poll,
    synchronize,
)
from .optimizer import DistributedOptimizer
from .process_set_table import add_process_set, remove_process_set
from .process_sets import ProcessSet, global_process_set
from .reducescatter import grouped_reducescatter, grouped_reducescatter_async, reducescatter, reducescatter_async
from .runtime import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
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
    rocm_built,
    shutdown,
    size,
)
from .sharded_optimizer import ShardedOptimizer
from .sparse import sparse_allreduce_async
from .sync_batch_norm import SyncBatchNorm
from .timeline import start_timeline, stop_timeline

__version__ = "0.1.0"


# Knobs outside the engine's Config (whose knobs _C.knobs() lists): read in Python only.
_PYTHON_KNOBS = [
    (
        "HVDTORCH_ELASTIC_DIR",
        "",
        "where hvd.elastic states commit (TorchState(commit_dir=...) overrides); empty: commits in memory only",
    ),
]


def knobs():
    """Every HVDTORCH_* environment variable as (name, default, meaning)."""
    from . import _C

    return list(_C.knobs()) + _PYTHON_KNOBS
