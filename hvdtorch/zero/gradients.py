"""How a sharded optimizer's gradients travel: flat buckets reduced while
backward runs, for shard=2 into each rank's shard's averaged gradient only
(by reduce-scatter, or in place: see in_place below), for shard=1 by
all-reduce (every rank receives the whole average, as unsharded training
does).

Contract (Horovod's DistributedOptimizer contract, training/gradient_sync.py, with
buckets of the shard layout; passes are counted by the gradient core's pass
counter, _C.PassCounter, as on every gradient path):
  * Gradients are reduced once every ``backward_passes_per_step`` (k)
    counted backward passes; the passes in between, and every pass inside
    no_sync(), accumulate locally in .grad. A (k+1)-th counted pass before
    synchronize() raises AssertionError in that backward, before it touches
    .grad.
  * In a reduced pass, a post-accumulate hook counts each parameter in; a
    bucket whose parameters are all in is flattened and launched at once,
    while backward goes on. The end of the pass (a callback queued on the
    autograd engine) launches the rest: a parameter without a gradient
    contributes what its .grad holds, zeros when it has none. So every rank
    launches every bucket, under the same name, whatever its graph was.
  * synchronize() returns every bucket's result: after the k-th pass by
    waiting for what backward launched, earlier (fewer passes, or none) by
    reducing what .grad holds now, zeros included. That is how a rank with
    no batch left takes part in a step.
  * Each bucket has a persistent flat buffer that is reduced: a .grad is
    copied into it, unless it already is a view of its slot (the optimizer's
    zero_grad() makes it one: view_gradients), so that backward accumulates
    into the bucket in place. shard=2 then drops each parameter's .grad
    (only the shard's average comes back); all-reduce makes each .grad a
    view of the reduced flat bucket.
  * in_place (every rank on one host, registered memory: the optimizer
    decides, alike on every rank): the flat buffers live in registered
    memory and are all-reduced in place by the node reducer, which reads
    the peers' buffers and writes each reduced slice straight back (no copy
    in or out, nothing allocated per step); shard=2 then returns a view of
    this rank's range of the reduced bucket. The buffer is all the memory
    it takes, where the engine's reduce-scatter copies the bucket into its
    fusion buffer (which keeps the size of the largest bucket), through the
    node arena, and into an output it allocates each step. Otherwise
    shard=2 reduce-scatters (between hosts it moves half the bytes of an
    all-reduce).
  * Compression.fp16 flattens float32/float64 buckets into float16 (the wire
    dtype) and converts the result back to the parameters' dtype; 16-bit
    floats go as they are (the gradient core's codec rule,
    compression.wire_dtype).
  * Sparse gradients are refused (ValueError naming the parameter): a flat
    bucket is dense.
"""

import contextlib
import weakref
from typing import List, Optional, Sequence

import torch

from .. import _C, runtime
from ..collectives import ops, reducescatter
from ..collectives.compression import Compression, wire_dtype
from .layout import Bucket


def _on_pre(owner_ref, index: int, grads) -> None:
    owner = owner_ref()  # the hooks must not keep the optimizer alive
    if owner is not None:
        owner.on_grad(index, grads)


def _on_ready(owner_ref, index: int) -> None:
    owner = owner_ref()
    if owner is not None:
        owner.on_ready(index)


def _remove_hooks(handles) -> None:
    for h in handles:
        h.remove()


class BucketGradients:
    def __init__(
        self,
        params: Sequence[torch.Tensor],
        names: Sequence[str],
        buckets: Sequence[Bucket],
        name: str,
        scatter: bool,
        op: int,
        prescale: float,
        postscale: float,
        compression,
        backward_passes_per_step: int,
        process_set,
        in_place: bool = False,
    ):
        """``params[i]`` is the parameter numbered i in the buckets' ``params``
        (None for parameters no bucket holds). ``in_place``: see the top; the
        same on every rank."""
        # The shared pass counter (csrc/core/gradients/pass_counter.h), strict; no_sync() sets it local.
        self._counter = _C.PassCounter(
            int(backward_passes_per_step),
            strict=True,
            rank=runtime.rank(),
            advice="accumulate inside optimizer.no_sync()",
        )
        self._params = params
        self._names = names
        self._buckets = list(buckets)
        self._name = name
        self._scatter = scatter
        self._op, self._prescale, self._postscale = op, prescale, postscale
        self._compression = compression
        self._process_set = process_set
        self._size = process_set.size()
        self._in_place = bool(in_place) and self._size > 1
        self._bucket_of = {i: j for j, b in enumerate(self._buckets) for i in b.params}
        self._reducing = False  # this pass reduces (the k-th counted one) and has not ended
        self._waiting: List[int] = []  # parameters not ready yet, per bucket
        self._started: List[Optional[tuple]] = [None] * len(self._buckets)
        # Per bucket, allocated once: what is reduced (in the wire dtype), in place for all-reduce.
        self._flats: List[Optional[torch.Tensor]] = [None] * len(self._buckets)
        me = weakref.ref(self)
        indices = sorted(self._bucket_of)
        with torch.enable_grad():
            self._accumulators = [params[i].view_as(params[i]).grad_fn.next_functions[0][0] for i in indices]
        handles = [
            acc.register_prehook(lambda grads, i=i: _on_pre(me, i, grads))
            for i, acc in zip(indices, self._accumulators)
        ]
        handles += [params[i].register_post_accumulate_grad_hook(lambda _p, i=i: _on_ready(me, i)) for i in indices]
        weakref.finalize(self, _remove_hooks, handles)

    # ---- during backward ----------------------------------------------------

    def on_grad(self, index: int, grads) -> None:
        """Runs before parameter ``index`` accumulates ``grads[0]``."""
        if not self._counter.in_pass:
            self._begin_pass()
        if grads[0] is not None and grads[0].layout != torch.strided:
            raise ValueError(
                f"hvdtorch: rank {runtime.rank()}: parameter '{self._names[index]}' got a sparse gradient; a "
                "sharded optimizer reduces flat dense buckets: use sparse=False, or hvd.DistributedOptimizer "
                "without shard= (it all-gathers sparse gradients)"
            )

    def _begin_pass(self) -> None:
        self._counter.set_rank(runtime.rank())  # named by the error; an elastic job may renumber ranks
        self._reducing = self._counter.begin_pass()  # AssertionError on a (k+1)-th counted pass
        torch.autograd.Variable._execution_engine.queue_callback(self._end_pass)
        if self._reducing:
            self._waiting = [len(b.params) for b in self._buckets]

    def on_ready(self, index: int) -> None:
        """Runs once parameter ``index``'s .grad holds this pass's gradient."""
        if not self._reducing:
            return
        j = self._bucket_of[index]
        self._waiting[j] -= 1
        if self._waiting[j] == 0 and self._started[j] is None:
            self._launch(j)

    def _end_pass(self) -> None:
        self._counter.end_pass()
        if self._reducing:
            self._reducing = False
            for j in range(len(self._buckets)):
                if self._started[j] is None:
                    self._launch(j)

    # ---- launching and waiting ------------------------------------------------

    def _flat(self, j: int) -> torch.Tensor:
        """Bucket j's persistent flat buffer, allocated on first use."""
        b = self._buckets[j]
        flat = self._flats[j]
        if flat is None:
            # The codec's wire dtype (the gradient core's one rule, csrc/core/gradients/wire_codec.h).
            wire = wire_dtype("fp16", b.dtype) if self._compression is Compression.fp16 else b.dtype
            device = self._params[b.params[0]].device
            if (self._in_place or not self._scatter) and device.type == "cpu" and self._size > 1:
                # An all-reduced bucket in registered memory takes the engine's zero-copy path, as
                # DistributedModel's buckets do (the engine's reduce-scatter copies its input into
                # the fusion buffer whatever memory it is in).
                flat = runtime.state().engine.registered_zeros(b.numel, wire)
            else:
                flat = torch.zeros(b.numel, dtype=wire, device=device)
            self._flats[j] = flat
        return flat

    def _flatten(self, j: int) -> torch.Tensor:
        """Bucket j's gradients in its persistent flat buffer (a .grad that is
        already a view of its slot is there: nothing to copy)."""
        b = self._buckets[j]
        flat = self._flat(j)
        for i, offset in zip(b.params, b.offsets):
            p = self._params[i]
            piece = flat[offset : offset + p.numel()]
            g = p.grad
            if g is None:
                piece.zero_()
            elif not (g.dtype == piece.dtype and g.data_ptr() == piece.data_ptr() and g.is_contiguous()):
                piece.copy_(g.reshape(-1))
            if self._scatter:
                p.grad = None  # its average comes back as part of this rank's shard only
        return flat

    def view_gradients_from_the_start(self) -> None:
        """Before the first backward (no parameter has a .grad yet): allocates
        every bucket's buffer and makes each .grad a view of its slot, so
        that the first backward, too, accumulates in place. Otherwise it
        allocates every gradient beside the buckets, and shard=1, which keeps
        them until the buckets are reduced, peaks a model's gradients higher
        in its first step."""
        if any(self._params[i].grad is not None for b in self._buckets for i in b.params):
            return
        for j in range(len(self._buckets)):
            self._flat(j)
        self.view_gradients()

    def view_gradients(self) -> None:
        """Zeroes the buckets and makes every .grad a view of its slot, so that
        the next backward accumulates in place (no allocation, no copy into the
        bucket). Only between steps; a bucket whose dtype differs from its
        parameters' (fp16 compression) is left alone."""
        for j, b in enumerate(self._buckets):
            flat = self._flats[j]
            if flat is None or flat.dtype != b.dtype or self._started[j] is not None:
                continue
            flat.zero_()
            for i, offset, shape in zip(b.params, b.offsets, b.shapes):
                p = self._params[i]
                p.grad = flat[offset : offset + p.numel()].view(shape)

    def _launch(self, j: int) -> None:
        flat = self._flatten(j)
        if self._size == 1:
            self._started[j] = (None, flat)
            return
        scatter = self._scatter and not self._in_place
        name = f"{self._name}.{'reducescatter' if scatter else 'allreduce'}.{j}"
        common = dict(op=self._op, prescale_factor=self._prescale, postscale_factor=self._postscale)
        if scatter:
            h = reducescatter.reducescatter_async(flat, name=name, process_set=self._process_set, **common)
        elif self._in_place:
            h = ops.registered_allreduce_async_(flat, name, process_set=self._process_set, **common)
        else:
            h = ops.allreduce_async_(flat, name=name, process_set=self._process_set, **common)
        self._started[j] = (h, flat)

    def _result(self, j: int) -> torch.Tensor:
        handle, flat = self._started[j]
        self._started[j] = None
        if handle is None:  # alone in the set: nothing to reduce with, the scale factors still apply
            scale = self._prescale * self._postscale
            out = flat.mul_(scale) if scale != 1.0 else flat
        else:
            out = ops.synchronize(handle)
        b = self._buckets[j]
        if self._scatter and self._in_place:
            start, end = b.shard_range(self._process_set.rank(), self._size)
            out = out[start:end]  # a view: this rank's shard of the reduced bucket
        out = out.to(b.dtype)
        if not self._scatter:
            for i, offset, shape in zip(b.params, b.offsets, b.shapes):
                n = self._params[i].numel()
                self._params[i].grad = out[offset : offset + n].view(shape)
        return out

    # ---- between backward and step -----------------------------------------

    def pending(self) -> bool:
        """A counted backward pass ran since the last synchronize()."""
        return self._counter.pending()

    def synchronize(self) -> List[torch.Tensor]:
        """Every bucket's reduced gradient: this rank's shard (shard=2; a view
        of the flat buffer when in place) or the whole flat bucket (shard=1),
        in the parameters' dtype."""
        if not (self._counter.due() and all(s is not None for s in self._started)):
            for j in range(len(self._buckets)):
                if self._started[j] is None:
                    self._launch(j)
        results = [self._result(j) for j in range(len(self._buckets))]
        self._counter.reset()
        return results

    def reset(self, backward_passes_per_step: Optional[int] = None) -> None:
        """Forgets the passes counted so far; reductions backward launched
        are waited for (every rank launched them) and dropped."""
        for j in range(len(self._buckets)):
            if self._started[j] is not None:
                self._result(j)
        self._counter.reset(None if backward_passes_per_step is None else int(backward_passes_per_step))

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate locally and are not counted."""
        self._counter.local = True
        try:
            yield
        finally:
            self._counter.local = False
