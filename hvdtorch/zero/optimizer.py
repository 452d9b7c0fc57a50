"""ShardedOptimizer: ZeRO stages 1, 2 and 3 (Rajbhandari et al., SC'20) on
hvdtorch's engine. Each rank keeps optimizer state for its shard of the
parameters only, steps that shard, and all-gathers the updated parameters.

    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters()),
                                   named_parameters=model.named_parameters(), shard=2)
    loss.backward()   # buckets are reduced while backward runs
    opt.step()        # this rank's shard steps; parameters are all-gathered

How:
  * The trainable parameters are laid out in flat buckets (zero/layout.py);
    every parameter becomes a view of its bucket, and rank r's shard of a
    bucket is one contiguous range of it. The wrapped optimizer is rebuilt
    (same class, same hyper-parameters, group by group) over the shards:
    one flat tensor per bucket, so its state exists for the shard only.
  * Gradients (zero/gradients.py, a front over the gradient core's C++
    reducer and its shard strategies): shard=2 reduces each bucket while
    backward runs so that each rank steps on its shard's average only, and
    .grad is freed; shard=1 all-reduces each bucket (every rank holds the
    whole average in .grad, as unsharded training) and the step takes the
    shard's part. Each bucket's gradients live in one persistent flat
    buffer, and the shard's gradient is a view of its range: on one host
    with registered memory both stages reduce that buffer in place, by the
    node reducer (no copy, nothing allocated per step); elsewhere shard=2
    reduce-scatters it, and the engine allocates the shard it returns. On
    a DistributedModel's parameters, the optimizer takes the reduction over
    from the model (DistributedModel.hand_gradients_to), so that every
    gradient it steps on comes through its own collectives.
  * step() then steps the shards and starts one all-gather per bucket into
    the flat buckets, the bucket forward needs first first, and waits for
    them: when step() returns, every parameter holds its new value, so an
    EMA, a norm for the log or a checkpoint reads what one process would.
    overlap_gathers=True (with a module to hook: model=, or the
    DistributedModel) lets step() return at once instead, and each
    submodule's forward waits for the buckets of its own parameters; the
    module's (and the DistributedModel's) state_dict(), load_state_dict(),
    parameters() and named_parameters() wait for every bucket, and so do
    what reads through them (AveragedModel.update_parameters, checkpoints,
    hvd.broadcast_parameters, elastic state), the next step() and
    wait_parameters(). The hazard of that opt-in: a parameter read through
    a reference kept from before (a tensor held by the caller, the
    optimizer's param_groups, a weight shared with another module) may be
    half gathered; call wait_parameters() first.
  * The wrapper is a torch Optimizer: param_groups are the wrapped
    optimizer's group dicts themselves (model parameters and
    hyper-parameters; a learning-rate scheduler built on either optimizer,
    before or after the wrap, works on them), copied into the inner groups
    at every step.
  * Only optimizers whose update is element-wise can step a flat shard
    exactly as they would step the parameters (zero/state.py); others are
    refused with the reason (check_shardable).
  * shard=3 (ZeRO-3): the shards are tensors of their own and the flat
    buckets exist only while gathered; step() gathers nothing: the model's
    forward gathers each unit's buckets, backward again, and both free them
    (zero/parameter_units.py). It needs the DistributedModel (model=, or the
    one over the parameters), whose forward and state dicts go through it.
  * Uneven data, hvd.join(): a joined rank goes on stepping its shard with
    the others, on zero gradients of its own (zero/join.py); with shard=3 it
    also replays its last pass's gathers at each forward the others
    announce.
  * Checkpoints: zero/checkpoint.py.
"""

import contextlib
import inspect
import itertools
import math
import weakref
from typing import Dict, List, Optional

import torch

from .. import runtime
from ..collectives import ops
from ..collectives.broadcast import allgather_object, broadcast_object
from ..collectives.compression import Compression
from ..collectives.powersgd import is_powersgd
from ..collectives.process_sets import set_id
from ..training.distributed_model import (
    DistributedModel,
    built_on_meta,
    claim_for_sharding,
    owner_of,
    refuse_meta_parameters,
)
from ..training.gradient_sync import remove_hooks, take_over
from ..training.parameter_names import names_by_id
from ..training.pending_gradients import weak_method

# Imported under these names so the code reads which module each call goes to.
from . import checkpoint as sharded_checkpoint
from . import host_heap
from . import join as shard_join
from .gradients import BucketGradients
from .layout import plan, signature
from .meta_init import build_shards
from .parameter_units import ParameterUnits
from .unit_plan import plan_units

_instance_ids = itertools.count()
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


def _wait(opt_ref, buckets) -> None:
    opt = opt_ref()
    if opt is None:
        return
    if buckets is None:
        opt.wait_parameters()
    else:
        opt._wait(buckets)


class _WaitForGathers:
    """A module hook (forward, state_dict and load_state_dict pre-hooks) that
    waits for the all-gathers of some buckets (None: of all). A copy or a
    pickle of the module gets one that waits for nothing."""

    def __init__(self, opt_ref=None, buckets=None):
        self._opt_ref, self._buckets = opt_ref, buckets

    def __call__(self, *_) -> None:
        if self._opt_ref is not None:
            _wait(self._opt_ref, self._buckets)

    def __reduce__(self):
        return (_WaitForGathers, ())


class _ReadAfterGathers:
    """Stands in, as an instance attribute, for parameters() or
    named_parameters() of a module whose parameters a sharded optimizer
    gathers behind step() (overlap_gathers=True): waits for the gathers,
    then calls the class's method. A copy or a pickle of the module (an
    AveragedModel deep-copies it) gets a plain forwarder bound to the copy,
    which waits for nothing: the copy's parameters are its own."""

    def __init__(self, module: torch.nn.Module, method: str, opt_ref=None):
        self._module, self._method, self._opt_ref = module, method, opt_ref

    def __call__(self, *args, **kwargs):
        if self._opt_ref is not None:
            _wait(self._opt_ref, None)
        return getattr(type(self._module), self._method)(self._module, *args, **kwargs)

    def __reduce__(self):
        return (_ReadAfterGathers, (self._module, self._method))

    def remove(self) -> None:
        if self._module.__dict__.get(self._method) is self:
            del self._module.__dict__[self._method]


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


def _pass_announcer(optimizer_ref):
    """shard=3's start of each forward (ShardedOptimizer._pass_begins),
    holding the optimizer weakly (the model holds the parameter units)."""

    def announce(grad_enabled: bool, pinned: bool) -> None:
        optimizer = optimizer_ref()
        if optimizer is not None:
            optimizer._pass_begins(grad_enabled, pinned)

    return announce


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


class ShardedOptimizer(torch.optim.Optimizer):
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
        # Whether step() returns before the parameters are gathered (the opt-in; see the top).
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

    # ---- construction phases ----------------------------------------------------

    def _flatten_parameters(self) -> None:
        """Parameters become views of flat buckets (in registered memory where
        the engine has it, see _gather); this rank's shards are views too.
        shard=3: the shards are tensors of their own, and the flat buckets
        exist only while gathered (zero/parameter_units.py)."""
        engine = runtime.state().engine
        self._flats: List[Optional[torch.Tensor]] = []
        self._shards: List[torch.Tensor] = []
        if self._from_meta is not None:
            module, device, init_fn, broadcast = self._from_meta
            self._from_meta = None
            self._flats = [None] * len(self._buckets)
            self._shards = build_shards(
                module, self._all_params, self._buckets, self._process_set, self._name, device, init_fn, broadcast
            )
            return
        with torch.no_grad():
            for b in self._buckets:
                device = self._all_params[b.params[0]].device
                if self._stage == 3:
                    flat = torch.empty(b.numel, dtype=b.dtype, device=device)
                    for i, offset in zip(b.params, b.offsets):
                        p = self._all_params[i]
                        flat[offset : offset + p.numel()].copy_(p.detach().reshape(-1))
                    start, end = b.shard_range(self._rank, self._size)
                    self._flats.append(None)
                    self._shards.append(flat[start:end].clone())
                    continue
                if device.type == "cpu" and self._size > 1:
                    flat = engine.registered_zeros(b.numel, b.dtype)
                else:
                    flat = torch.zeros(b.numel, dtype=b.dtype, device=device)
                for i, offset in zip(b.params, b.offsets):
                    p = self._all_params[i]
                    flat[offset : offset + p.numel()].copy_(p.detach().reshape(-1))
                    p.data = flat[offset : offset + p.numel()].view_as(p)
                start, end = b.shard_range(self._rank, self._size)
                self._flats.append(flat)
                self._shards.append(flat[start:end])

    def _inner_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The caller's class and hyper-parameters, over this rank's shards."""
        inner_groups, self._inner_index = [], {}
        for g, group in enumerate(optimizer.param_groups):
            hyper = {k: v for k, v in group.items() if k not in ("params", "param_names")}
            shards = []
            for j, b in enumerate(self._buckets):
                if b.group == g:
                    self._inner_index[j] = len(self._inner_index)
                    shards.append(self._shards[j])
            inner_groups.append(dict(hyper, params=shards))
        accepted = inspect.signature(type(optimizer).__init__).parameters
        return type(optimizer)(inner_groups, **{k: v for k, v in optimizer.defaults.items() if k in accepted})

    def _connect_gradients(self, dm, gradients) -> None:
        """The buckets' gradient reduction (zero/gradients.py), taking over a
        DistributedModel's where there is one; .grad views of the buckets."""
        f = float(gradients["gradient_predivide_factor"])
        self._grads = BucketGradients(
            self._all_params,
            self._names,
            self._buckets,
            self._name,
            self._stage >= 2,
            gradients["op"],
            1.0 / f,
            f,
            gradients["compression"],
            gradients["backward_passes_per_step"],
            self._process_set,
            codec=gradients.get("codec"),
            in_place=self._gather_in_place,
            settle=weak_method(self, "settle"),  # shard=1: a use of .grad after backward finishes the reduction
            # shard=3: the gradient buffers are released once reduced (sharded gradients).
            transient=self._stage == 3,
        )
        if dm is not None:
            dm.hand_gradients_to(self)
        if self._stage < 3:
            self._grads.view_gradients_from_the_start()

    # ---- construction helpers -------------------------------------------------

    def _agree_layout_and_gather(self) -> bool:
        """Checks that every rank has the same buckets; returns whether the
        parameters are gathered in place (every rank on one host, every flat in
        registered memory)."""
        mine = signature(self._buckets)
        # shard=3 has no flats to reduce or gather in place: its gradient buffers are released (reduce-scattered).
        registered = (
            self._stage < 3 and runtime.state().engine.registered_stats()[0] > 0 and self._flats[0].device.type == "cpu"
        )
        here = (mine, runtime.cross_rank(), registered)
        every = allgather_object(here, name=f"{self._name}.layout", process_set=self._process_set)
        differ = [self._process_set.ranks[k] for k, theirs in enumerate(every) if theirs[0] != mine]
        if differ:
            raise ValueError(
                f"hvdtorch: rank {self._process_set.ranks[self._rank]}: the sharded optimizer's parameters differ "
                f"on ranks {differ} (number, shapes, dtypes or parameter groups): every rank must build the same "
                "model and optimizer"
            )
        return len({host for _, host, _ in every}) == 1 and all(registered for _, _, registered in every)

    def _hook(self, module: torch.nn.Module, readers) -> None:
        """Forward pre-hooks that wait for the all-gathers of each module's own
        parameters; every read through ``readers`` (the module, and the
        DistributedModel around it) waits for all of them."""
        bucket_of = {i: j for j, b in enumerate(self._buckets) for i in b.params}
        index = {id(p): i for i, p in enumerate(self._all_params)}
        me = weakref.ref(self)  # the module's hooks must not keep the optimizer alive
        handles = []
        for m in module.modules():
            mine = sorted(
                {bucket_of[index[id(p)]] for p in m.parameters(recurse=False) if index.get(id(p)) in bucket_of}
            )
            if mine:
                handles.append(m.register_forward_pre_hook(_WaitForGathers(me, mine)))
        for m in readers:
            handles.append(m.register_state_dict_pre_hook(_WaitForGathers(me)))
            handles.append(m.register_load_state_dict_pre_hook(_WaitForGathers(me)))
            for method in ("parameters", "named_parameters"):
                read = _ReadAfterGathers(m, method, me)
                object.__setattr__(m, method, read)  # an instance attribute shadows the class's method
                handles.append(read)
        weakref.finalize(self, remove_hooks, handles)

    def add_param_group(self, param_group) -> None:
        if not getattr(self, "_adding_groups", False):
            raise ValueError("hvdtorch: a sharded optimizer's parameter groups are fixed: build it with all of them")
        super().add_param_group(param_group)

    # ---- parameters -------------------------------------------------------------

    def _gather(self) -> None:
        """Starts putting every rank's updated shard into every rank's buckets.

        In place (every rank on one host, flats in registered memory): each
        rank zeroes its flat outside its own range and the flats are summed
        by an all-reduce in place, which on one host is the engine's zero-copy
        path (each rank reads its peers' registered buffers; never fused, so
        no bucket is copied into the engine's fusion buffer): exact, since
        only one rank adds anything but zero to an element, and several times
        faster here than the all-gather, which copies through the links into
        an output it allocates each time. A rank that has joined takes part
        with its own shard too (the names keep the engine from standing in
        for it with zeros, zero/join.py). Otherwise: an all-gather, whose
        output becomes the parameters' storage. shard=3 gathers nothing here:
        each layer's forward gathers its own (zero/parameter_units.py)."""
        if self._stage == 3:
            self._units.after_step()
            return
        if self._size == 1:
            return
        for j in reversed(range(len(self._buckets))):  # the first layers' bucket is the last one
            name = f"{self._name}.gather.{j}"
            if self._gather_in_place:
                flat, (start, end) = self._flats[j], self._buckets[j].shard_range(self._rank, self._size)
                with torch.no_grad():
                    flat[:start].zero_()
                    flat[end:].zero_()
                self._gathers[j] = ops.registered_allreduce_async_(flat, name, ops.Sum, process_set=self._process_set)
            else:
                self._gathers[j] = ops.allgather_async(self._shards[j], name=name, process_set=self._process_set)
        if not self._overlap:
            self.wait_parameters()

    def _wait(self, buckets) -> None:
        for j in buckets:
            handle = self._gathers.pop(j, None)
            if handle is None:
                continue
            gathered = ops.synchronize(handle)
            b = self._buckets[j]
            if self._gather_in_place:
                continue
            # The gathered bucket becomes the parameters' storage (no copy back).
            for i, offset, shape in zip(b.params, b.offsets, b.shapes):
                p = self._all_params[i]
                p.data = gathered[offset : offset + p.numel()].view(shape)
            start, end = b.shard_range(self._rank, self._size)
            self._shards[j].data = gathered[start:end]
            self._flats[j] = gathered

    def wait_parameters(self) -> None:
        """Returns once every parameter holds the value of the last step()."""
        if self._gathers:
            self._wait(list(self._gathers))

    # ---- gradients ------------------------------------------------------------

    def _announce(self, phase: int, clip=(0.0, 0.0, False), folds: bool = False, **kw) -> None:
        """Tells ranks that have joined what this step does next, and checks
        that every rank does the same (zero/join.py)."""
        if self._announcer is not None and not self._joined:
            self._announcer.announce(phase, clip, folds=folds, **kw)

    def _pass_begins(self, grad_enabled: bool, pinned: bool = False) -> None:
        """shard=3: a forward of the model begins. Announced (a joined rank
        replays its gathers) and checked at once (every rank must run it: a
        forward one rank runs alone raises on every rank); then the last
        backward pass's reduce-scatters are taken in (zero/gradients.py's
        fold), which a joined rank matches with zeros. ``pinned``: inside
        gathered_parameters() the forward gathers nothing and may run on one
        rank alone: nothing is announced."""
        folds = self._grads.folds_at_forward()
        if not pinned:
            self._announce(
                shard_join.PASS, (float(grad_enabled), 0.0, False), folds=folds, grad_enabled=grad_enabled, wait=True
            )
        if folds:
            self._grads.fold()

    def set_model_sync(self, sync: bool) -> None:
        """The DistributedModel's require_backward_grad_sync at a training
        forward (DDP's accumulation switch), for the backward to come."""
        self._grads.set_model_sync(sync)

    def synchronize(self) -> None:
        """Returns once the gradients of the backward passes so far are reduced
        (shard=2: into this rank's shard; shard=1: into every .grad)."""
        self._announce(shard_join.SYNC, folds=self._grads.will_fold())
        self._synchronize()

    def settle(self) -> None:
        """shard=1: a .grad is used between backward and step(): finish the
        reduction now (training/pending_gradients.py)."""
        self.synchronize()

    def _reduced_now(self) -> bool:
        """synchronize() ran since the last step() and no backward pass since:
        a pass after synchronize() (without a step between) is reduced again,
        not stepped on unreduced."""
        return self._synchronized and not self._grads.pending()

    def _synchronize(self) -> None:
        # shard=3 on a joined rank: whether to reduce now is the announcement's (the others reduce now or not).
        fold = self._joined_fold if self._joined else None
        # shard=2: gradients synchronize() left in the shards, neither stepped on nor zeroed.
        unconsumed = self._stage >= 2 and self._synchronized and any(s.grad is not None for s in self._shards)
        results = self._grads.synchronize(fold)
        unused = self._grads.unused_everywhere()
        # No gradient anywhere (a step without backward): the step moves nothing, as in one process.
        self._no_gradients = len(unused) == self._grads.parameter_count()
        if unused and not self._no_gradients:
            raise RuntimeError(
                f"hvdtorch: rank {runtime.rank()}: {len(unused)} parameter(s) got no gradient on any rank since the "
                f"last step ({', '.join(unused[:5])}{', ...' if len(unused) > 5 else ''}). shard={self._stage} "
                "steps each bucket's shard as one tensor, so the optimizer would still move them (weight decay, "
                "momentum, Adam's moments and step count) where one process and DDP skip a parameter without a "
                "gradient. Freeze what no loss uses (p.requires_grad_(False)) or leave it out of the optimizer; "
                "a parameter that only some steps use needs shard=0 (hvd.DistributedModel, or "
                "hvd.DistributedOptimizer without shard)"
            )
        if unconsumed:
            raise RuntimeError(
                f"hvdtorch: rank {runtime.rank()}: a backward pass after synchronize() with neither step() nor "
                "zero_grad() between: with shard=2 the earlier pass's gradients live only in this rank's shard and "
                "would be replaced by the new pass's, where DDP adds them. Call step() or zero_grad() after "
                "synchronize(), or accumulate passes inside optimizer.no_sync() (or backward_passes_per_step)"
            )
        if self._stage >= 2:
            for shard, grad in zip(self._shards, results):
                shard.grad = grad
        else:
            self._reduced = results  # the flat buckets the .grad are views of
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside does not synchronize (Horovod's API: after synchronize() and clipping)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally, without communication."""
        with self._grads.no_sync():
            yield

    def set_backward_passes_per_step(self, passes: int) -> None:
        self._grads.reset(passes)

    def _shard_gradients_from_grad(self, reduced: List[torch.Tensor]) -> None:
        """shard=1: each shard's gradient is its range of the parameters'
        .grad: a view of ``reduced`` (the all-reduced flat buckets) while
        every .grad in the range is still the view of it that synchronize()
        made (no copy, nothing allocated per step), else a copy of them."""
        self._refuse_dropped_gradients()
        for b, shard, flat in zip(self._buckets, self._shards, reduced):
            start, end = b.shard_range(self._rank, self._size)
            if flat is not None and self._grads_view(b, flat, start, end):
                shard.grad = flat[start:end]
                continue
            pieces = []
            for i, offset in zip(b.params, b.offsets):
                p = self._all_params[i]
                lo, hi = max(start, offset), min(end, offset + p.numel())
                if lo < hi:
                    g = p.grad
                    pieces.append(
                        torch.zeros(hi - lo, dtype=shard.dtype, device=shard.device)
                        if g is None
                        else g.reshape(-1)[lo - offset : hi - offset]
                    )
            shard.grad = torch.cat(pieces) if pieces else torch.zeros_like(shard)

    def _refuse_dropped_gradients(self) -> None:
        """shard=1: a .grad set to None after the reduction (to skip a
        parameter this step, as one process would) cannot skip it here: the
        step moves each bucket's shard as one tensor (weight decay,
        momentum). Refused, naming the parameters; all of them None (a
        zero_grad() after synchronize()) skips the step, as in one process."""
        dropped = [self._names[i] for b in self._buckets for i in b.params if self._all_params[i].grad is None]
        if not dropped:
            return
        if len(dropped) == sum(len(b.params) for b in self._buckets):
            self._no_gradients = True
            return
        raise RuntimeError(
            f"hvdtorch: rank {runtime.rank()}: the .grad of {dropped[:5]} is None at step() although its gradient "
            f"was reduced (set to None after backward?): shard={self._stage} steps each bucket's shard as one "
            "tensor, so the optimizer would still move it (weight decay, momentum), where one process skips it. "
            "Leave .grad alone (or zero it: p.grad.zero_()), freeze the parameter (requires_grad_(False)) before "
            "the optimizer is built, or use shard=0 for a parameter that some steps skip"
        )

    def _grads_view(self, b, flat: torch.Tensor, start: int, end: int) -> bool:
        """Whether every .grad of bucket ``b`` that overlaps [start, end) is its slot of ``flat``."""
        for i, offset in zip(b.params, b.offsets):
            p = self._all_params[i]
            if max(start, offset) >= min(end, offset + p.numel()):
                continue
            g = p.grad
            slot = flat[offset : offset + p.numel()]
            if g is None or g.dtype != flat.dtype or not g.is_contiguous() or g.data_ptr() != slot.data_ptr():
                return False
        return True

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False):
        """torch.nn.utils.clip_grad_norm_ over every parameter of the job's
        model: reduces the gradients first (if step() has not), computes the
        norm across the shards (one all-reduce), scales the gradients this
        rank steps. Returns the total norm; the same on every rank."""
        self._announce(
            shard_join.CLIP,
            (max_norm, norm_type, error_if_nonfinite),
            folds=not self._reduced_now() and self._grads.will_fold(),
        )
        if not self._reduced_now():
            self._synchronize()
        if self._stage == 1:
            # Every rank holds the whole averaged gradient: the local norm is the global one.
            params = [p for p in self._all_params if p.grad is not None]
            return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite)
        norm_type = float(norm_type)
        grads = [s.grad for s in self._shards if s.grad is not None and s.grad.numel() > 0]
        device = self._shards[0].device
        if norm_type == math.inf:
            local = (
                torch.stack([g.abs().max().float() for g in grads]).max() if grads else torch.zeros((), device=device)
            )
            total = ops.allreduce(
                local.reshape(1), op=ops.Max, name=f"{self._name}.clip_norm", process_set=self._process_set
            )[0]
        else:
            local = (
                torch.stack([g.float().norm(norm_type) ** norm_type for g in grads]).sum()
                if grads
                else torch.zeros((), device=device)
            )
            summed = ops.allreduce(
                local.reshape(1), op=ops.Sum, name=f"{self._name}.clip_norm", process_set=self._process_set
            )[0]
            total = summed ** (1.0 / norm_type)
        if error_if_nonfinite and not bool(torch.isfinite(total)):
            raise RuntimeError(f"hvdtorch: the total norm of order {norm_type} of the gradients is non-finite")
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
        return total

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

    # ---- after hvd.join() (zero/join.py) ------------------------------------------

    def listen_while_joined(self) -> int:
        """Inside hvd.join(): starts waiting for what the others do next."""
        return self._announcer.listen()

    def heard(self, token: int) -> bool:
        return self._announcer.arrived(token)

    def joined_phase(self, token: int) -> bool:
        """Inside hvd.join(): runs the phase the others announced with zero
        gradients (the gradients of a partial accumulation are dropped, as a
        joined rank's are in Horovod). False once every rank has joined."""
        phase, clip, folds = self._announcer.heard(token)
        if phase == shard_join.NONE:
            self.wait_parameters()
            return False
        self._joined = True
        try:
            if phase == shard_join.PASS:  # shard=3: the others' forward and backward gather from this rank too
                if folds:  # the others take in the reduce-scatters of their last pass: zeros from here
                    self._grads.fold()
                self._units.replay(bool(clip[0]))
                return True
            # A partial accumulation of this rank's own is dropped (as Horovod drops a joined rank's); shard=3's
            # folded passes were reduced with every rank's and are kept.
            if not self._synchronized and self._stage < 3:
                self._grads.reset()
                self.zero_grad(set_to_none=True)
            self._joined_fold = folds if self._stage == 3 else None
            if phase == shard_join.SYNC:
                self._synchronize()
            elif phase == shard_join.CLIP:
                self.clip_grad_norm_(*clip)
            else:
                self.step()
        finally:
            self._joined = False
            self._joined_fold = None
        return True

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._grads.pending():
            raise AssertionError(
                "hvdtorch: optimizer.zero_grad() between loss.backward() and optimizer.step() "
                "(or synchronize()): the gradients of that backward pass are being reduced "
                "across ranks; zero them before backward or after step()"
            )
        self._grads.remove_held()
        self._grads.drop_accumulated()  # shard=3: the passes folded since the step
        for p in itertools.chain(self._all_params, self._shards):
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                # torch's Optimizer.zero_grad: a view (the shard's gradient in the flat bucket) cannot detach_().
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()
        if self._stage < 3:  # shard=3 keeps no gradient buffer between steps
            self._grads.view_gradients()  # zeroed views of the buckets: backward accumulates in place

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

    # ---- checkpoints (zero/checkpoint.py) ------------------------------------

    def state_dict(self):
        """The whole optimizer state in torch's format, as the last
        consolidate_state_dict() gave it to this rank (torch's
        ZeroRedundancyOptimizer's contract, which Lightning follows). Without
        one since the last step(), or on a rank it did not go to, it raises
        naming the fix: a rank's own state is only a shard, and a checkpoint
        of it saved from rank 0 would silently hold rank 0's part alone."""
        return sharded_checkpoint.consolidated_state_dict(self)

    def sharded_state_dict(self):
        """This rank's shard of the optimizer state (local, cheap; every rank
        saves its own: load it back at the same number of ranks, or pass
        every rank's to load_state_dict at any number)."""
        return sharded_checkpoint.shard_state_dict(self)

    def load_state_dict(self, state_dict) -> None:
        """Takes a full state (an unsharded optimizer's state_dict(), or
        consolidate_state_dict()'s), this rank's shard from
        sharded_state_dict(), or the list of every rank's shards (any number
        of ranks then)."""
        self.wait_parameters()
        self._grads.reset()
        self._synchronized = False
        self._consolidated = None
        sharded_checkpoint.load(self, state_dict)

    def consolidate_state_dict(self, to=0):
        """Collective: the whole optimizer state in torch's format (as the
        unsharded optimizer's state_dict() would hold it, tensors on the CPU)
        on rank ``to`` (a global rank, a list of them, or None: every rank);
        None elsewhere. state_dict() returns it there until the next step()."""
        self._consolidated = sharded_checkpoint.consolidate(self, to)
        return self._consolidated

    def _hvd_broadcast_state(self, root_rank: int) -> None:
        """hvd.broadcast_optimizer_state on a sharded optimizer: the job's state as root_rank sees it."""
        full = self.consolidate_state_dict(to=root_rank)
        full = broadcast_object(full, root_rank, name=f"{self._name}.broadcast_state", process_set=self._process_set)
        self.load_state_dict(full)
