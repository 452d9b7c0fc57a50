"""The gradients a ShardedOptimizer steps on: the hand-off to its bucket
reduction, synchronize(), each shard's .grad, clip_grad_norm_() and
zero_grad().

Contract:
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
  * What a flat shard cannot step as one process would is refused, naming
    the parameters and the fix: a parameter no rank gave a gradient and a
    backward pass after synchronize() with neither step() nor zero_grad()
    between (shard=2) in _synchronize, a .grad set to None after backward
    (shard=1) in _refuse_dropped_gradients; step() refuses a .grad
    replaced after backward (shard=2).
"""

import contextlib
import itertools
import math
from typing import List

import torch

from .. import runtime
from ..collectives import ops
from ..training.pending_gradients import weak_method

# Imported under this name so the code reads which module each call goes to.
from . import join as shard_join
from .gradients import BucketGradients


class _Gradients:
    """ShardedOptimizer's gradients (a mixin; the state is
    ShardedOptimizer.__init__'s): reads _all_params, _names, _buckets,
    _shards, _name, _stage, _process_set, _rank, _size, _gather_in_place,
    _joined and _joined_fold; keeps _grads, _synchronized, _reduced,
    _should_synchronize and _no_gradients, and each shard's .grad; announces
    through _announce (join_phases.py)."""

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
