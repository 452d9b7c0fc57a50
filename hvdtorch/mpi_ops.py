"""``horovod.torch.mpi_ops``'s public names, for scripts that import them from
there (``from horovod.torch.mpi_ops import synchronize`` becomes
``from hvdtorch.mpi_ops import synchronize``). The same objects as
``hvdtorch.<name>``; nothing is defined here."""

from .collectives.alltoall import alltoall, alltoall_async  # noqa: F401
from .collectives.compression import Compression  # noqa: F401
from .collectives.ops import (  # noqa: F401
    Adasum,
    Average,
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
from .collectives.process_set_table import add_process_set, remove_process_set  # noqa: F401
from .collectives.process_sets import ProcessSet, global_process_set  # noqa: F401
from .collectives.reducescatter import (  # noqa: F401
    grouped_reducescatter,
    grouped_reducescatter_async,
    reducescatter,
    reducescatter_async,
)
from .collectives.sparse import sparse_allreduce_async  # noqa: F401
from .exceptions import HorovodInternalError  # noqa: F401
from .runtime import (  # noqa: F401
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
from .timeline import start_timeline, stop_timeline  # noqa: F401
