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
  * Each rank's optimizer state is its own, so a checkpoint of one rank's
    state_dict() cannot resume the others exactly: state_dict() names the
    rank it came from, and load_state_dict() refuses another rank's state,
    naming the ways out (collectives/own_state.py: every rank's state, saved
    per rank or gathered into a list, which it takes its own from; or
    hvd.broadcast_optimizer_state(), which starts every rank from the
    root's on purpose, Horovod's way).
Difference from Horovod: the deltas are computed and reduced in step(), after
backward, where Horovod steps each parameter and starts its reduction as its
gradient arrives. The values are the same.

A thin front over the gradient core's delta reducer (_C.DeltaReducer,
csrc/torch/delta_reducer.h), which shares the gradient reducer's buckets
and strategies (bucket_set.h): the reducer's hooks count
each parameter's passes (a strict counter per parameter, so a parameter
unused in a pass does not count it), backward reduces nothing, and step()
hands the deltas to reduce_now(), which packs them into the reducer's
buckets (training/buckets.py's plan, one dtype each; with
Compression.fp16 in the wire codec's dtype), reduces each bucket with the
"adasum" strategy (one op per bucket whose tensors are the deltas, each
combined on its own) and unpacks them. A compressor other than
Compression.none and Compression.fp16 is one the wire codec cannot express:
the deltas are then compressed here and reduced with one grouped Adasum
all-reduce per dtype, Horovod's way.
"""

import torch

from .. import _C, runtime
from ..collectives import ops, own_state
from ..collectives.compression import Compression
from ..collectives.handles import check_process_set
from .buckets import plan_buckets
from .gradient_sync import take_over
from .parameter_names import names_by_parameter
from .reducer_options import reducer_options
from .shared_groups import load_keeping_groups


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        named_parameters,
        compression,
        backward_passes_per_step,
        fusion_bytes,
        name,
        process_set,
        *,
        module=None,
    ):
        super(self._hvd_class, self).__init__(params)
        self._parameter_names = names_by_parameter(self.param_groups, named_parameters, module)
        self._hvd_name = name
        self._hvd_process_set = process_set
        self._hvd_reducer = None  # made below, over the trainable parameters (none: nothing to reduce)
        self._hvd_released = ""  # the parameter a newer DistributedOptimizer took over (release())
        self.set_backward_passes_per_step(backward_passes_per_step)
        trainable, seen = [], set()
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    trainable.append(p)
        self._hvd_params = trainable
        # The compressor applied here, where the wire codec cannot express it; None: the codec's.
        self._hvd_compressor = None if compression in (Compression.none, Compression.fp16) else compression
        if trainable:
            self._hvd_reducer = _C.DeltaReducer(
                runtime.state().engine,
                trainable,
                plan_buckets(trainable, range(len(trainable)), fusion_bytes, 0),
                reducer_options(
                    compression=compression,
                    name=name,
                    op=ops.Adasum,
                    pipeline=False,  # step() launches the deltas
                    sync_on_backward=False,
                    backward_passes_per_step=self.backward_passes_per_step,
                    process_set_id=check_process_set(process_set),
                    strategy="adasum",
                    param_names=[self._parameter_names[p] for p in trainable],
                ),
                # The rules of each parameter's counter (csrc/core/gradients/pass_counter.h): strict,
                # an AssertionError on a (k+1)-th gradient, raised before .grad is touched.
                counter=_C.PassCounter(
                    self.backward_passes_per_step,
                    strict=True,
                    rank=runtime.rank(),
                    step_call="optimizer.step()",
                    advice="raise backward_passes_per_step",
                ),
            )
            # One DistributedOptimizer reduces a parameter: this one takes them over from an older one.
            take_over(trainable, [self._parameter_names[p] for p in trainable], self)

    def release(self, name: str) -> None:
        """A newer DistributedOptimizer reduces these parameters from now on
        (gradient_sync.take_over, naming parameter ``name``): the reducer and
        its hooks go, and step() raises."""
        self._hvd_reducer = None
        self._hvd_released = name

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Changes how many backward passes may accumulate before each step()."""
        if int(passes) < 1:
            raise ValueError(f"hvdtorch: backward_passes_per_step must be >= 1, got {passes}")
        self.backward_passes_per_step = int(passes)
        if self._hvd_reducer is not None:  # the passes counted so far stay
            self._hvd_reducer.set_backward_passes_per_step(self.backward_passes_per_step)

    def synchronize(self) -> None:
        """Nothing to do: with Adasum, step() reduces the step's change, not the gradients."""

    def skip_synchronize(self):
        raise AssertionError(
            "hvdtorch: skip_synchronize() is not supported with op=hvd.Adasum: step() reduces the change "
            "the local step made, so there are no reduced gradients to work on before it"
        )

    def step(self, closure=None):
        if self._hvd_released:
            raise RuntimeError(
                f"hvdtorch: rank {runtime.rank()}: this DistributedOptimizer no longer reduces parameter "
                f"'{self._hvd_released}': a newer hvd.DistributedOptimizer over it took its parameters over (two "
                "would reduce each gradient twice); step the newer one"
            )
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = self._hvd_params
        with torch.no_grad():
            starts = [p.detach().clone() for p in params]
        super(self._hvd_class, self).step()
        if self._hvd_reducer is None:
            return loss
        with torch.no_grad():
            deltas = [p.detach() - start for p, start in zip(params, starts)]
            if self._hvd_compressor is None:
                self._hvd_reducer.reduce_now(deltas)  # in place; the step: every parameter's passes are reset
            else:
                self._reduce_compressed(deltas)
                self._hvd_reducer.reset_passes()
            for p, start, delta in zip(params, starts, deltas):
                p.copy_(start.add_(delta))
        return loss

    def _reduce_compressed(self, deltas) -> None:
        """Adasum of ``deltas`` in place through the compressor: one grouped all-reduce per dtype."""
        ops.grouped_allreduce_compressed_(
            deltas,
            self._hvd_compressor,
            f"{self._hvd_name}.adasum_delta",
            op=ops.Adasum,
            process_set=self._hvd_process_set,
        )

    def zero_grad(self, set_to_none: bool = True):
        if self._hvd_reducer is not None and self._hvd_reducer.passes_pending():
            raise AssertionError(
                "hvdtorch: optimizer.zero_grad() between loss.backward() and optimizer.step(): with "
                "op=hvd.Adasum the gradients of the passes so far are stepped on at step(); zero them "
                "before backward or after step()"
            )
        return super(self._hvd_class, self).zero_grad(set_to_none=set_to_none)

    def state_dict(self, *args, **kwargs):
        return own_state.mark(super(self._hvd_class, self).state_dict(*args, **kwargs), runtime.rank())

    def load_state_dict(self, state_dict, *args, **kwargs):
        state_dict = own_state.own(
            state_dict,
            runtime.rank(),
            "load_state_dict() of an op=hvd.Adasum optimizer",
            "its optimizer state (momentum, moments)",
            "; or load it on the rank it came from and call hvd.broadcast_optimizer_state(opt, root_rank) to "
            "start every rank from it",
        )
        if self._hvd_reducer is not None:
            self._hvd_reducer.reset_passes()
        return load_keeping_groups(self, super(self._hvd_class, self).load_state_dict, state_dict, *args, **kwargs)
