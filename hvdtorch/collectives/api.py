"""The public names of the collectives, listed once: every name this module
imports is one. ``hvdtorch`` re-exports them all (``hvd.allreduce``, ...), and
so does ``hvdtorch.mpi_ops`` (``horovod.torch.mpi_ops``'s names), both by
``from .collectives.api import *``. A new collective's public names go here
and nowhere else; anything else this module ever needs is underscored."""

from .alltoall import alltoall, alltoall_async
from .broadcast import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .compression import Compression
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
from .process_set_table import add_process_set, remove_process_set
from .process_sets import ProcessSet, global_process_set
from .reduce import reduce, reduce_, reduce_async, reduce_async_
from .reducescatter import grouped_reducescatter, grouped_reducescatter_async, reducescatter, reducescatter_async
from .sparse import sparse_allreduce_async
