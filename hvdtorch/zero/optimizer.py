"""ShardedOptimizer: ZeRO stages 1, 2 and 3 (Rajbhandari et al., SC'20) on
hvdtorch's engine. Each rank keeps optimizer state for its shard of the
parameters only, steps that shard, and all-gathers the updated parameters.

    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters()),
                                   named_parameters=model.named_parameters(), shard=2)
    loss.backward()   # buckets are reduced while backward runs
    opt.step()        # this rank's shard steps; parameters are all-gathered

This file holds ShardedOptimizer's construction (__init__, which checks the
options and builds the rest in order), step() and the sizes. Its other jobs
are mixins or helpers, each in a file of its own:
  optimizer_options.py       the optimizers it can shard, and the arguments and gradient options it takes
  flat_parameters.py         the parameters as views of flat buckets, this rank's shards, the inner optimizer
  optimizer_gradients.py     the gradients it steps on: synchronize(), the shards' .grad, clip_grad_norm_, zero_grad
  gathers_after_step.py      shard=1/2: the stepped shards gathered into every rank's parameters, and the waits
  join_phases.py             what it announces to the ranks that joined, and runs on a rank that has (hvd.join())
  optimizer_state_dicts.py   state_dict(), consolidate_state_dict(), load_state_dict() (zero/checkpoint.py)
KEEP_GATHERED_BELOW, ELEMENTWISE, REFUSED and check_shardable are importable
from here too, and so are _WaitForGathers and _ReadAfterGathers, the hooks
of overlap_gathers=True, by which a pickled module may name them.

How:
  * The wrapper is a torch Optimizer: param_groups are the wrapped
    optimizer's group dicts themselves (model parameters and
    hyper-parameters; a learning-rate scheduler built on either optimizer,
    before or after the wrap, works on them), copied into the inner groups
    at every step.
  * shard=3 (ZeRO-3): the shards are tensors of their own and the flat
    buckets exist only while gathered; step() gathers nothing: the model's
    forward gathers each unit's buckets, backward again, and both free them
    (zero/parameter_units.py). It needs the DistributedModel (model=, or the
    one over the parameters), whose forward and state dicts go through it.
  * Uneven data and hvd.join(): join_phases.py. Checkpoints:
    zero/checkpoint.py.
"""

import itertools
import weakref
from typing import Dict, List, Optional

import torch

from .. import runtime
from ..collectives import ops
from ..collectives.compression import Compression
from ..collectives.process_sets import set_id
from ..training.distributed_model import built_on_meta, claim_for_sharding, refuse_meta_parameters
from ..training.gradient_sync import take_over
from ..training.parameter_names import names_by_id

# Imported under these names so the code reads which module each call goes to.
from . import host_heap
from . import join as shard_join
from .flat_parameters import _FlatParameters
from .gathers_after_step import _GathersAfterStep
from .gathers_after_step import _ReadAfterGathers as _ReadAfterGathers
from .gathers_after_step import _WaitForGathers as _WaitForGathers
from .join_phases import _JoinPhases, _pass_announcer
from .layout import plan
from .optimizer_gradients import _Gradients
from .optimizer_options import ELEMENTWISE as ELEMENTWISE
from .optimizer_options import KEEP_GATHERED_BELOW, _check_arguments, _gradient_options, _module_for_names
from .optimizer_options import REFUSED as REFUSED
from .optimizer_options import check_shardable as check_shardable
from .optimizer_state_dicts import _OptimizerStateDicts
from .parameter_units import ParameterUnits
from .unit_plan import plan_units

_instance_ids = itertools.count()


class ShardedOptimizer(
    _FlatParameters, _Gradients, _GathersAfterStep, _JoinPhases, _OptimizerStateDicts, torch.optim.Optimizer
):
    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters=None,
        shard: int = 2,
        compression=Compression.none,
        backward_passes_per_step: int = 1,
        op: int = ops.Average,
        gradient_predivide_factor: float = 1.0,
        process_set=None,
        fusion_bytes: int = 25 << 20,
        first_bucket_bytes: int = 1 << 20,
        model: Optional[torch.nn.Module] = None,
        overlap_gathers: bool = False,
        reshard_after_forward: bool = True,
        keep_gathered_below: int = KEEP_GATHERED_BELOW,
        share_gathered: bool = True,
        secondary_copy: bool = False,
        init_device=None,
        param_init_fn=None,
    ):
        _check_arguments(
            optimizer,
            shard,
            op,
            gradient_predivide_factor,
            reshard_after_forward,
            keep_gathered_below,
            share_gathered,
            secondary_copy,
        )
        named_parameters = None if named_parameters is None else list(named_parameters)
        names = names_by_id(optimizer.param_groups, named_parameters, _module_for_names(optimizer.param_groups, model))
        numbered, all_params = [], []
        for group in optimizer.param_groups:
            row = []
            for p in group["params"]:
                if p.requires_grad:
                    row.append((len(all_params), p))
                all_params.append(p)
            numbered.append(row)
        self._all_params = all_params  # torch's state_dict numbering
        self._names = [names[id(p)] for p in all_params]
        dm, module, gradients = _gradient_options(
            all_params,
            model,
            shard,
            overlap_gathers,
            dict(
                compression=compression,
                op=op,
                gradient_predivide_factor=gradient_predivide_factor,
                backward_passes_per_step=backward_passes_per_step,
                process_set=process_set,
            ),
        )

        # A model built on the meta device: shard=3 makes the shards module by module (zero/meta_init.py).
        from_meta = shard == 3 and built_on_meta(module)
        if not from_meta:
            refuse_meta_parameters(all_params, f"shard={shard}")
        if not from_meta and (init_device is not None or param_init_fn is not None):
            raise ValueError(
                "hvdtorch: init_device and param_init_fn apply to shard=3 over a model built on the meta device "
                "(its parameters are made there); this model's parameters have values already"
            )
        self._from_meta = (
            (module, torch.device(init_device or "cpu"), param_init_fn, dm.init_sync) if from_meta else None
        )

        ps = gradients["process_set"] or ops.global_process_set
        set_id(ps)  # a set this rank is in (DistributedOptimizer hands others the plain optimizer)
        self._process_set = ps
        self._size, self._rank = ps.size(), ps.rank()
        self._no_gradients = False  # the last synchronize() found no gradient on any rank
        self._stage = shard
        # A joined rank takes part in every collective of the optimizer (zero/join.py).
        self._name = f"{shard_join.NO_STAND_IN_PREFIX}sharded{next(_instance_ids)}"
        first = min(int(first_bucket_bytes), int(fusion_bytes)) if fusion_bytes > 0 else 0
        units = None
        if shard == 3:
            # A unit is the largest module whose parameters fit one bucket (zero/unit_plan.py).
            units = plan_units(module, [p if p.requires_grad else None for p in all_params], int(fusion_bytes))
        self._buckets = plan(numbered, int(fusion_bytes), first, None if units is None else units.of_param)
        if not self._buckets:
            raise ValueError("hvdtorch: the optimizer has no parameter that requires grad: nothing to shard")
        # A DistributedOptimizer made earlier over these parameters lets them go (one optimizer per parameter).
        take_over(all_params, self._names, None)
        self._flatten_parameters()
        # Whether the buckets are reduced and gathered in place (shard=1/2): every rank on one host with
        # registered memory.
        self._gather_in_place = self._size > 1 and self._agree_layout_and_gather()
        self.optim = self._inner_optimizer(optimizer)
        # The wrapped optimizer's own group dicts, not copies: a learning-rate
        # scheduler built on it before the wrap drives this optimizer too.
        self._adding_groups = True
        super().__init__(optimizer.param_groups, dict(optimizer.defaults))
        self._adding_groups = False
        for p in all_params:
            claim_for_sharding(p, self)
        self._connect_gradients(dm, gradients)
        self._units = None  # shard=3: the parameters' gather and free (zero/parameter_units.py)
        if shard == 3:
            self._units = ParameterUnits(
                self._name,
                module,
                self._buckets,
                self._all_params,
                self._names,
                self._shards,
                units,
                ps,
                reshard_after_forward,
                keep_gathered_below,
                share_gathered,
                secondary_copy,
                _pass_announcer(weakref.ref(self)),
                gather_dtype=dm.mixed_precision.param_dtype if dm.mixed_precision is not None else None,
            )
            dm.hold_parameters_sharded(self._units)
        self._gathers: Dict[int, int] = {}  # bucket -> handle of its all-gather in flight
        # Gradients reduced since the last step() (_reduced_now: and no backward pass since).
        self._synchronized = False
        self._reduced: List[Optional[torch.Tensor]] = [None] * len(self._buckets)  # shard=1: the last reduced
        self._should_synchronize = True
        self._consolidated = None  # the last consolidate_state_dict()'s state here, until the next step()
        # Whether step() returns before the parameters are gathered (the opt-in; gathers_after_step.py).
        self._overlap = bool(overlap_gathers) and self._size > 1
        if self._overlap:
            self._hook(module, [module] if dm is None else [dm, module])
        self._announcer = None
        self._joined = False  # inside join(): running the phases the others announce
        self._joined_fold = None  # shard=3 inside join(): whether the announced phase reduces (zero/join.py)
        if self._size > 1:
            what = f"the shard={shard} optimizer" + (f" of DistributedModel '{dm._name}'" if dm is not None else "")
            self._announcer = shard_join.Announcer(self._name, self.param_groups, ps, what=what)
            runtime.take_part_while_joined(self)
        if optimizer.state:
            self.load_state_dict(optimizer.state_dict())

    def add_param_group(self, param_group) -> None:
        if not getattr(self, "_adding_groups", False):
            raise ValueError("hvdtorch: a sharded optimizer's parameter groups are fixed: build it with all of them")
        super().add_param_group(param_group)

    # ---- the step --------------------------------------------------------------

    def step(self, closure=None):
        self.wait_parameters()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._announce(
            shard_join.STEP, folds=self._should_synchronize and not self._reduced_now() and self._grads.will_fold()
        )
        if self._should_synchronize and not self._reduced_now():
            self._synchronize()
        if self._stage == 1:
            self._shard_gradients_from_grad(self._reduced)
        replaced = self._grads.replaced_held()
        if replaced:
            raise RuntimeError(
                f"hvdtorch: rank {runtime.rank()}: the .grad of {replaced[:5]} was replaced after backward (set to "
                f"None, or to a tensor of its own): with shard={self._stage} a parameter's .grad holds no gradient "
                "(each rank keeps its shard of the average), so the change cannot reach the step, where one "
                "process would use it. Scale with optimizer.clip_grad_norm_(), freeze the parameter "
                "(requires_grad_(False)) before the optimizer is built, or use shard=1 where code changes .grad"
            )
        self._grads.remove_held()  # shard=2's stand-ins end with the pass they stood for
        for outer, inner in zip(self.param_groups, self.optim.param_groups):
            inner.update({k: v for k, v in outer.items() if k not in ("params", "param_names")})
        if self._shards and self._shards[0].device.type == "cpu":
            # The step's temporaries are mapped, not kept on the heap under the next forward and
            # backward (zero/host_heap.py says why).
            host_heap.fix_mmap_threshold()
        if not self._no_gradients:
            self.optim.step()
        self._synchronized = False
        self._consolidated = None  # the state moved on
        self._gather()
        return loss

    # ---- sizes -----------------------------------------------------------------

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (tensors of the inner optimizer's state)."""
        return sum(
            v.numel() * v.element_size()
            for state in self.optim.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor)
        )

    def bucket_bytes(self) -> List[int]:
        return [b.numel * torch.empty((), dtype=b.dtype).element_size() for b in self._buckets]
