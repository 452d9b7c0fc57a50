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

This file holds DistributedModel's construction (__init__, which checks the
arguments and builds the rest in order), its buckets (the rebuild in the
agreed order, the cap autotune sets), the gradients (sync_gradients(),
sync_and_step(), the hand-over to a sharded optimizer), the checks of the
module it is given and owner_of (the model that reduces a parameter). Its
other jobs are mixins or helpers, each in a file of its own:
  model_forward.py       forward() and what runs around it; require_backward_grad_sync, no_sync()
  model_state_dicts.py   state_dict(), load_state_dict(), gathered_parameters(), the module's attributes
  sharded_claims.py      which parameters a live sharded optimizer steps, and the refusal of another front
claim_for_sharding and refuse_if_sharded are importable from here too.
"""

import itertools
import weakref
from typing import Optional

import torch

from .. import _C, autotune, runtime
from ..collectives import ops
from ..collectives.compression import Compression, check_bucket_compression
from ..collectives.handles import check_process_set
from ..collectives.powersgd import is_powersgd
from .bucketed_step import step_as_reduced, steps_in_pieces
from .buckets import complete_order, layers_by_name, plan_buckets
from .buffer_sync import BufferSync, ForwardSyncRule
from .coming_from_ddp import ddp_arguments
from .mixed_precision import as_policy, cast_buffers
from .model_forward import _ModelForward
from .model_state_dicts import _ModelStateDicts
from .reducer_options import reducer_options
from .sharded_claims import claim_for_sharding as claim_for_sharding
from .sharded_claims import refuse_if_sharded as refuse_if_sharded
from .sharded_claims import sharded_stepper
from .step_marks import StepMarks

_instance_ids = itertools.count()

# id(parameter) -> the live DistributedModel that reduces its gradient, so
# that a sharded optimizer over those parameters finds the model (owner_of).
_models_by_param = weakref.WeakValueDictionary()


def owner_of(param: torch.Tensor) -> Optional["DistributedModel"]:
    """The DistributedModel whose hooks reduce ``param``'s gradient, if any."""
    return _models_by_param.get(id(param))


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


class DistributedModel(_ModelForward, _ModelStateDicts, torch.nn.Module):
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

    def _refuse_meta(self, what: str) -> None:
        """A model built on the meta device, before shard=3 has made its shards."""
        if self._built_on_meta and self._gradient_owner is None:
            raise ValueError(
                f"hvdtorch: DistributedModel '{self._name}': {what}: the module was built on the meta device, "
                "so its parameters hold no values yet: hvd.DistributedOptimizer(opt, shard=3, model=model) "
                "makes each rank's shards from it, module by module (docs/guide.md, 'Sharded parameters'), or "
                "materialize it before wrapping (module.to_empty(device=...) and its init)"
            )

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

    def bucket_bytes(self):
        self._refuse_meta("bucket_bytes()")
        if self._gradient_owner is not None:
            return self._gradient_owner.bucket_bytes()
        return list(self._reducer.bucket_bytes())
