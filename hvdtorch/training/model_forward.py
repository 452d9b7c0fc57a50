"""DistributedModel's forward and what runs around it, and DDP's switches
that it reads (require_backward_grad_sync, require_forward_param_sync,
no_sync()).

Contract:
  * forward() runs eagerly under torch.compile (only the module's call is
    compiled, compiled_model.py); around the module's call it casts by the
    mixed-precision policy (training/mixed_precision.py), or lets shard=3's
    ParameterUnits gather the parameters.
  * Before each forward (_before_forward): with autograd on, the flag
    require_backward_grad_sync decides whether that forward's backward
    reduces (DDP's prepare_for_backward), and under compiled autograd the
    reducer moves to traced hooks for good; whatever the grad mode, the
    buffers take the set's first rank's when require_forward_param_sync is
    due (buffer_sync.py); then the bucket order is agreed and the buckets
    rebuilt once, and autotune counts its step boundaries.
"""

import contextlib

import torch

from . import compiled_model
from .compile_marks import disabled_when_compiled
from .compiled_model import PassState, compiled_autograd_on, use_traced_hooks
from .mixed_precision import cast_floating, cast_parameters


class _ModelForward:
    """DistributedModel's forward and DDP's switches (a mixin; the state is
    DistributedModel.__init__'s): keeps _require_backward_grad_sync,
    _pass_state and _traced_hooks; reads module, mixed_precision, _marks,
    _parameter_units, _gradient_owner, _reducer, _params, _forward_sync,
    _buffers_sync, _rebuild_pending and _autotune; runs _refuse_meta and
    _maybe_rebuild."""

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
