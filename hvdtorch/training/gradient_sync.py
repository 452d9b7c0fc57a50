"""When and how DistributedOptimizer's gradients are reduced: Horovod's
contract, built on the C++ GradientReducer for dense gradients.

Contract (the same as Horovod's DistributedOptimizer):
  * Gradients are reduced once every ``backward_passes_per_step`` (k)
    backward passes; the passes in between accumulate locally. A (k+1)-th
    pass before synchronize()/step() raises AssertionError during that
    backward, before it touches .grad.
  * synchronize() returns with every gradient reduced: after the k-th pass by
    waiting for the reductions backward launched, earlier (fewer passes, or
    none: a second step()) by reducing what .grad holds now. A parameter
    without a gradient contributes zeros; one no rank gave a gradient keeps
    .grad None, as in one process (Horovod gives it zeros): the reducer's
    unused="leave" (csrc/torch/grad_reducer.h).
  * zero_grad() after a backward pass and before synchronize() raises
    AssertionError: it would discard gradients other ranks are reducing.
  * Between the end of the reducing pass and synchronize(), .grad holds
    stand-ins (training/pending_gradients.py): the first use of any
    (torch.nn.utils.clip_grad_norm_, GradScaler.unscale_, a norm for the
    log, the inner optimizer's step() inside skip_synchronize()) finishes
    the reduction, and it and every later use act on the average, as under
    DDP; step() then steps on it without reducing again (and without
    Horovod's warning). An explicit synchronize() after that returns at
    once. Code that leaves .grad alone keeps step()'s overlap.
  * A gradient changed in place through a reference taken before the end of
    backward (a .grad kept from an earlier step) is an error at
    synchronize(), naming the parameters: it raced with the reduction in
    flight. The fix, named in the message: optimizer.synchronize() first,
    then change the gradients, then step() inside
    optimizer.skip_synchronize().
  * Sparse gradients (nn.Embedding(sparse=True)) are reduced at
    synchronize() by all-gathering indices and values (collectives/sparse.py); with
    sparse_as_dense they are densified as they arrive, reduced with the dense
    ones, and made sparse again afterwards.

How:
  * A pre-hook on each parameter's gradient accumulator runs before the
    gradient is accumulated into .grad and before the C++ reducer's hooks on
    the same parameter. The first one of a backward pass counts the pass with
    the path's one pass counter (_C.PassCounter, which rejects an extra one
    while .grad is still untouched); the C++ reducer is given the same
    counter and reduces the pass it says reduces. A callback queued on the
    autograd engine marks the end of the pass; after every callback of a
    reducing pass, the gradients are noted (gradient_marks.py) and the
    stand-ins placed. torch.autograd.grad() does not accumulate and so
    counts no pass.
  * With sparse_as_dense, a post-accumulate-grad hook (which also runs
    before the C++ reducer's hook) replaces a sparse .grad by its dense form
    (a pre-hook may not change the layout of a gradient).
  * Which parameters have sparse gradients is learnt in the first step:
    until the first synchronize() there is no C++ reducer; in it all ranks
    agree (one all-reduce) on which parameters were sparse on any rank, and
    the C++ reducer is built over the others and reduces that step. Dense
    gradients have no other path: from the second step on their reduction
    overlaps backward, and fewer passes (or none) are the reducer's too. A
    gradient that turns sparse later, in a parameter reduced densely, is an
    error naming the parameter.
"""

import weakref
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .. import _C, runtime
from ..collectives import sparse
from ..collectives.handles import check_process_set
from ..collectives.powersgd import is_powersgd
from .bucketed_step import step_as_reduced
from .compiled_model import refuse_compiled_autograd
from .gradient_marks import GradientMarks
from .pending_gradients import PendingGradients, weak_method
from .reducer_options import reducer_options


def _on_grad(sync_ref, index: int, grads) -> None:
    sync = sync_ref()  # the hooks must not keep the optimizer alive
    if sync is not None:
        sync.on_grad(index, grads)


def _on_accumulated(sync_ref, index: int, param: torch.Tensor) -> None:
    sync = sync_ref()
    if sync is not None:
        sync.densify(index, param)


# id(parameter) -> the live GradientSync whose hooks reduce its gradient
# (take_over).
_syncs_by_param = weakref.WeakValueDictionary()


def take_over(params, names, sync) -> None:
    """Makes ``sync`` (a GradientSync, or the Adasum optimizer: anything with
    release(name)) the one DistributedOptimizer reducing ``params``: one
    made earlier over any of them, still alive (``opt = DistributedOptimizer(...)``
    again, the old one still bound while the new one is built), lets them go
    (GradientSync.release): two would reduce each gradient twice and race
    over .grad. The old one raises if it is used afterwards. ``sync`` None:
    a sharded optimizer takes them (zero/optimizer.py); it is not kept here,
    as nothing takes parameters over from it
    (sharded_claims.refuse_if_sharded)."""
    for p, name in zip(params, names):
        old = _syncs_by_param.pop(id(p), None)
        if old is not None and old is not sync:
            old.release(name)
        if sync is not None:
            _syncs_by_param[id(p)] = sync


def remove_hooks(handles) -> None:
    """Removes hook handles (a weakref.finalize target: holds no owner)."""
    for h in handles:
        h.remove()


class GradientSync:
    def __init__(
        self,
        params: Sequence[torch.Tensor],
        names: Sequence[str],
        name: str,
        op: int,
        prescale: float,
        postscale: float,
        compression,
        backward_passes_per_step: int,
        sparse_as_dense: bool,
        plan_layout: Callable[[List[torch.Tensor], int], List[List[int]]],
        fusion_bytes: int,
        reducer: Optional[str],
        process_set,
    ):
        # The path's one pass counter (csrc/core/gradients/pass_counter.h): strict, Horovod's contract;
        # the C++ reducer is given it.
        self._counter = _C.PassCounter(int(backward_passes_per_step), strict=True, rank=runtime.rank())
        self._params = list(params)
        self._names = list(names)
        self._released = ""  # the parameter a newer DistributedOptimizer took over (release())
        self._name = name
        self._op, self._prescale, self._postscale = op, prescale, postscale
        self._compression = compression
        self._sparse_as_dense = sparse_as_dense
        self._plan_layout = plan_layout  # (dense parameters, fusion bytes) -> bucket layout
        self._fusion_bytes = int(fusion_bytes)
        self._fuse = self._fusion_bytes > 0  # fixed: autotune may change the cap, not whether buckets fuse
        self._reducer_kind = reducer or ""
        self._process_set = process_set  # an added set this rank is in, of more than one rank
        self._reducer = None
        self._sparse_dims: Optional[List[int]] = None  # per parameter after the first step; 0: dense
        self._dense: List[int] = []
        self._sparse: List[int] = []
        # sparse_as_dense: parameter -> sparse_dim its gradient had when it
        # came sparse (in any step so far); made sparse again after reduction.
        self._densified: Dict[int, int] = {}
        # .grad between a reducing pass and synchronize(): stand-ins that finish the reduction when used
        # (pending_gradients.py); a change through an older reference is an error (gradient_marks.py).
        self._pending = PendingGradients(
            self._params, self._names, self._counter, weak_method(self, "settle"), weak_method(self, "unused")
        )
        self._settled = False  # a use of a stand-in finished the reduction of the passes so far
        self._marks = GradientMarks(
            self._params,
            self._names,
            "that races with the reduction. Call optimizer.synchronize() first, then change the gradients, then "
            "call optimizer.step() inside `with optimizer.skip_synchronize():`",
            after_note=weak_method(self._pending, "place_after_pass"),
        )
        me = weakref.ref(self)
        # Held so that the accumulators, and the hooks on them, live as long as this.
        with torch.enable_grad():
            self._accumulators = [p.view_as(p).grad_fn.next_functions[0][0] for p in self._params]
        handles = [
            acc.register_prehook(lambda grads, i=i: _on_grad(me, i, grads)) for i, acc in enumerate(self._accumulators)
        ]
        if sparse_as_dense:
            handles += [
                p.register_post_accumulate_grad_hook(lambda p, i=i: _on_accumulated(me, i, p))
                for i, p in enumerate(self._params)
            ]
        self._remove_hooks = weakref.finalize(self, remove_hooks, handles)
        take_over(self._params, self._names, self)

    # ---- during backward ----------------------------------------------------

    def on_grad(self, index: int, grads) -> None:
        """Runs before parameter ``index`` accumulates ``grads[0]``."""
        refuse_compiled_autograd(f"DistributedOptimizer '{self._name}'")
        if not self._counter.in_pass:
            self._begin_pass()
        grad = grads[0]
        if (
            grad is not None
            and grad.is_sparse
            and not self._sparse_as_dense
            and self._sparse_dims is not None
            and not self._sparse_dims[index]
        ):
            raise ValueError(
                f"hvdtorch: rank {runtime.rank()}: parameter '{self._names[index]}' got a sparse gradient, but its "
                "gradient was dense (or absent) on every rank in the first step, which fixed that it is reduced "
                "densely; use DistributedOptimizer(sparse_as_dense=True), or produce the same kind of gradient "
                "from the first step on"
            )

    def set_model_sync(self, sync: bool) -> None:
        """DDP's require_backward_grad_sync of the model given as model=, at
        one of its forwards with autograd on: False makes the coming backward
        accumulate locally, uncounted (module_rules.py)."""
        self._counter.local = not sync

    def densify(self, index: int, param: torch.Tensor) -> None:
        """sparse_as_dense: runs once ``param.grad`` is accumulated."""
        if param.grad is not None and param.grad.is_sparse:
            self._densified.setdefault(index, param.grad.sparse_dim())
            param.grad = param.grad.to_dense()

    def _begin_pass(self) -> None:
        self._counter.set_rank(runtime.rank())  # named by the error; an elastic job may renumber ranks
        self._counter.begin_pass()  # AssertionError on a (k+1)-th pass
        self._pending.restore()  # before this pass accumulates into .grad
        self._settled = False
        torch.autograd.Variable._execution_engine.queue_callback(self._counter.end_pass)
        self._marks.note_after_pass()

    # ---- between backward and step -----------------------------------------

    def pending(self) -> bool:
        """A backward pass ran since the last synchronize()."""
        return self._counter.pending()

    @property
    def settled(self) -> bool:
        """A use of a stand-in finished the reduction of the passes so far
        (until the next pass or end_step()). What step() asks first: raises
        once a newer DistributedOptimizer took the parameters over."""
        self._check_not_released()
        return self._settled

    def release(self, name: str) -> None:
        """A newer DistributedOptimizer reduces these parameters from now on
        (take_over, which names parameter ``name``): this one's hooks and
        reducer go (the C++ reducer drains what it has in flight), its
        stand-ins give .grad back, and using it raises."""
        self._pending.restore()
        self._remove_hooks()
        self._reducer = None
        self._released = name

    def _check_not_released(self) -> None:
        if self._released:
            raise RuntimeError(
                f"hvdtorch: rank {runtime.rank()}: this DistributedOptimizer no longer reduces parameter "
                f"'{self._released}': a newer hvd.DistributedOptimizer over it took its parameters over (two would "
                "reduce each gradient twice); step and synchronize the newer one"
            )

    def unused(self) -> List[int]:
        """Once the reduction is finished: the parameters (indices) no rank
        gave a gradient, whose .grad the reducer left None."""
        if self._reducer is None:
            return []
        return [self._dense[i] for i in self._reducer.unused_everywhere()]

    def settle(self) -> None:
        """A stand-in in .grad is used: finish the reduction now."""
        self.synchronize()
        self._settled = True

    def end_step(self) -> None:
        """The optimizer stepped: the next synchronize() reduces again."""
        self._pending.restore()
        self._settled = False

    def reset(self, backward_passes_per_step: Optional[int] = None) -> None:
        """Forgets the passes counted so far (load_state_dict, set_backward_passes_per_step).
        Reductions backward already launched are waited for (every rank launched
        them, so this rank alone can wait), so nothing writes into .grad later."""
        self._pending.restore()
        self._settled = False
        if self._reducer is not None:
            self._reducer.finalize()
        self._marks.forget()
        self._counter.reset(None if backward_passes_per_step is None else int(backward_passes_per_step))

    def set_fusion_bytes(self, fusion_bytes: int) -> None:
        """New bucket cap (autotune). Every rank must call it at the same step
        boundary, after synchronize(): bucket layouts must match across ranks."""
        self._fusion_bytes = int(fusion_bytes)
        if self._reducer is not None:
            self._reducer.finalize()
            self._reducer.rebuild(self._plan_layout(self._dense_params(), self._fusion_bytes))

    def synchronize(self) -> None:
        self._check_not_released()
        if self._settled:
            return  # a use of .grad finished it; no pass since
        self._pending.restore()
        self._marks.check()
        if self._sparse_dims is None:
            self._learn_sparse_gradients()
        if self._reducer is not None:
            # After the reducing pass it waits for what backward launched; earlier (fewer passes, none, the
            # first step) it reduces what .grad holds now.
            self._reducer.synchronize()
        self._reduce_sparse()
        for index, sparse_dim in self._densified.items():
            p = self._params[index]
            if p.grad is not None and not p.grad.is_sparse:
                p.grad = p.grad.to_sparse(sparse_dim)
        self._counter.reset()

    def synchronize_in_pieces(self, step, param_groups) -> bool:
        """synchronize() and ``step()`` over ``param_groups``, overlapped:
        each bucket's parameters are stepped as soon as it is reduced
        (bucketed_step.py). Only after the reducing pass backward launched,
        with no sparse gradients (they are reduced after the dense ones);
        otherwise returns False having done nothing."""
        reducer = self._reducer
        if reducer is None or self._sparse or self._densified or not self._counter.due() or not reducer.reducing():
            return False
        self._pending.restore()
        self._marks.check()
        try:
            step_as_reduced(reducer, self._dense_params(), step, param_groups)
        finally:
            self._counter.reset()
        return True

    def _learn_sparse_gradients(self) -> None:
        """The first synchronize(): the ranks agree (one all-reduce) on which
        parameters had sparse gradients on any rank, and the C++ reducer is
        built over the others. It copies their .grad into its buckets, makes
        .grad views of them and reduces this step too, so that every reduced
        pass is the reducer's (PowerSGD's pass count and start_iter mean the
        same as under DistributedModel)."""
        if self._sparse_as_dense:
            dims = [0] * len(self._params)
        else:
            dims = sparse.agree_sparse_dims(
                [p.grad for p in self._params], f"{self._name}.sparse_dims", self._process_set
            )
        self._dense = [i for i, d in enumerate(dims) if d == 0]
        self._sparse = [i for i, d in enumerate(dims) if d > 0]
        powersgd = is_powersgd(self._compression)
        if powersgd and self._sparse:
            raise ValueError(
                "hvdtorch: Compression.powersgd compresses dense gradients, but "
                f"{[self._names[i] for i in self._sparse]} got sparse ones; use "
                "DistributedOptimizer(sparse_as_dense=True), or Compression.none for them"
            )
        self._sparse_dims = dims
        if self._dense:
            self._reducer = self._make_reducer(
                self._compression.strategy_for(self, runtime.rank()) if powersgd else None
            )

    def _dense_params(self):
        """The dense parameters: the reducer's parameter list, in its order."""
        return [self._params[i] for i in self._dense]

    def _make_reducer(self, strategy=None):
        """The C++ reducer over the dense parameters; it copies their .grad into its buckets and makes
        .grad views of them."""
        dense_params = self._dense_params()
        return _C.GradientReducer(
            runtime.state().engine,
            dense_params,
            self._plan_layout(dense_params, self._fusion_bytes),
            reducer_options(
                compression=self._compression,
                name=self._name,
                reducer=self._reducer_kind,
                op=self._op,
                prescale=self._prescale,
                postscale=self._postscale,
                sync_on_backward=False,  # step() waits (Horovod's contract)
                fuse=self._fuse,
                backward_passes_per_step=self._counter.backward_passes_per_step,
                process_set_id=check_process_set(self._process_set),
                strategy_instance=strategy,
                unused="leave",  # no rank's gradient: .grad stays None, as in one process
            ),
            counter=self._counter,
        )

    def _reduce_sparse(self) -> None:
        started = []
        for i in self._sparse:
            p = self._params[i]
            grad = sparse.as_sparse(p.grad, p, self._sparse_dims[i])
            started.append(
                (
                    p,
                    sparse.sparse_allreduce_async(
                        grad, name=f"{self._name}.sparse.{i}", op=self._op, process_set=self._process_set
                    ),
                )
            )
        for p, handle in started:
            p.grad = handle()
