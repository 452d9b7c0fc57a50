"""How a sharded optimizer's gradients travel: flat buckets reduced while
backward runs, for shard=2 into each rank's shard's averaged gradient only
(by reduce-scatter, or in place: see in_place below), for shard=1 by
all-reduce (every rank receives the whole average, as unsharded training
does).

A thin front over the gradient core's reducer (_C.GradientReducer,
csrc/torch/grad_reducer.h), which does the hooks, the flat buffers, the
launching and the waiting, with the bucket strategy (csrc/torch/
strategies/) that fits: allreduce_views (shard=1), in_place_shard or
reduce_scatter_shard (shard=2). The buckets are the shard layout's
(zero/layout.py): the reducer packs them at the same offsets and its shard
strategies cut the same ranges (one rule each, csrc/core/gradients/
bucket_packing.h and shard_range.h).

Contract (Horovod's DistributedOptimizer contract, training/gradient_sync.py, with
buckets of the shard layout; passes are counted by the gradient core's pass
counter, _C.PassCounter, here the one the reducer is given):
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
    (only the shard's average comes back); all-reduce leaves each .grad the
    view of the reduced flat bucket it was (with fp16 on the wire, the
    average is converted into each .grad).
  * in_place (every rank on one host, registered memory: the optimizer
    decides, alike on every rank): the flat buffers live in registered
    memory and are all-reduced in place (by the node reducer, which the
    engine picks for registered buffers unless the job names another), never fused
    (shard=1 too), which reads
    the peers' buffers and writes each reduced slice straight back (no copy
    in or out, nothing allocated per step); shard=2 then returns a view of
    this rank's range of the reduced bucket. The buffer is all the memory
    it takes, where the engine's reduce-scatter copies the bucket into its
    fusion buffer (which keeps the size of the largest bucket), through the
    node arena, and into an output it allocates each step. Otherwise
    shard=2 reduce-scatters (between hosts it moves half the bytes of an
    all-reduce).
  * transient (shard=3): the reducer releases its buckets
    (GradientReducerOptions.release_buckets, csrc/torch/bucket_set.h): a
    bucket's buffer exists from the first gradient written into it in a
    pass until its reduce-scatter is done (taken as soon as it is, while
    backward goes on), so that a rank keeps its shards of the gradients and
    the buckets still in flight only. Always reduce-scattered: registered
    buffers are kept for good.
  * Accumulation with transient buckets. Holding a pass's gradients
    locally would hold the whole gradient, which shard=3 promises not to.
    So every pass is reduce-scattered as it ends, also the passes that
    would only accumulate elsewhere (no_sync(), DDP's
    require_backward_grad_sync=False, the first k-1 of
    backward_passes_per_step), and the results are added up in this
    rank's shards (fold(): at the next forward, via the optimizer's pass
    announcement, and at synchronize()). The sum of the per-pass averages
    is the average of the sums: the same result, in k reduce-scatters
    instead of one. Every rank must then run the same number of backward
    passes per step (each is a collective); the reducer's own counter is
    strict at one pass between folds, and this class counts the passes
    against backward_passes_per_step (AssertionError on the (k+1)-th
    counted one, as the other stages raise).
  * Compression.fp16 flattens float32/float64 buckets into float16 (the wire
    dtype) and converts the result back to the parameters' dtype; 16-bit
    floats go as they are (the gradient core's codec rule,
    compression.wire_dtype).
  * Sparse gradients are refused (ValueError naming the parameter): a flat
    bucket is dense.
  * shard=1: from the end of a reduced pass until synchronize(), .grad
    holds stand-ins whose first use (torch.nn.utils.clip_grad_norm_ on the
    model's parameters, GradScaler.unscale_, a norm for the log) finishes
    the reduction through the optimizer's synchronize() and then acts on
    the average, as under DDP (training/pending_gradients.py); a gradient
    changed in place through a reference taken before the end of backward
    is an error at synchronize() naming the parameters and the fix
    (training/gradient_marks.py), as in training/gradient_sync.py. shard=2
    frees .grad: from the end of a reduced pass until step() or zero_grad()
    a stand-in in .grad raises on any use, naming the fix
    (zero/held_gradients.py), where torch's clipping would otherwise find
    no gradient and silently do nothing.
"""

import contextlib
import weakref
from typing import Callable, List, Optional, Sequence

import torch

from .. import _C, runtime
from ..collectives.handles import check_process_set
from ..training.gradient_marks import GradientMarks
from ..training.gradient_sync import remove_hooks
from ..training.pending_gradients import PendingGradients, weak_method
from ..training.reducer_options import reducer_options
from .held_gradients import HeldGradients
from .layout import Bucket

_SPARSE_REFUSAL = (
    "a sharded optimizer reduces flat dense buckets: use sparse=False, or hvd.DistributedOptimizer "
    "without shard= (it all-gathers sparse gradients)"
)


def _pass_ran(marks_ref) -> None:
    marks = marks_ref()
    if marks is not None:
        marks.note_after_pass()


def _nothing() -> None:
    pass


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
        settle: Optional[Callable[[], None]] = None,
        transient: bool = False,
        codec: Optional[str] = None,
    ):
        """``params[i]`` is the parameter numbered i in the buckets' ``params``
        (None for parameters no bucket holds). ``in_place``: see the top; the
        same on every rank. ``settle`` (shard=1): the optimizer's
        synchronize(), run when a stand-in in .grad is used (it must not keep
        the optimizer alive). ``transient`` (shard=3): see the top.
        ``codec``: the wire codec by name, where a mixed-precision policy
        decides it (else ``compression``'s)."""
        # transient: each pass reduced as it ends and folded into the shards (see the top).
        self._transient = bool(transient) and bool(scatter)
        self._k = int(backward_passes_per_step)
        self._counted = 0  # transient: counted passes since the step
        self._acc: Optional[List[torch.Tensor]] = None  # transient: the folded passes' shard results
        self._acc_unused: Optional[set] = None  # transient: parameters unused in every folded pass
        self._last_unused: List[int] = []
        self._model_sync = True  # the model's require_backward_grad_sync at its last training forward
        self._no_sync_depth = 0  # optimizer.no_sync() bodies open
        # The one pass counter of this path (csrc/core/gradients/pass_counter.h), strict, given to the reducer.
        self._counter = _C.PassCounter(
            1 if self._transient else self._k,
            strict=True,
            rank=runtime.rank(),
            advice=(
                "run a forward through the model before each backward pass (shard=3 reduce-scatters each pass "
                "as it ends and takes it in at the next forward)"
                if self._transient
                else "accumulate inside optimizer.no_sync()"
            ),
        )
        self._shard_of = [
            b.shard_range(process_set.rank(), process_set.size()) for b in buckets
        ]  # (start, end) per bucket: the zeros of a synchronize() that reduces nothing
        self._buckets = list(buckets)
        self._params = params
        order = [i for b in self._buckets for i in b.params]  # the reducer's parameters, bucket by bucket
        layout, start = [], 0
        for b in self._buckets:
            layout.append(list(range(start, start + len(b.params))))
            start += len(b.params)
        in_place = bool(in_place) and process_set.size() > 1
        if not scatter:
            strategy = "allreduce_views"
        else:
            strategy = "in_place_shard" if in_place else "reduce_scatter_shard"
        self._reducer = _C.GradientReducer(
            runtime.state().engine,
            [params[i] for i in order],
            layout,
            reducer_options(
                compression=compression,
                codec=codec,  # a mixed-precision policy's reduce dtype (training/mixed_precision.py)
                name=name,
                reducer="",  # the job's: in place, the engine gives registered buckets its registered reducer
                op=op,
                prescale=float(prescale),
                postscale=float(postscale),
                sync_on_backward=False,  # synchronize() waits
                fuse=not in_place,  # fused: through the fusion buffer, which would grow to a bucket for good
                backward_passes_per_step=1 if self._transient else self._k,
                process_set_id=check_process_set(process_set),
                strategy=strategy,
                param_names=[names[i] for i in order],
                sparse_refusal=_SPARSE_REFUSAL,
                release_buckets=bool(transient) and scatter,
                unused="report",  # the optimizer refuses a parameter no rank gave a gradient (optimizer_gradients.py)
            ),
            counter=self._counter,
        )
        # shard=1: stand-ins in .grad until the reduction is finished; a change through an older reference is
        # an error (see the top).
        held = [params[i] for i in order]
        held_names = [names[i] for i in order]
        self._held_names = held_names  # the reducer's order
        self._pending = None
        if not scatter:
            self._pending = PendingGradients(held, held_names, self._counter, settle or _nothing)
            # Put back when the next pass begins, before it accumulates into .grad.
            self._reducer.set_pass_callbacks(weak_method(self._pending, "restore"), _nothing)
        self._devices = [params[b.params[0]].device for b in self._buckets]
        self._dtypes = [params[b.params[0]].dtype for b in self._buckets]
        self._marks = GradientMarks(
            held,
            held_names,
            "that races with the reduction. Clip with optimizer.clip_grad_norm_(max_norm) (it reduces first), or "
            "call optimizer.synchronize() first, then change the gradients, then call optimizer.step() inside "
            "`with optimizer.skip_synchronize():`",
            after_note=None if scatter else weak_method(self._pending, "place_after_pass"),
        )
        if not scatter:
            marks = weakref.ref(self._marks)
            handles = [p.register_post_accumulate_grad_hook(lambda p, m=marks: _pass_ran(m)) for p in held]
            weakref.finalize(self, remove_hooks, handles)
        # shard=2 drops each .grad: stand-ins say why (see the top).
        self._held = HeldGradients(held, [names[i] for i in order]) if scatter else None
        if scatter:
            self._reducer.set_pass_callbacks(weak_method(self, "_pass_begins"), weak_method(self._held, "place"))

    def _pass_begins(self) -> None:
        """The reducer's callback as a backward pass begins, before it accumulates into .grad."""
        self._held.remove()
        if not self._transient or not self._model_sync or self._no_sync_depth:
            return
        self._counted += 1
        if self._counted > self._k:
            self._counted = self._k
            raise AssertionError(
                f"hvdtorch: rank {runtime.rank()}: backward pass {self._k + 1} since the last step() with "
                f"backward_passes_per_step={self._k}: call optimizer.step() (or synchronize()) after every "
                f"{self._k} backward passes, or accumulate more inside no_sync() (or "
                "model.require_backward_grad_sync = False)"
            )

    @property
    def _flats(self) -> List[torch.Tensor]:
        """Every bucket's persistent flat buffer (in the wire dtype)."""
        return self._reducer.flats()

    def view_gradients_from_the_start(self) -> None:
        """Before the first backward (no parameter has a .grad yet): makes
        each .grad a view of its slot, so that the first backward, too,
        accumulates in place. Otherwise autograd allocates each gradient of
        the first backward and the reducer's hook copies it into its slot
        (and makes .grad the view, freeing it)."""
        if any(self._params[i].grad is not None for b in self._buckets for i in b.params):
            return
        self._reducer.view_gradients()

    def view_gradients(self) -> None:
        """Zeroes the buckets and makes every .grad a view of its slot, so that
        the next backward accumulates in place (no allocation, no copy into the
        bucket). Only between steps; a bucket whose dtype differs from its
        parameters' (fp16 compression) or released (transient) is left
        alone."""
        self._reducer.view_gradients()

    def unused_everywhere(self) -> List[str]:
        """After synchronize(): the names of the parameters no rank gave a
        gradient since the step before (the reducer's flags, unused="report";
        transient: in none of the passes folded)."""
        indices = self._last_unused if self._transient else self._reducer.unused_everywhere()
        return [self._held_names[i] for i in indices]

    def parameter_count(self) -> int:
        return len(self._held_names)

    def pending(self) -> bool:
        """A counted backward pass ran since the last synchronize()."""
        return self._counter.pending()

    def synchronize(self, fold: Optional[bool] = None) -> List[torch.Tensor]:
        """Every bucket's reduced gradient: this rank's shard (shard=2; a view
        of the flat buffer when in place) or the whole flat bucket (shard=1),
        in the parameters' dtype. transient: the sum of the folded passes,
        after folding the last one when ``fold`` (default will_fold(); a
        joined rank is told by the announcement)."""
        self.restore_pending()
        self._marks.check()
        if not self._transient:
            return self._reducer.synchronize()
        if self.will_fold() if fold is None else fold:
            self.fold()
        out = self._acc if self._acc is not None else self._zeros()
        self._last_unused = sorted(self._acc_unused) if self._acc_unused is not None else []
        self._acc, self._acc_unused, self._counted = None, None, 0
        return out

    def will_fold(self) -> bool:
        """transient: whether synchronize() reduces (a pass ended and is not
        taken in yet, or none ran since the step: then zeros are reduced, so
        that this rank takes part in the others' reduction)."""
        return self._transient and (self._counter.pending() or self._acc is None)

    def folds_at_forward(self) -> bool:
        """transient: a pass ended that the next forward takes in."""
        return self._transient and self._counter.pending()

    def fold(self) -> None:
        """transient: waits for the last pass's reduce-scatters (a rank that
        ran none reduces zeros) and adds them to the shards' sum."""
        results = self._reducer.synchronize()
        unused = set(self._reducer.unused_everywhere())
        self._acc_unused = unused if self._acc_unused is None else self._acc_unused & unused
        if self._acc is None:
            self._acc = list(results)
            return
        with torch.no_grad():
            for acc, r in zip(self._acc, results):
                acc.add_(r)

    def _zeros(self) -> List[torch.Tensor]:
        return [
            torch.zeros(end - start, dtype=dtype, device=device)
            for (start, end), dtype, device in zip(self._shard_of, self._dtypes, self._devices)
        ]

    def drop_accumulated(self) -> None:
        """transient: zero_grad() drops what the folded passes added up."""
        self._acc, self._acc_unused, self._counted = None, None, 0

    def restore_pending(self) -> None:
        """shard=1: the stand-ins in .grad back to the real gradients (synchronize(), the next pass)."""
        if self._pending is not None:
            self._pending.restore()

    def replaced_held(self) -> List[str]:
        """shard=2/3: parameters whose stand-in in .grad the user replaced (held_gradients.py)."""
        return self._held.replaced() if self._held is not None else []

    def remove_held(self) -> None:
        """shard=2: the stand-ins in .grad back to None (step(), zero_grad())."""
        if self._held is not None:
            self._held.remove()

    def reset(self, backward_passes_per_step: Optional[int] = None) -> None:
        """Forgets the passes counted so far; reductions backward launched
        are waited for (every rank launched them) and dropped."""
        self.remove_held()
        self.restore_pending()
        self._reducer.finalize()
        self._marks.forget()
        if backward_passes_per_step is not None:
            self._k = int(backward_passes_per_step)
        self.drop_accumulated()
        self._counter.reset(None if backward_passes_per_step is None or self._transient else self._k)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate locally and are not counted
        (transient: reduced as they end all the same, see the top)."""
        self._no_sync_depth += 1
        self._apply_sync()
        try:
            yield
        finally:
            self._no_sync_depth -= 1
            self._apply_sync()

    def set_model_sync(self, sync: bool) -> None:
        """The model's require_backward_grad_sync at a training forward: the
        coming backward accumulates locally (uncounted) when False, as inside
        no_sync()."""
        self._model_sync = bool(sync)
        self._apply_sync()

    def _apply_sync(self) -> None:
        if not self._transient:  # transient: every pass is reduced (see the top)
            self._reducer.set_sync_enabled(self._model_sync and not self._no_sync_depth)
