"""What a ShardedOptimizer may be built with: the optimizers whose state it
can shard, the arguments it refuses, and the gradient options, which a
DistributedModel over the parameters decides. ShardedOptimizer.__init__
checks them before it builds anything.

Contract:
  * Only optimizers whose update is element-wise can step a flat shard
    exactly as they would step the parameters (zero/state.py); others are
    refused with the reason (check_shardable).
  * shard is 1, 2 or 3; op is hvd.Average or hvd.Sum; shard=3's options
    (reshard_after_forward, keep_gathered_below, share_gathered,
    secondary_copy) given with shard=1/2 are refused, and so is
    Compression.powersgd (_check_arguments, _gradient_options).
  * A DistributedModel over the parameters (``model=``, or the one that
    owns them) decides compression, op, scale, passes and process set;
    given ones must agree with it. shard=3 needs that DistributedModel;
    overlap_gathers=True needs a module to hook and does not apply to
    shard=3 (_gradient_options).
  * A parameter without a given name takes its name in model=, or in the
    DistributedModel's module (_module_for_names).
"""

from typing import Optional

import torch

from ..collectives import ops
from ..collectives.compression import Compression
from ..collectives.powersgd import is_powersgd
from ..training.distributed_model import DistributedModel, owner_of

# shard=3's default: buckets smaller than this stay gathered between uses (zero/parameter_units.py).
KEEP_GATHERED_BELOW = 256 << 10
# Why the sharded optimizer refuses Compression.powersgd.
_POWERSGD_REFUSAL = (
    "hvdtorch: shard={shard} does not combine with Compression.powersgd: the sharded optimizer reduces each "
    "bucket into shards, and PowerSGD's factors approximate whole matrices; use shard=0, or "
    "Compression.none/fp16"
)


# torch.optim optimizers whose update of each element depends only on that
# element's gradient, state and the group's hyper-parameters.
ELEMENTWISE = tuple(
    getattr(torch.optim, n)
    for n in ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop", "Rprop", "ASGD")
    if hasattr(torch.optim, n)
)
REFUSED = {
    "LBFGS": "its state is not per parameter (one search history over all parameters, and step() re-evaluates "
    "the loss in a closure)",
    "SparseAdam": "it steps sparse gradients, and a shard is a dense flat tensor",
    "Adafactor": "it factors the second moment of each matrix by its rows and columns, which a flat shard does "
    "not have",
    "Muon": "it orthogonalizes each weight matrix as a whole, which a flat shard does not have",
}


def check_shardable(optimizer) -> None:
    cls = type(optimizer)
    if cls in ELEMENTWISE:
        return
    reason = REFUSED.get(cls.__name__) or (
        "hvdtorch shards only optimizers known to update each element on its own (torch.optim's "
        f"{', '.join(c.__name__ for c in ELEMENTWISE)}): a flat shard spans several parameters and parts "
        "of them, so an update that looks at a parameter's shape or norm would change"
    )
    raise ValueError(f"hvdtorch: cannot shard the state of {cls.__name__}: {reason}")


def _module_for_names(param_groups, model) -> Optional[torch.nn.Module]:
    """The module whose names a parameter without a given name takes: model=, or the DistributedModel's."""
    if isinstance(model, DistributedModel):
        return model.module
    if isinstance(model, torch.nn.Module):
        return model
    owners = {id(o): o for o in (owner_of(p) for g in param_groups for p in g["params"]) if o is not None}
    return next(iter(owners.values())).module if len(owners) == 1 else None


def _check_same(what: str, given, default, model_value) -> None:
    if given != default and given != model_value:
        raise ValueError(
            f"hvdtorch: {what}={given!r} was given to the sharded optimizer, but its parameters belong to a "
            f"DistributedModel with {what}={model_value!r}; on that path the model's options apply: set it there"
        )


def _check_arguments(
    optimizer,
    shard: int,
    op: int,
    gradient_predivide_factor: float,
    reshard_after_forward: bool,
    keep_gathered_below: int,
    share_gathered: bool,
    secondary_copy: bool,
) -> None:
    if shard not in (1, 2, 3):
        raise ValueError(
            f"hvdtorch: shard must be 1 (optimizer state), 2 (state and gradients) or 3 (state, gradients and "
            f"parameters), got {shard!r}"
        )
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"hvdtorch: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    check_shardable(optimizer)
    shard3_options = (not reshard_after_forward, keep_gathered_below != KEEP_GATHERED_BELOW, not share_gathered)
    if shard != 3 and (any(shard3_options) or secondary_copy):
        raise ValueError(
            "hvdtorch: reshard_after_forward, keep_gathered_below, share_gathered and secondary_copy apply to "
            f"shard=3 only (shard={shard} keeps whole parameters)"
        )
    if op not in (ops.Average, ops.Sum):
        raise ValueError("hvdtorch: a sharded optimizer reduces gradients with op=hvd.Average or hvd.Sum")
    if gradient_predivide_factor <= 0:
        raise ValueError("hvdtorch: gradient_predivide_factor must be positive")
    if gradient_predivide_factor != 1.0 and op != ops.Average:
        raise ValueError("hvdtorch: gradient_predivide_factor needs op=hvd.Average")


def _gradient_options(all_params, model, shard: int, overlap_gathers: bool, given: dict):
    """(the DistributedModel, the module, the gradient options): a
    DistributedModel over the parameters (``model=``, or the one that owns
    them) decides compression, op, scale, passes and process set; given ones
    must agree with it."""
    dm = model if isinstance(model, DistributedModel) else None
    if dm is None:
        owners = {id(o): o for o in (owner_of(p) for p in all_params) if o is not None}
        if len(owners) > 1:
            raise ValueError("hvdtorch: the optimizer's parameters belong to several DistributedModels")
        dm = next(iter(owners.values()), None)
    if is_powersgd(given["compression"]) or (dm is not None and is_powersgd(dm.gradient_options["compression"])):
        raise ValueError(_POWERSGD_REFUSAL.format(shard=shard))
    options = dict(given)
    if dm is not None:
        g = dm.gradient_options
        _check_same("compression", given["compression"], Compression.none, g["compression"])
        _check_same("op", given["op"], ops.Average, g["op"])
        _check_same("gradient_predivide_factor", given["gradient_predivide_factor"], 1.0, g["postscale"])
        _check_same("backward_passes_per_step", given["backward_passes_per_step"], 1, g["backward_passes_per_step"])
        if given["process_set"] is not None and given["process_set"] is not g["process_set"]:
            raise ValueError("hvdtorch: process_set differs from the DistributedModel's; set it there")
        options = dict(
            compression=g["compression"],
            op=g["op"],
            gradient_predivide_factor=g["postscale"],
            backward_passes_per_step=g["backward_passes_per_step"],
            process_set=g["process_set"],
            codec=g.get("codec"),
        )
    module = dm.module if dm is not None else model
    if shard == 3 and dm is None:
        raise ValueError(
            "hvdtorch: shard=3 gathers each layer's parameters around its forward, which the DistributedModel "
            "runs: wrap the model (model = hvd.DistributedModel(net)), build the optimizer over its parameters "
            "and pass model=model"
        )
    if shard == 3 and overlap_gathers:
        raise ValueError(
            "hvdtorch: overlap_gathers=True does not apply to shard=3: its step() gathers nothing (each layer's "
            "forward gathers its parameters, prefetching the next)"
        )
    if overlap_gathers and module is None:
        raise ValueError(
            "hvdtorch: overlap_gathers=True needs the module whose forward waits for its parameters: pass "
            "model=, or shard the optimizer of a DistributedModel"
        )
    return dm, module, options
