"""DistributedModel: wraps any nn.Module so that backward averages gradients
across ranks, overlapping communication with the rest of backward.

    model = hvd.DistributedModel(model)
    loss.backward()        # gradients are averaged when this returns
    optimizer.step()

The configurations of the ablation study map to arguments:
    none  pipeline=False, fusion_bytes=0   (one all-reduce per tensor, after backward)
    P     pipeline=True,  fusion_bytes=0
    F     pipeline=False, fusion_bytes>0   (buckets, launched after backward)
    P+F   pipeline=True,  fusion_bytes>0   (default)

The work is the gradient core's (docs/architecture.md, "The gradient core"):
buckets from training/buckets.py's planner, the C++ GradientReducer
(csrc/torch/grad_reducer.h) for hooks, launching and waiting, its pass counter
(backward_passes_per_step, no_sync()) and the wire codec (Compression.fp16).
"""

import contextlib
import gc
import itertools
import weakref
from typing import Callable, Optional, Sequence

import torch

from .. import _C, autotune, runtime
from ..collectives import ops
from ..collectives.compression import Compression, check_bucket_compression
from ..collectives.handles import check_process_set
from ..collectives.powersgd import is_powersgd
from . import compiled_model
from .bucketed_step import step_as_reduced, steps_in_pieces
from .buckets import complete_order, layers_by_name, plan_buckets
from .buffer_sync import BufferSync, ForwardSyncRule
from .coming_from_ddp import ddp_arguments
from .compile_marks import disabled_when_compiled
from .compiled_model import PassState, compiled_autograd_on, use_traced_hooks
from .mixed_precision import as_policy, cast_buffers, cast_floating, cast_parameters
from .reducer_options import reducer_options
from .step_marks import StepMarks

_instance_ids = itertools.count()

# id(parameter) -> the live DistributedModel that reduces its gradient, so
# that a sharded optimizer over those parameters finds the model (owner_of).
_models_by_param = weakref.WeakValueDictionary()


def owner_of(param: torch.Tensor) -> Optional["DistributedModel"]:
    """The DistributedModel whose hooks reduce ``param``'s gradient, if any."""
    return _models_by_param.get(id(param))


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


def _check_not_sharded(module: torch.nn.Module) -> None:
    """A sharded optimizer built before the model reduces the gradients
    itself and has made the parameters views of its buckets: a
    DistributedModel over them would reduce every gradient a second time,
    racing with it. Refused, naming the order that works."""
    for name, p in module.named_parameters():
        opt = sharded_stepper(p)
        if opt is not None and owner_of(p) is None:
            raise ValueError(
                f"hvdtorch: DistributedModel: parameter '{name}' is already stepped by a sharded optimizer "
                f"(hvd.DistributedOptimizer(..., shard={getattr(opt, '_stage', '?')})) made before this model; wrap "
                "the module in DistributedModel first and build the optimizer after it (it then takes the "
                "model's gradients over), or leave DistributedModel out: the sharded optimizer reduces the "
                "gradients itself"
            )


def _trainable(module_or_params):
    """Parameters that require grad, each once (tied parameters appear once)."""
    seen, out = set(), []
    for p in module_or_params:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def built_on_meta(module: torch.nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` is on the meta device."""
    return any(t.is_meta for t in itertools.chain(module.parameters(), module.buffers()))


def refuse_meta_parameters(params, where: str) -> None:
    """An optimizer route other than shard=3 over parameters on the meta device (no values)."""
    if any(p.is_meta for p in params):
        raise ValueError(
            f"hvdtorch: {where}: the parameters are on the meta device (no values): shard=3 over a "
            "DistributedModel of a model built there makes each rank's shards module by module; otherwise "
            "materialize the model first (module.to_empty(device=...) and its init)"
        )


def _check_devices(module: torch.nn.Module) -> None:
    """Parameters on a device this build cannot serve are refused by name.
    (Parameters on several devices are fine: buckets hold one device each.)"""
    for name, p in module.named_parameters():
        if p.device.type == "cuda" and not runtime.cuda_built():
            raise ValueError(
                f"hvdtorch: DistributedModel: parameter '{name}' is on {p.device}, but this hvdtorch build has no "
                "CUDA support; `python -m hvdtorch.check` says why"
            )
        if p.device.type not in ("cpu", "cuda", "meta"):
            raise ValueError(
                f"hvdtorch: DistributedModel: parameter '{name}' is on {p.device}; hvdtorch serves CPU and CUDA "
                "tensors (and models built on the meta device, for shard=3 to make their shards)"
            )


class DistributedModel(torch.nn.Module):
    def __init__(
        self,
        module: torch.nn.Module,
        reducer: str = "auto",
        fusion_bytes: int = 25 << 20,
        first_bucket_bytes: int = 1 << 20,
        pipeline: bool = True,
        sync: str = "backward",
        op: int = ops.Average,
        backward_passes_per_step: int = 1,
        compression=Compression.none,
        gradient_predivide_factor: float = 1.0,
        rebuild_buckets: bool = True,
        name: Optional[str] = None,
        process_set=None,
        *,
        broadcast_buffers: Optional[bool] = None,
        forward_sync_buffers: Optional[bool] = None,
        init_sync: bool = True,
        mixed_precision=None,
        # DistributedDataParallel's other arguments (coming_from_ddp.py says what each means here).
        device_ids=None,
        output_device=None,
        dim: int = 0,
        process_group=None,
        device_mesh=None,
        bucket_cap_mb=None,
        bucket_cap_mb_list=None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        skip_all_reduce_unused_params: bool = False,
        batched_grad_copy: bool = False,
        **unsupported,
    ):
        super().__init__()
        ddp = ddp_arguments(
            module,
            fusion_bytes,
            device_ids=device_ids,
            output_device=output_device,
            dim=dim,
            process_group=process_group,
            device_mesh=device_mesh,
            bucket_cap_mb=bucket_cap_mb,
            bucket_cap_mb_list=bucket_cap_mb_list,
            broadcast_buffers=broadcast_buffers,
            forward_sync_buffers=forward_sync_buffers,
            unsupported=unsupported,
        )
        fusion_bytes = ddp.fusion_bytes
        if sync not in ("backward", "explicit"):
            raise ValueError(f"hvdtorch: sync must be 'backward' or 'explicit', got {sync!r}")
        if op not in (ops.Average, ops.Sum):
            raise ValueError("hvdtorch: DistributedModel reduces gradients with hvd.Average or hvd.Sum")
        if gradient_predivide_factor <= 0:
            raise ValueError("hvdtorch: gradient_predivide_factor must be positive")
        sparse = [
            n or type(m).__name__
            for n, m in module.named_modules()
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse
        ]
        if sparse:
            raise ValueError(
                f"hvdtorch: DistributedModel reduces dense gradients, but {sparse} make sparse ones "
                "(sparse=True); use sparse=False there, or hvd.DistributedOptimizer, which "
                "all-gathers sparse gradients"
            )
        _check_devices(module)
        _check_not_sharded(module)
        self.module = module
        st = runtime.state()
        # Gradients are averaged over the process set's ranks (all by default).
        self._process_set = process_set or ops.global_process_set
        psid = check_process_set(process_set)
        # As DDP: every rank starts from the set's first rank's parameters and
        # buffers, and buffers (BatchNorm's running statistics) follow that
        # rank's before the forwards DDP syncs them in (buffer_sync.py).
        # Names every collective of this model: models must be built in the same order on every rank.
        self._name = name or f"model{next(_instance_ids)}"
        self._buffers_sync = BufferSync(module, self._process_set, self._name, enabled=ddp.forward_sync_buffers)
        self._init_sync_buffers = ddp.init_sync_buffers
        # DDP's two switches, under its names: whether the backward of the next training forward reduces
        # (read at each forward: no_sync() sets it), and whether the next forward syncs the buffers.
        self._require_backward_grad_sync = True
        self._forward_sync = ForwardSyncRule()
        # Built on the meta device: shard=3's optimizer makes each rank's shards module by module
        # (zero/meta_init.py) and reduces the gradients; nothing here may touch the values before.
        self._built_on_meta = built_on_meta(module)
        # Whether wrapping broadcasts the first rank's values; shard=3 reads it when it makes a meta model's shards.
        self.init_sync = bool(init_sync)
        params = _trainable(module.parameters())
        self._params = params
        names = {id(p): n for n, p in module.named_parameters()}
        # A layer's gradients are computed together: buckets keep them together (buckets.py).
        self._layers = layers_by_name([names.get(id(p)) for p in params])
        strategy = None
        check_bucket_compression(compression, "DistributedModel")
        # A mixed-precision policy (training/mixed_precision.py): casts around forward, the reduce dtype's codec.
        self.mixed_precision = as_policy(mixed_precision)
        codec = None
        if self.mixed_precision is not None:
            if compression is not Compression.none:
                raise ValueError(
                    "hvdtorch: DistributedModel: mixed_precision= sets the dtype gradients travel in; leave "
                    "compression= out (reduce_dtype=torch.float16 is Compression.fp16's wire)"
                )
            codec = self.mixed_precision.codec()
            cast_buffers(module, self.mixed_precision.buffer_dtype)
        if is_powersgd(compression):
            where = "DistributedModel"
            compression.check_parameters(((n, p) for n, p in module.named_parameters() if p.requires_grad), where)
            compression.check_process_set(process_set, where)
            strategy = compression.strategy_for(self, runtime.rank())
        for p in params:
            _models_by_param[id(p)] = self
        # What a sharded optimizer that takes over the gradients reduces them with (hand_gradients_to).
        self.gradient_options = dict(
            op=op,
            prescale=1.0 / float(gradient_predivide_factor),
            postscale=float(gradient_predivide_factor),
            compression=compression,
            backward_passes_per_step=int(backward_passes_per_step),
            process_set=self._process_set,
            fusion_bytes=int(fusion_bytes),
            first_bucket_bytes=int(first_bucket_bytes),
            codec=codec,
        )
        self._gradient_owner = None
        self._parameter_units = None  # shard=3's (zero/parameter_units.py), once a sharded optimizer holds them
        self._fusion_bytes = int(fusion_bytes)
        self._first_bucket_bytes = int(first_bucket_bytes)
        self._bucket_caps = ddp.bucket_caps  # DDP's bucket_cap_mb_list, in bytes
        # The order buckets are filled in: reverse registration order until
        # the ranks agree on the observed one.
        self._order = list(reversed(range(len(params))))
        self._reducer = None
        self._rebuild_pending = False
        self._autotune = None
        self._marks = StepMarks(st.engine, self._name)
        if self._built_on_meta:
            if init_sync:  # shapes are known on the meta device: a mismatch is named before any shard is made
                self._buffers_sync.check_same_model(f"DistributedModel '{self._name}'")
            return
        layout = self._plan(self._first_bucket_bytes)
        f = float(gradient_predivide_factor)
        self._reducer = _C.GradientReducer(
            st.engine,
            params,
            layout,
            reducer_options(
                compression=compression,
                codec=codec,
                name=self._name,
                reducer=reducer or "",
                op=op,
                prescale=1.0 / f,
                postscale=f,
                pipeline=bool(pipeline),
                sync_on_backward=sync == "backward",
                fuse=self._fusion_bytes > 0,
                backward_passes_per_step=int(backward_passes_per_step),
                process_set_id=psid,
                strategy_instance=strategy,
                unused="leave",  # no rank's gradient: .grad stays None, as under DDP and in one process
                param_names=[names.get(id(p), f"parameter {i}") for i, p in enumerate(params)],
            ),
        )
        # Re-order buckets by the ready order observed in the first iteration
        # (the set's first rank's, so every member agrees). Pointless with one
        # tensor per bucket.
        self._rebuild_pending = (
            rebuild_buckets and self._fusion_bytes > 0 and self._process_set.size() > 1 and len(params) > 1
        )
        # HVDTORCH_AUTOTUNE: tunes this model's bucket cap (hvdtorch/autotune.py).
        self._autotune = (
            autotune.attach(self._name, params, self._set_fusion_bytes, process_set)
            if self._fusion_bytes > 0 and params
            else None
        )
        # Last, once every argument is checked: a refused model broadcasts nothing.
        if init_sync:
            self._buffers_sync.check_same_model(f"DistributedModel '{self._name}'")
            self._buffers_sync.broadcast_state(buffers=self._init_sync_buffers)

    # Under torch.compile this frame runs eagerly and only the module's call
    # is compiled (compiled_model.py): no graph break inside the model, its
    # graphs split at the bucket size, the bookkeeping around it in Python.
    @disabled_when_compiled(recursive=False)
    def forward(self, *args, **kwargs):
        self._refuse_meta("forward")
        self._before_forward()
        policy = self.mixed_precision
        if policy is not None and policy.cast_forward_inputs:
            args, kwargs = cast_floating(args, policy.param_dtype), cast_floating(kwargs, policy.param_dtype)
        outer = compiled_model.begin_bucketed_graphs(self)
        try:
            if self._parameter_units is None:
                with self._cast_parameters():
                    out = self._marks.forward(self.module, args, kwargs)
            else:  # shard=3 gathers in the policy's dtype itself
                with self._parameter_units.forward():
                    out = self._marks.forward(self.module, args, kwargs)
        finally:
            compiled_model.end_bucketed_graphs(outer)
        if policy is not None:
            out = cast_floating(out, policy.output_dtype)
        # DDP's _post_forward: the next forward syncs the buffers after a training forward that reduces.
        self._forward_sync.after_forward(torch.is_grad_enabled(), self._require_backward_grad_sync)
        return out

    @property
    def require_backward_grad_sync(self) -> bool:
        """DDP's accumulation switch, read at every forward with autograd on:
        False makes that forward's backward accumulate locally (no
        communication; .grad holds this rank's own sum, as under DDP), and
        the next backward that reduces averages the sum. no_sync() sets it
        for its body. With shard=3 such a backward still reduce-scatters
        into this rank's shard (docs/guide.md, 'Accumulation')."""
        return self._require_backward_grad_sync

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, value: bool) -> None:
        self._require_backward_grad_sync = bool(value)

    @property
    def require_forward_param_sync(self) -> bool:
        """DDP's: whether the next forward takes the first rank's buffers
        (True after a training forward whose backward reduces, and before
        the first forward; buffer_sync.ForwardSyncRule)."""
        return self._forward_sync.due

    @require_forward_param_sync.setter
    def require_forward_param_sync(self, value: bool) -> None:
        self._forward_sync.due = bool(value)

    def _cast_parameters(self):
        """The policy's casts for this forward (none without one). A sharded
        optimizer that gathers behind step() is waited for first: the casts
        read every parameter."""
        policy = self.mixed_precision
        if policy is None or policy.param_dtype is None:
            return contextlib.nullcontext()
        if self._gradient_owner is not None:
            self._gradient_owner.wait_parameters()
        return cast_parameters(self.module, policy.param_dtype)

    def _refuse_meta(self, what: str) -> None:
        """A model built on the meta device, before shard=3 has made its shards."""
        if self._built_on_meta and self._gradient_owner is None:
            raise ValueError(
                f"hvdtorch: DistributedModel '{self._name}': {what}: the module was built on the meta device, "
                "so its parameters hold no values yet: hvd.DistributedOptimizer(opt, shard=3, model=model) "
                "makes each rank's shards from it, module by module (docs/guide.md, 'Sharded parameters'), or "
                "materialize it before wrapping (module.to_empty(device=...) and its init)"
            )

    @disabled_when_compiled
    def _before_forward(self) -> None:
        grad = torch.is_grad_enabled()
        if grad:
            # As DDP's prepare_for_backward: the flag at the forward decides whether its backward reduces.
            self._latch_backward_sync()
        if grad and self._reducer is not None and compiled_autograd_on() and not self._reducer.traced_hooks:
            self._pass_state = PassState()
            self._traced_hooks = use_traced_hooks(self, self._params, self._pass_state)
        if grad and self._reducer is not None and self._reducer.traced_hooks:
            # The C++ pre-hook's wait for an unfinished pass (sync="explicit" without
            # sync_gradients()) before the next accumulates into the buckets.
            self._reducer.finalize()
            self._note_next_pass()
        if self._forward_sync.due:  # whatever this forward's grad mode (DDP's rule)
            self._buffers_sync.sync_buffers()
        if not grad:
            return
        if self._rebuild_pending:
            self._maybe_rebuild()
        # Step boundaries count once the bucket order is agreed.
        if self._autotune is not None and not self._rebuild_pending:
            self._autotune.step_boundary()

    def _latch_backward_sync(self) -> None:
        """The coming backward reduces iff require_backward_grad_sync is set now."""
        sync = self._require_backward_grad_sync
        if self._gradient_owner is not None:
            self._gradient_owner.set_model_sync(sync)
        elif self._reducer is not None:
            self._reducer.set_sync_enabled(sync)

    @property
    def bucket_bytes_cap(self) -> int:
        """The bucket cap, where torch's DDPOptimizer reads it to split
        compiled graphs (compiled_model.py). It splits its first piece at
        torch's first-bucket size and refuses a smaller cap: caps below that
        (and fusion_bytes=0) split at that size."""
        return max(self._fusion_bytes, torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)

    def hand_gradients_to(self, owner) -> None:
        """From now on ``owner`` (a sharded optimizer) reduces this model's
        gradients: the C++ reducer is released (its
        hooks removed, its last pass waited for), and sync_gradients(),
        no_sync() and bucket_bytes() are the owner's. For good."""
        if self._reducer is not None:
            self._reducer.finalize()
        for h in self.__dict__.pop("_traced_hooks", []):
            h.remove()
        self._reducer = None  # the destructor removes the hooks
        self._gradient_owner = owner
        self._rebuild_pending = False
        self._autotune = None

    def hold_parameters_sharded(self, units) -> None:
        """From now on ``units`` (shard=3's ParameterUnits) gathers the
        parameters around forward, and state_dict(), load_state_dict() and
        gathered_parameters() go through it. For good."""
        self._parameter_units = units

    def gathered_parameters(self, modifier_rank: Optional[int] = 0):
        """shard=3: a context (collective) inside which every parameter holds
        its full value; on exit each rank takes back the values
        ``modifier_rank`` holds then (None: read only, a write raises)."""
        if self._parameter_units is None:
            return contextlib.nullcontext()
        return self._parameter_units.gathered_parameters(modifier_rank)

    def _maybe_rebuild(self):
        order = self._reducer.ready_order()
        if not order:
            return
        # With sync="explicit" the last pass may still be in flight (forward
        # before sync_gradients()): its results land in the old buckets, so
        # finish it first. A no-op when nothing is pending.
        self._reducer.finalize()
        # The set's first rank's order, sent as a Sum to which the others add
        # zeros rather than as a broadcast: a rank that has joined (out of
        # data, hvd.join()) adds zeros too, so the others learn that the
        # first rank is not there to say, keep their buckets, and agree again
        # at a later step, when every rank runs one.
        first = self._process_set.rank() == 0
        full = torch.tensor(complete_order(order, len(self._params)), dtype=torch.int64) + 1
        agreed = ops.allreduce(
            full if first else torch.zeros_like(full),
            op=ops.Sum,
            name=f"{self._name}.bucket_order",
            process_set=self._process_set,
        )
        if not bool(agreed.all()):
            return
        self._rebuild_pending = False
        self._order = (agreed - 1).tolist()
        self._reducer.rebuild(self._plan(self._first_bucket_bytes))

    def _set_fusion_bytes(self, fusion_bytes: int) -> None:
        """Rebuilds the buckets with a new cap (0: one gradient per bucket),
        in the agreed order. Every rank must call it at the same step
        boundary: bucket layouts must match across ranks."""
        self._reducer.finalize()  # nothing of the last pass may land in the old buckets later
        self._fusion_bytes = int(fusion_bytes)
        self._reducer.rebuild(self._plan(min(self._first_bucket_bytes, self._fusion_bytes)))

    def _plan(self, first_bucket_bytes: int):
        """The bucket layout of the current order and cap."""
        return plan_buckets(
            self._params,
            self._order,
            self._fusion_bytes,
            first_bucket_bytes,
            layer_of=self._layers,
            bucket_caps=self._bucket_caps,
        )

    def sync_gradients(self) -> None:
        """Blocks until every gradient of the last backward pass is averaged
        (needed with sync="explicit"; harmless otherwise)."""
        self._refuse_meta("sync_gradients()")
        if self._gradient_owner is not None:
            self._gradient_owner.synchronize()
            return
        self._reducer.finalize()

    def sync_and_step(self, optimizer) -> None:
        """``sync_gradients()`` then ``optimizer.step()``, overlapped: each
        bucket's parameters are stepped as soon as that bucket is averaged,
        while later buckets are still on the wire (training/bucketed_step.py).
        The result is the two calls'. It overlaps with sync="explicit" (with
        sync="backward", backward has waited already); an optimizer that
        cannot be stepped in pieces (anything but torch.optim's
        per-parameter optimizers), or a sharded optimizer that took the
        gradients over, gets the two calls."""
        reducer = self._reducer
        if reducer is None or not steps_in_pieces(type(optimizer)) or not reducer.reducing():
            self.sync_gradients()
            optimizer.step()
            return
        step_as_reduced(reducer, self._params, optimizer.step, optimizer.param_groups)

    @contextlib.contextmanager
    def no_sync(self):
        """DDP's: forwards inside (and so their backward passes) accumulate
        gradients locally, without communication, and the first backward of
        a forward after it averages the sum; it sets require_backward_grad_sync
        to False for its body. As DDP's, the forward must be inside: a
        backward inside of a forward outside reduces."""
        self._refuse_meta("no_sync()")
        old = self._require_backward_grad_sync
        self._require_backward_grad_sync = False
        try:
            yield
        finally:
            self._require_backward_grad_sync = old

    def _note_next_pass(self) -> None:
        """Traced hooks: whether the coming backward reduces (compiled_model.PassState)."""
        state = self.__dict__.get("_pass_state")
        if state is not None and self._reducer is not None:
            state.reduces = self._reducer.next_pass_reduces()

    def bucket_bytes(self):
        self._refuse_meta("bucket_bytes()")
        if self._gradient_owner is not None:
            return self._gradient_owner.bucket_bytes()
        return list(self._reducer.bucket_bytes())

    # The wrapper is transparent: keys, attributes and modes are the module's.
    # shard=3: collective, the full state gathered (``to``: the ranks that get it, None every rank).
    def state_dict(self, *args, to=None, **kwargs):
        if self._parameter_units is None:
            if to is not None:
                raise ValueError("hvdtorch: state_dict(to=...) is for shard=3 models, whose state is gathered")
            return self.module.state_dict(*args, **kwargs)
        unsupported = (["positional arguments"] if args else []) + [k for k in kwargs if k != "prefix"]
        if unsupported:
            raise ValueError(
                f"hvdtorch: state_dict() of a shard=3 model takes prefix= and to= only, not {', '.join(unsupported)}: "
                "it returns clones of the gathered parameters (no destination, no live parameters)"
            )
        return self._parameter_units.state_dict(self.module, kwargs.get("prefix", ""), to=to)

    def sharded_state_dict(self):
        """shard=3: this rank's shards and the rest of the module's state
        (local); load_state_dict() takes it back at the same rank and size, or
        every rank's in a list at any number of ranks."""
        if self._parameter_units is None:
            raise ValueError("hvdtorch: sharded_state_dict() is for shard=3 models; use state_dict()")
        return self._parameter_units.sharded_state_dict(self.module)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        if self._parameter_units is not None:
            if assign:
                raise ValueError(
                    "hvdtorch: load_state_dict(assign=True) of a shard=3 model: each rank copies its range of every "
                    "parameter into its shard; the given tensors cannot become the parameters"
                )
            return self._parameter_units.load_state_dict(self.module, state_dict, strict=strict)
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["module"], name)
