"""A Lightning strategy: Lightning's Trainer, hvdtorch's all-reduce.

    import hvdtorch.integrations.lightning  # registers the strategy name "hvdtorch"
    trainer = lightning.Trainer(strategy="hvdtorch", accelerator="cpu", max_epochs=3)
    trainer.fit(model, train_loader, val_loader)

    torchrun --nproc_per_node=4 train.py      # or: mpirun -np 4 python train.py; plain python: 1 process

Launching is the launcher's job, as for any hvdtorch script: every process
runs the script and the Trainer, with one device each (``devices`` left at
its default). ``HvdtorchStrategy(**options)`` passes its options to
``hvd.DistributedModel`` (reducer, fusion_bytes, pipeline, compression, ...).

What it does:

* joins the job with ``hvd.init()`` (adopting a default process group that
  already exists) and sets Lightning's ranks from hvdtorch;
* broadcasts rank 0's parameters and optimizer state when fitting starts;
* automatic optimisation: wraps the LightningModule in ``DistributedModel``
  (gradients averaged during backward; gradient accumulation with
  ``accumulate_grad_batches`` skips the exchange on the passes in between);
  manual optimisation: wraps each optimizer in ``DistributedOptimizer``, so
  ``opt.step()`` applies averaged gradients;
* gives Lightning a ``DistributedSampler`` per rank (``distributed_sampler_kwargs``);
* reduces logged metrics (``self.log(..., sync_dist=True)``), ``all_gather``,
  ``broadcast`` and ``barrier`` with hvdtorch collectives.

Devices: with ``accelerator="cpu"`` every process trains on the CPU. With a
GPU accelerator each process takes one GPU, Horovod's rule: the local rank's
of the devices Lightning lists when it lists one per local process
(``devices="auto"`` on a host with as many GPUs as processes, or
``devices=N``), else GPU ``local_rank % visible GPUs`` (``devices=1``;
processes share GPUs when there are fewer than processes). The GPU placement
has not yet run on a GPU.
Needs the optional dependency ``lightning`` (``pip install hvdtorch[lightning]``).
"""

import contextlib
import os
from typing import Any, Dict, Optional, Union

import torch
import torch.distributed as dist

try:
    from lightning.fabric.plugins import ClusterEnvironment
    from lightning.pytorch.strategies import ParallelStrategy, StrategyRegistry
    from lightning.pytorch.trainer.states import TrainerFn
    from lightning.pytorch.utilities.rank_zero import rank_zero_only
except ImportError as error:
    raise ImportError(
        f"hvdtorch.integrations.lightning needs Lightning 2.6 ({error}): pip install --no-deps -r "
        "requirements-lightning.txt (lightning==2.6.6 and its pinned pure-Python dependencies)"
    ) from error

import hvdtorch as hvd

from .. import launch

_OPS = {
    "mean": hvd.Average,
    "avg": hvd.Average,
    "average": hvd.Average,
    "sum": hvd.Sum,
    "max": hvd.Max,
    "min": hvd.Min,
    "product": hvd.Product,
    "prod": hvd.Product,
}


def _reduce_op(reduce_op) -> int:
    """Lightning passes "mean"/"sum"/... or a torch.distributed ReduceOp."""
    if reduce_op is None:
        return hvd.Sum
    name = str(reduce_op).lower().rsplit(".", 1)[-1]
    if name not in _OPS:
        raise ValueError(f"hvdtorch strategy: unsupported reduce_op {reduce_op!r} (mean, sum, max, min, product)")
    return _OPS[name]


class HvdtorchEnvironment(ClusterEnvironment):
    """Ranks as hvdtorch sees them once initialized; before that, as the launcher says."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "0") or 0)

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return hvd.size() if hvd.is_initialized() else launch.detect().size

    def set_world_size(self, size: int) -> None:
        pass  # fixed by the launcher

    def global_rank(self) -> int:
        return hvd.rank() if hvd.is_initialized() else launch.detect().rank

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        if hvd.is_initialized():
            return hvd.local_rank()
        return launch.detect().local_rank or 0

    def node_rank(self) -> int:
        return hvd.cross_rank() if hvd.is_initialized() else 0


class HvdtorchStrategy(ParallelStrategy):
    strategy_name = "hvdtorch"

    def __init__(self, accelerator=None, checkpoint_io=None, precision_plugin=None, **model_options: Any):
        super().__init__(
            accelerator=accelerator,
            parallel_devices=None,
            cluster_environment=HvdtorchEnvironment(),
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self._model_options = model_options

    # Lightning asks this to decide whether to insert a DistributedSampler.
    @property
    def is_distributed(self) -> bool:
        return True

    @property
    def root_device(self) -> torch.device:
        local_size = hvd.local_size() if hvd.is_initialized() else (launch.detect().local_size or 1)
        return device_of_process(self.parallel_devices, self.local_rank, local_size)

    @property
    def distributed_sampler_kwargs(self) -> Dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def setup_environment(self) -> None:
        hvd.init()
        rank_zero_only.rank = hvd.rank()
        super().setup_environment()

    def setup(self, trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        module = self.lightning_module
        if trainer.state.fn == TrainerFn.FITTING:
            hvd.broadcast_parameters(module.state_dict(), root_rank=0)
            self.setup_optimizers(trainer)
            if module.automatic_optimization:
                self.model = hvd.DistributedModel(module, **self._model_options)
            else:
                # Manual optimisation steps the optimizers itself: they average the gradients.
                # The wrapped optimizers share the originals' param_groups, so LR schedulers still act on them.
                self.optimizers = [
                    hvd.DistributedOptimizer(opt, named_parameters=_named_in(module, opt)) for opt in self.optimizers
                ]
            for opt in self.optimizers:
                hvd.broadcast_optimizer_state(opt, root_rank=0)
        self.setup_precision_plugin()

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    @contextlib.contextmanager
    def block_backward_sync(self):
        """Backward passes inside keep their gradients local (gradient accumulation)."""
        if isinstance(self.model, hvd.DistributedModel):
            with self.model.no_sync():
                yield
        else:
            yield

    def reduce(self, tensor, group: Optional[Any] = None, reduce_op: Optional[Union[str, Any]] = "mean"):
        if not isinstance(tensor, torch.Tensor):
            return tensor
        _check_group(group, "reduce")
        op = _reduce_op(reduce_op)
        if op == hvd.Average and not (tensor.is_floating_point() or tensor.is_complex()):
            tensor = tensor.double()
        return hvd.allreduce(tensor.detach() if tensor.requires_grad else tensor, op=op)

    def all_gather(self, tensor: torch.Tensor, group: Optional[Any] = None, sync_grads: bool = False):
        _check_group(group, "all_gather")
        # hvd.allgather concatenates on dim 0 (and is differentiable); Lightning wants one row per rank.
        return hvd.allgather((tensor if sync_grads else tensor.detach()).unsqueeze(0))

    def barrier(self, name: Optional[str] = None) -> None:
        if hvd.is_initialized() and hvd.size() > 1:
            hvd.barrier()

    def broadcast(self, obj, src: int = 0):
        if not hvd.is_initialized() or hvd.size() == 1:
            return obj
        return hvd.broadcast_object(obj, root_rank=src)

    def teardown(self) -> None:
        if isinstance(self.model, hvd.DistributedModel):
            self.model = self.lightning_module
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="data parallel with hvdtorch (launch with torchrun or mpirun)"
        )


def device_of_process(parallel_devices, local_rank: int, local_size: int) -> torch.device:
    """The device this process trains on (one process per device; the module's docstring says the rule)."""
    if not parallel_devices or parallel_devices[0].type == "cpu":
        if parallel_devices and len(parallel_devices) > 1:
            raise ValueError(
                f"hvdtorch strategy: one CPU device per process, got devices={len(parallel_devices)}; start one "
                "process per device with a launcher (torchrun --nproc_per_node=N, mpirun -np N) instead"
            )
        return torch.device("cpu")
    if len(parallel_devices) >= local_size:
        return parallel_devices[local_rank]
    if len(parallel_devices) == 1:
        kind = parallel_devices[0].type
        visible = torch.cuda.device_count() if kind == "cuda" else 1
        return torch.device(kind, local_rank % max(visible, 1))
    raise ValueError(
        f"hvdtorch strategy: devices={len(parallel_devices)} for {local_size} processes on this host; pass "
        f"devices=1 (each process takes the GPU of its local rank) or devices={local_size}"
    )


def _check_group(group, what: str) -> None:
    if group is not None and group is not dist.group.WORLD:
        raise ValueError(f"hvdtorch strategy: {what} runs over all ranks (group must be None or the world group)")


def _named_in(module: torch.nn.Module, optimizer: torch.optim.Optimizer):
    """The module's named parameters that this optimizer updates."""
    mine = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return [(n, p) for n, p in module.named_parameters() if id(p) in mine]


if HvdtorchStrategy.strategy_name not in StrategyRegistry:
    HvdtorchStrategy.register_strategies(StrategyRegistry)
