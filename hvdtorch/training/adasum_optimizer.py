"""DistributedOptimizer(op=hvd.Adasum): Horovod's delta optimizer.

Adasum is applied to what the wrapped optimizer's step *does*, not to the
gradients (as in Horovod): every rank steps its own optimizer on its own
(accumulated) gradients, from the same start parameters; the change each
rank's step made, delta = new - start, is combined across the process set
with Adasum, tensor by tensor; every rank's parameters become
start + Adasum(deltas). The optimizer's state (momentum, Adam moments)
stays each rank's own, as in Horovod.

Contract, as Horovod's Adasum optimizer:
  * step() does the local step and the reduction; synchronize() does
    nothing (there is nothing to reduce before the step), and
    skip_synchronize() raises AssertionError.
  * backward_passes_per_step = k: a parameter's gradient may accumulate over
    up to k backward passes before step(); a (k+1)-th pass raises
    AssertionError before it touches .grad. step() after fewer passes is
    fine.
  * zero_grad() between a backward pass and step() raises AssertionError.
  * A parameter without a gradient is not moved by the local step: its delta
    is zeros.
Difference from Horovod: the deltas are computed and reduced in step(), after
backward, where Horovod steps each parameter and starts its reduction as its
gradient arrives. The values are the same.
"""

import weakref

import torch

from .. import _C, runtime
from ..collectives import ops
from .parameter_names import names_by_parameter


def _on_grad(optimizer_ref, index: int) -> None:
    optimizer = optimizer_ref()  # the hooks must not keep the optimizer alive
    if optimizer is not None:
        optimizer._hvd_count_pass(index)


def _remove_hooks(handles) -> None:
    for h in handles:
        h.remove()


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, name, process_set):
        super(self._hvd_class, self).__init__(params)
        self._parameter_names = names_by_parameter(self.param_groups, named_parameters)
        self._hvd_compression = compression
        self._hvd_name = name
        self._hvd_process_set = process_set
        self._hvd_counters = []  # one shared pass counter per parameter, made below
        self.set_backward_passes_per_step(backward_passes_per_step)
        trainable, seen = [], set()
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    trainable.append(p)
        self._hvd_params = trainable
        # Backward passes since the last step(), per parameter (a parameter unused in a pass does not
        # count it): the shared pass counter (csrc/core/gradients/pass_counter.h), strict, one each.
        self._hvd_counters = [
            _C.PassCounter(
                self.backward_passes_per_step,
                strict=True,
                rank=runtime.rank(),
                step_call="optimizer.step()",
                advice="raise backward_passes_per_step",
            )
            for _ in trainable
        ]
        me = weakref.ref(self)
        # A pre-hook on the gradient accumulator runs before .grad is touched,
        # so an extra pass is rejected with .grad as it was.
        with torch.enable_grad():
            self._hvd_accumulators = [p.view_as(p).grad_fn.next_functions[0][0] for p in trainable]
        handles = [
            acc.register_prehook(lambda grads, i=i: _on_grad(me, i)) for i, acc in enumerate(self._hvd_accumulators)
        ]
        weakref.finalize(self, _remove_hooks, handles)

    def _hvd_count_pass(self, index: int) -> None:
        counter = self._hvd_counters[index]
        counter.set_rank(runtime.rank())  # named by the error; an elastic job may renumber ranks
        # A parameter's pass is its one gradient: it begins and ends here. AssertionError on a (k+1)-th.
        counter.begin_pass(self._parameter_names[self._hvd_params[index]])
        counter.end_pass()

    def _hvd_reset_passes(self) -> None:
        for counter in self._hvd_counters:
            counter.reset()

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Changes how many backward passes may accumulate before each step()."""
        if int(passes) < 1:
            raise ValueError(f"hvdtorch: backward_passes_per_step must be >= 1, got {passes}")
        self.backward_passes_per_step = int(passes)
        for counter in self._hvd_counters:  # the passes counted so far stay
            counter.backward_passes_per_step = self.backward_passes_per_step

    def synchronize(self) -> None:
        """Nothing to do: with Adasum, step() reduces the step's change, not the gradients."""

    def skip_synchronize(self):
        raise AssertionError(
            "hvdtorch: skip_synchronize() is not supported with op=hvd.Adasum: step() reduces the change "
            "the local step made, so there are no reduced gradients to work on before it"
        )

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = self._hvd_params
        with torch.no_grad():
            starts = [p.detach().clone() for p in params]
        super(self._hvd_class, self).step()
        with torch.no_grad():
            by_dtype = {}
            for p, start in zip(params, starts):
                by_dtype.setdefault(p.dtype, []).append((p, start))
            started = []
            for dtype, pairs in by_dtype.items():
                packed = [self._hvd_compression.compress(p.detach() - start) for p, start in pairs]
                handle = ops.grouped_allreduce_async_(
                    [c for c, _ in packed],
                    name=f"{self._hvd_name}.adasum_delta.{dtype}",
                    op=ops.Adasum,
                    process_set=self._hvd_process_set,
                )
                started.append((handle, pairs, packed))
            for handle, pairs, packed in started:
                ops.synchronize(handle)
                for (p, start), (c, ctx) in zip(pairs, packed):
                    p.copy_(start.add_(self._hvd_compression.decompress(c, ctx)))
        self._hvd_reset_passes()
        return loss

    def zero_grad(self, set_to_none: bool = True):
        if any(counter.pending() for counter in self._hvd_counters):
            raise AssertionError(
                "hvdtorch: optimizer.zero_grad() between loss.backward() and optimizer.step(): with "
                "op=hvd.Adasum the gradients of the passes so far are stepped on at step(); zero them "
                "before backward or after step()"
            )
        return super(self._hvd_class, self).zero_grad(set_to_none=set_to_none)

    def load_state_dict(self, *args, **kwargs):
        self._hvd_reset_passes()
        return super(self._hvd_class, self).load_state_dict(*args, **kwargs)
