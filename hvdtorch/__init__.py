"""hvdtorch: Horovod-style data-parallel training for PyTorch.

    import hvdtorch as hvd
    hvd.init()
    model = hvd.DistributedModel(model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

A script written for ``horovod.torch`` runs with ``import hvdtorch as hvd``.

The package by layer, bottom-up (tools/import_graph.py holds the rule):
  launch, exceptions, runtime   the launcher's environment, the errors, the process's engine
  collectives/                  the ops (all-reduce ... alltoall), their handles, process sets
  timeline/                     the engine's timeline; ``python -m hvdtorch.timeline``
  autotune                      HVDTORCH_AUTOTUNE: the wrappers' fusion size, the engine's cycle
  training/                     DistributedModel, DistributedOptimizer, SyncBatchNorm
  zero/                         ShardedOptimizer: optimizer state and gradients sharded (ZeRO-1/2)
  elastic/                      hvd.elastic: Horovod's elastic training on torchrun's agent
  integrations/                 the Lightning strategy
  mpi_ops, functions            horovod.torch's module names, re-exported
  check                         ``python -m hvdtorch.check``
The public names are re-exported here (``hvd.allreduce``, ``hvd.DistributedModel``,
...). Horovod's module names ``hvdtorch.compression``, ``.optimizer`` and
``.sync_batch_norm``, and ``hvdtorch.lightning``, are aliases of the modules that
hold them (_aliases.py).
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
from . import knob_names as _knob_names
from ._aliases import attribute as _alias_attribute
from ._aliases import install as _install_aliases
from .collectives.api import *  # noqa: F403  (the collectives' public names, listed there)
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt, InvalidArgumentError
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
from .timeline import start_timeline, stop_timeline
from .training import compile_marks as _compile_marks
from .training.distributed_model import DistributedModel
from .training.mixed_precision import MixedPrecisionPolicy
from .training.optimizer import DistributedOptimizer
from .training.sync_batch_norm import SyncBatchNorm
from .zero.optimizer import ShardedOptimizer

__version__ = "0.1.0"

_install_aliases()
_compile_marks.install()  # torch.compiler.disable on hvdtorch's frames once torch._dynamo loads (not at import)


def __getattr__(name):
    """``hvd.optimizer``, ``hvd.compression``, ...: the aliased modules (_aliases.py)."""
    module = _alias_attribute(name)
    if module is None:
        raise AttributeError(f"module 'hvdtorch' has no attribute '{name}'")
    return module


def knobs():
    """Every HVDTORCH_* environment variable as (name, default, meaning)."""
    return _knob_names.knobs()
