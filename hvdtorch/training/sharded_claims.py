"""Which parameters a live sharded optimizer steps, so that no other gradient
front takes them over (one optimizer per parameter, on the sharded side).

Contract:
  * A sharded optimizer claims each parameter it steps when it is built
    (claim_for_sharding, zero/optimizer.py); the claim is held weakly, so
    it ends with the optimizer, and one that only a reference cycle keeps
    is collected first and does not count (sharded_stepper).
  * refuse_if_sharded refuses a DistributedOptimizer over a parameter a live
    sharded optimizer steps (training/optimizer.py), naming it and the fix;
    DistributedModel asks sharded_stepper for its own refusal
    (training/distributed_model.py).
"""

import gc
import weakref
from typing import Callable, Sequence

import torch

# id(parameter) -> the live sharded optimizer that steps it, so that a
# DistributedModel made after it refuses the parameter (claim_for_sharding).
_sharded_by_param = weakref.WeakValueDictionary()


def claim_for_sharding(param: torch.Tensor, optimizer) -> None:
    """A sharded optimizer steps ``param`` from now on (zero/optimizer.py)."""
    _sharded_by_param[id(param)] = optimizer


def sharded_stepper(param: torch.Tensor):
    """The live sharded optimizer that steps ``param``, if any. One that only
    a reference cycle keeps (dropped by the user, not yet collected) is
    collected first and does not count."""
    if id(param) not in _sharded_by_param:
        return None
    gc.collect()
    return _sharded_by_param.get(id(param))


def refuse_if_sharded(params: Sequence[torch.Tensor], name_of: Callable[[torch.Tensor], str], front: str) -> None:
    """A sharded optimizer's parameters are views of its buckets, and it
    reduces their gradients itself: no other gradient front can take them
    over from it, and beside it one would reduce every gradient a second
    time (silently doubled with op=hvd.Sum). Refused, naming the fix and the
    parameter (``name_of``, asked only for the refused one)."""
    for p in params:
        opt = sharded_stepper(p)
        if opt is not None:
            name = name_of(p)
            raise ValueError(
                f"hvdtorch: {front}: parameter '{name}' is stepped by a sharded optimizer "
                f"(hvd.DistributedOptimizer(..., shard={getattr(opt, '_stage', '?')})) that is still alive; one "
                "optimizer reduces each parameter's gradient. Drop the old one first (del opt, and whatever else "
                "holds it, such as a learning-rate scheduler), or keep one"
            )
