"""``horovod.torch.mpi_ops``'s public names, for scripts that import them from
there (``from horovod.torch.mpi_ops import synchronize`` becomes
``from hvdtorch.mpi_ops import synchronize``). The same objects as
``hvdtorch.<name>``; nothing is defined here: the collectives come from the
one list of their public names (collectives/api.py), the rest from runtime,
timeline and exceptions."""

from .collectives.api import *  # noqa: F401,F403  (the collectives' public names, as hvdtorch has them)
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
