"""Horovod's DistributedOptimizer: wraps a torch optimizer so that step()
applies gradients averaged across ranks.

    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    loss.backward()
    opt.step()

Gradient hooks start each bucket's all-reduce during backward; step() (or
synchronize()) waits for them. Dense gradients go through the same C++
gradient reducer as DistributedModel; training/gradient_sync.py holds Horovod's
contract (backward_passes_per_step, sparse gradients, misuse errors), counting
passes with the gradient core's pass counter (_C.PassCounter).
"""

import contextlib
import itertools
import warnings

import torch

from .. import autotune
from ..collectives import ops
from ..collectives.compression import Compression, check_bucket_compression
from ..collectives.powersgd import is_powersgd
from ..collectives.process_sets import set_id
from ..zero.optimizer import KEEP_GATHERED_BELOW, ShardedOptimizer
from .adasum_optimizer import _DistributedAdasumOptimizer
from .bucketed_step import steps_in_pieces
from .buckets import layers_by_name, plan_buckets
from .distributed_model import DistributedModel, owner_of, refuse_if_sharded, refuse_meta_parameters
from .gradient_sync import GradientSync
from .module_rules import ModuleRules
from .parameter_names import names_by_id
from .pending_gradients import weak_method
from .shared_groups import load_keeping_groups

_instance_ids = itertools.count()
# The key of a Compression.powersgd compressor's state in DistributedOptimizer.state_dict().
_POWERSGD_KEY = "hvdtorch_powersgd"


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        groups,
        sparse_as_dense,
        fusion_bytes,
        reducer,
        process_set=None,
        *,
        module=None,
        hook_module=False,
    ):
        super(self._hvd_class, self).__init__(params)
        if op not in (ops.Average, ops.Sum):
            raise ValueError("hvdtorch: DistributedOptimizer supports op=hvd.Average or hvd.Sum")
        names = names_by_id(self.param_groups, named_parameters, module)
        # Layers (buckets keep a layer's gradients together) come from the caller's names only.
        layers = {} if named_parameters is None else dict(zip(names, layers_by_name(list(names.values()))))
        self._parameter_names = {p: names[id(p)] for group in self.param_groups for p in group["params"]}
        _check_groups(groups)
        trainable, seen = [], set()
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    trainable.append(p)
        f = float(gradient_predivide_factor)
        # Names the reductions: optimizers must be built in the same order on every rank.
        name = f"optimizer{next(_instance_ids)}"
        self._hvd_synchronized = False
        self._hvd_should_synchronize = True
        self._hvd_compression = compression
        self._hvd_sync = None
        self._hvd_autotune = None
        self._hvd_module_rules = None
        process_set = process_set or ops.global_process_set
        # As Horovod: on a rank outside the set, or in a set of one, nothing
        # is reduced and no hook is installed; it is the plain optimizer.
        if process_set.included() and process_set.size() > 1:
            self._hvd_sync = GradientSync(
                trainable,
                [names[id(p)] for p in trainable],
                name,
                op,
                1.0 / f,
                f,
                compression,
                backward_passes_per_step,
                sparse_as_dense,
                lambda dense, fusion: _layout(dense, groups, fusion, layers),
                fusion_bytes,
                reducer,
                process_set,
            )
            # HVDTORCH_AUTOTUNE tunes the bucket cap of fusion buckets, not of the caller's groups.
            if groups is None and fusion_bytes > 0:
                self._hvd_autotune = autotune.attach(name, trainable, self._hvd_sync.set_fusion_bytes, process_set)
            # model= (a plain module): DDP's accumulation flag and buffer rule at its forwards (module_rules.py).
            if hook_module:
                self._hvd_module_rules = ModuleRules(
                    module, process_set, f"{name}.module", weak_method(self._hvd_sync, "set_model_sync")
                )

    def synchronize(self):
        """Returns once every gradient of the backward passes so far is reduced."""
        if self._hvd_sync is not None:
            self._hvd_sync.synchronize()
        self._hvd_synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside does not synchronize (call synchronize() yourself first)."""
        self._hvd_should_synchronize = False
        try:
            yield
        finally:
            self._hvd_should_synchronize = True

    def step(self, closure=None):
        stepped = False  # the reduction stepped the optimizer bucket by bucket
        # A use of .grad after backward finished the reduction (training/pending_gradients.py): step on it.
        settled = self._hvd_sync is not None and self._hvd_sync.settled
        if self._hvd_should_synchronize and not settled:
            if self._hvd_synchronized:
                # Horovod's wording first: log filters and tests written for it look for it.
                warnings.warn(
                    "hvdtorch: optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(): step() reduces the gradients a second time; call step() inside "
                    "optimizer.skip_synchronize() when you synchronize yourself (e.g. to clip gradients)",
                    stacklevel=2,
                )
            # Step each bucket's parameters as soon as it is reduced (bucketed_step.py) where the result is the
            # same as synchronize() and one step.
            stepped = (
                closure is None
                and self._hvd_sync is not None
                and steps_in_pieces(self._hvd_class.__bases__[0])
                and self._hvd_sync.synchronize_in_pieces(lambda: super(self._hvd_class, self).step(), self.param_groups)
            )
            if not stepped:
                self.synchronize()
        self._hvd_synchronized = False
        result = None if stepped else super(self._hvd_class, self).step(closure)
        if self._hvd_sync is not None:
            self._hvd_sync.end_step()
        if self._hvd_autotune is not None:
            self._hvd_autotune.step_boundary()  # every gradient of this step is reduced
        return result

    def zero_grad(self, set_to_none: bool = True):
        if self._hvd_sync is not None and self._hvd_sync.pending():
            raise AssertionError(
                "hvdtorch: optimizer.zero_grad() between loss.backward() and optimizer.step() "
                "(or synchronize()): the gradients of that backward pass are being reduced "
                "across ranks; zero them before backward or after step()"
            )
        return super(self._hvd_class, self).zero_grad(set_to_none=set_to_none)

    def state_dict(self, *args, **kwargs):
        """The wrapped optimizer's, and with Compression.powersgd its state under _POWERSGD_KEY."""
        state = super(self._hvd_class, self).state_dict(*args, **kwargs)
        if is_powersgd(self._hvd_compression):
            state[_POWERSGD_KEY] = self._hvd_compression.state_dict()
        return state

    def load_state_dict(self, state_dict, *args, **kwargs):
        if self._hvd_sync is not None:
            self._hvd_sync.reset()
        self._hvd_synchronized = False
        self._hvd_should_synchronize = True
        if _POWERSGD_KEY in state_dict:
            state_dict = dict(state_dict)
            powersgd = state_dict.pop(_POWERSGD_KEY)
            if is_powersgd(self._hvd_compression):
                self._hvd_compression.load_state_dict(powersgd)
        return load_keeping_groups(self, super(self._hvd_class, self).load_state_dict, state_dict, *args, **kwargs)

    def set_backward_passes_per_step(self, passes: int):
        """Changes how many backward passes are accumulated before each reduction."""
        self.backward_passes_per_step = passes
        if self._hvd_sync is not None:
            self._hvd_sync.reset(passes)


def _check_powersgd(compression, optimizer, named_parameters, op, shard, process_set, module=None) -> None:
    """The combinations Compression.powersgd refuses, each naming why."""
    where = "DistributedOptimizer"
    if shard:
        raise ValueError(
            f"hvdtorch: shard={shard} does not combine with Compression.powersgd: the sharded optimizer reduces "
            "each bucket into shards, and PowerSGD's factors approximate whole matrices; use shard=0, or "
            "Compression.none/fp16"
        )
    if op == ops.Adasum:
        raise ValueError(
            "hvdtorch: op=hvd.Adasum does not combine with Compression.powersgd: Adasum combines whole updates "
            "pairwise and PowerSGD averages low-rank factors; use op=hvd.Average or hvd.Sum"
        )
    names = names_by_id(optimizer.param_groups, named_parameters, module)
    compression.check_parameters(
        ((names[id(p)], p) for group in optimizer.param_groups for p in group["params"] if p.requires_grad), where
    )
    compression.check_process_set(process_set, where)


def _known_module(optimizer, model):
    """The module whose parameter names the messages use: ``model`` (a
    DistributedModel's own module), else the module of the one
    DistributedModel over the optimizer's parameters, else None."""
    if isinstance(model, DistributedModel):
        return model.module
    if isinstance(model, torch.nn.Module):
        return model
    if model is not None:
        raise ValueError(
            f"hvdtorch: model= must be a torch.nn.Module (or a DistributedModel), got {type(model).__name__}"
        )
    owners = {id(o): o for o in (owner_of(p) for g in optimizer.param_groups for p in g["params"]) if o is not None}
    return next(iter(owners.values())).module if len(owners) == 1 else None


def _adopt_state(new, optimizer) -> None:
    """The state the wrapped optimizer holds (loaded from a checkpoint before
    the wrap, or stepped) is the wrapper's: the same dict, keyed by the same
    parameters. Horovod's wrapper starts empty; here resuming before or after
    the wrap is the same (docs/horovod.md)."""
    if optimizer.state:
        new.state = optimizer.state


def _check_groups(groups):
    if groups is None:
        return
    if isinstance(groups, int) and not isinstance(groups, bool):
        if groups <= 0:
            raise ValueError(
                f"hvdtorch: groups must be a positive number of groups or lists of parameters, got {groups}"
            )
        return
    if not isinstance(groups, list):
        raise ValueError(
            f"hvdtorch: groups must be a positive number of groups or lists of parameters, got {type(groups).__name__}"
        )
    seen = set()
    for group in groups:
        for p in group:
            if not isinstance(p, torch.Tensor):
                raise ValueError(f"hvdtorch: groups must hold torch.Tensor parameters, got {type(p).__name__}")
            if id(p) in seen:
                raise ValueError("hvdtorch: a parameter appears in groups more than once")
            seen.add(id(p))


def _layout(params, groups, fusion_bytes, layers=None):
    """Bucket layout (lists of indices into ``params``) of the dense
    parameters; ``layers``: id(parameter) -> its layer (buckets.py)."""
    if groups is None:
        layer_of = [(layers or {}).get(id(p)) for p in params]
        return plan_buckets(params, reversed(range(len(params))), fusion_bytes, 1 << 20, layer_of=layer_of)
    if isinstance(groups, int):
        indices = list(range(len(params)))
        return _split_by_dtype(params, [b for b in (indices[k::groups] for k in range(groups)) if b])
    index = {id(p): i for i, p in enumerate(params)}
    layout = _split_by_dtype(params, [[index[id(p)] for p in g if id(p) in index] for g in groups])
    grouped = {i for b in layout for i in b}
    return layout + [[i] for i in range(len(params)) if i not in grouped]


def _split_by_dtype(params, layout):
    out = []
    for bucket in layout:
        by_dtype = {}
        for i in bucket:
            by_dtype.setdefault(params[i].dtype, []).append(i)
        out.extend(by_dtype.values())
    return out


def DistributedOptimizer(
    optimizer,
    named_parameters=None,
    compression=Compression.none,
    backward_passes_per_step=1,
    op=ops.Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    sparse_as_dense=False,
    process_set=None,
    fusion_bytes=25 << 20,
    reducer=None,
    shard=0,
    model=None,
    overlap_gathers=False,
    reshard_after_forward=True,
    keep_gathered_below=KEEP_GATHERED_BELOW,
    share_gathered=True,
    secondary_copy=False,
    init_device=None,
    param_init_fn=None,
):
    """Returns ``optimizer`` turned distributed (Horovod's signature).

    num_groups / groups: as in Horovod, how parameters are grouped into
    all-reduces (an int, or lists of parameters); default: fusion buckets
    of ``fusion_bytes``. sparse_as_dense: reduce sparse gradients densely
    (all-reduce) instead of by all-gather. process_set: gradients are
    averaged over its ranks; on ranks outside it this is the plain optimizer.
    op=hvd.Adasum: Horovod's delta optimizer (training/adasum_optimizer.py): each
    rank steps locally and the change is combined with Adasum, in buckets
    of fusion_bytes; groups, sparse_as_dense and reducer do not apply to it.
    shard=1 or 2: ZeRO stage 1 (optimizer state sharded) or 2 (gradients
    too): a ShardedOptimizer (zero/optimizer.py). Its step() returns with
    every parameter updated. overlap_gathers=True lets step() return before
    the parameters are all-gathered, each submodule's forward waiting for its
    own: faster; parameters(), named_parameters() and state_dict() of the
    module wait for the gathers, but a read through a tensor kept from
    before (the optimizer's param_groups, a weight held elsewhere) before
    opt.wait_parameters() may see it half gathered. model=
    names the module whose forward waits (found by itself on a
    DistributedModel's parameters). shard=3: ZeRO stage 3, the parameters
    sharded too, over a DistributedModel's parameters (model=, or found by
    itself): each layer's parameters are gathered around its forward and
    again in backward (zero/parameter_units.py); reshard_after_forward=False
    keeps them from forward until backward; buckets of fewer than
    keep_gathered_below bytes stay gathered from the first forward after a
    step to the next step; where every rank is on one host, the ranks read
    one gathered copy in shared memory (share_gathered=False: one each);
    across hosts, secondary_copy=True keeps each rank's part of the gathered
    buckets among its host's ranks until the step, so that backward gathers
    them again within the host (ZeRO++'s hierarchical partitioning). A
    model built on the meta device: shard=3 makes each rank's shards module
    by module on init_device (default CPU), each module initialized by
    param_init_fn(module) or its own reset_parameters() (zero/meta_init.py)."""
    set_id(process_set, member=False)  # an added set; ranks outside it step locally
    # One optimizer per parameter: a newer DistributedOptimizer takes parameters over from an older one
    # (gradient_sync.take_over, and a sharded one through release_to_sharding), but never from a live
    # sharded optimizer, whose parameters are views of its buckets.
    module = _known_module(optimizer, model)
    if named_parameters is not None:
        named_parameters = list(named_parameters)  # read more than once
    refuse_if_sharded(
        [p for group in optimizer.param_groups for p in group["params"]],
        lambda p: names_by_id(optimizer.param_groups, named_parameters, module).get(id(p), "?"),
        "hvd.DistributedOptimizer",
    )
    if op != ops.Adasum:  # Adasum's step applies any compressor to the update (adasum_optimizer.py)
        check_bucket_compression(compression, "DistributedOptimizer")
    if is_powersgd(compression):
        _check_powersgd(compression, optimizer, named_parameters, op, shard, process_set, module)
    if shard:
        unsupported = [
            n
            for n, given in (
                ("groups", groups is not None or num_groups),
                ("sparse_as_dense", sparse_as_dense),
                ("reducer", reducer),
                ("op=hvd.Adasum", op == ops.Adasum),
            )
            if given
        ]
        if unsupported:
            raise ValueError(f"hvdtorch: shard={shard} does not combine with {', '.join(unsupported)}")
        ps = process_set or ops.global_process_set
        if not ps.included():
            return optimizer  # as Horovod: outside the set, the plain optimizer
        return ShardedOptimizer(
            optimizer,
            named_parameters,
            shard=shard,
            compression=compression,
            backward_passes_per_step=backward_passes_per_step,
            op=op,
            gradient_predivide_factor=gradient_predivide_factor,
            process_set=process_set,
            fusion_bytes=fusion_bytes,
            model=model,
            overlap_gathers=overlap_gathers,
            reshard_after_forward=reshard_after_forward,
            keep_gathered_below=keep_gathered_below,
            share_gathered=share_gathered,
            secondary_copy=secondary_copy,
            init_device=init_device,
            param_init_fn=param_init_fn,
        )
    if init_device is not None or param_init_fn is not None:
        raise ValueError("hvdtorch: init_device and param_init_fn apply to shard=3 (a model built on the meta device)")
    refuse_meta_parameters((p for group in optimizer.param_groups for p in group["params"]), "DistributedOptimizer")
    if overlap_gathers:
        raise ValueError("hvdtorch: overlap_gathers=True applies to a sharded optimizer (shard=1 or 2) only")
    shard3_options = (not reshard_after_forward, keep_gathered_below != KEEP_GATHERED_BELOW, not share_gathered)
    if any(shard3_options) or secondary_copy:
        raise ValueError(
            "hvdtorch: reshard_after_forward, keep_gathered_below, share_gathered and secondary_copy apply to "
            "shard=3 only"
        )
    if gradient_predivide_factor != 1.0 and op != ops.Average:
        raise ValueError("hvdtorch: gradient_predivide_factor needs op=hvd.Average")
    if num_groups != 0:
        warnings.warn(
            "hvdtorch: num_groups is deprecated (as in Horovod); use groups=", DeprecationWarning, stacklevel=2
        )
        if groups is None:
            groups = num_groups
    if op == ops.Adasum:
        ps = process_set or ops.global_process_set
        if ps.included() and ps.size() > 1:
            cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedAdasumOptimizer.__dict__))
            cls._hvd_class = cls
            name = f"optimizer{next(_instance_ids)}"
            new = cls(
                optimizer.param_groups,
                named_parameters,
                compression,
                backward_passes_per_step,
                fusion_bytes,
                name,
                ps,
                module=module,
            )
            _adopt_state(new, optimizer)
            return new
        op = ops.Average  # as Horovod: alone in the set (or outside it), the plain optimizer; nothing is reduced
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    # The methods call the wrapped class through _hvd_class, not self.__class__: a subclass made of the
    # instance's class (Lightning's LightningOptimizer does that) would make self.__class__ recurse.
    cls._hvd_class = cls
    # model= a plain module (no DistributedModel over it): DDP's per-forward rules there (module_rules.py).
    hook_module = module is not None and not isinstance(model, DistributedModel) and model is not None
    if hook_module and owner_of(next(iter(module.parameters()), torch.empty(0))) is not None:
        hook_module = False  # a DistributedModel over it applies them
    new = cls(
        optimizer.param_groups,
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        groups,
        sparse_as_dense,
        fusion_bytes,
        reducer,
        process_set,
        module=module,
        hook_module=hook_module,
    )
    _adopt_state(new, optimizer)
    return new
