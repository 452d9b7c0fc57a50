"""DistributedModel under torch.compile and compiled autograd.

A compiled model must train as the eager one does, gradients reduced while
backward still runs. Two things stand in the way, and each has its answer
here:

* AOTAutograd compiles a graph's backward into one autograd node, so every
  gradient of the graph comes out at its end: no bucket could launch while
  backward runs. torch's own DDPOptimizer (torch._dynamo.backends.distributed)
  splits a forward graph into pieces of about one bucket, so that gradients
  come out piece by piece. Dynamo applies it to the graphs compiled while
  ``DistributedDataParallel._active_ddp_module`` names a module (it reads
  that module's ``bucket_bytes_cap``); ``begin_bucketed_graphs`` puts the
  DistributedModel in that place around its module's call.
  ``torch._dynamo.config.optimize_ddp = False`` turns the splits off, as it
  does for DDP.
* Compiled autograd traces backward, hooks included, into one graph, but it
  cannot trace C++ hooks (csrc/torch/accumulator_hooks.h), which are how the
  reducer learns of a gradient. When compiled autograd is on at a forward,
  ``use_traced_hooks`` moves the reducer to post-accumulate-grad hooks that
  call the custom ops below: compiled autograd puts each where its
  gradient is accumulated, so buckets still launch during backward, and the
  callback each queues ends the pass (the reducer's C++ end-of-pass callback
  would be lost: compiled autograd runs no callback queued at run time).
  The ops do at run time what the C++ hooks do (grad_reducer.h). The switch
  is for good; in an eager backward the same hooks do the same work.

Contract for the ops. Compiled autograd writes .grad when its graph ends,
so the ops never read or write .grad: they are given the gradients
(GradientReducer::useTracedHooks). ``gradient_ready`` copies one into its
bucket and launches the bucket once full; ``backward_ended`` waits for every
bucket and writes each result into the gradient it is given, which the
graph then stores in .grad. Both declare the gradients mutated: true of
``backward_ended``, and what keeps the compiler from dropping
``gradient_ready`` or moving it past the end. A model is found by its key in
``_models``.
"""

import functools
import itertools
import sys
import weakref
from typing import List

import torch
from torch.nn.parallel import DistributedDataParallel

from .compile_marks import disabled_when_compiled

# key -> the live DistributedModel whose reducer the ops drive.
_models = weakref.WeakValueDictionary()
_keys = itertools.count()


@torch.library.custom_op("hvdtorch::gradient_ready", mutates_args=("grad",))
def gradient_ready(grad: torch.Tensor, model: int, index: int) -> None:
    """Parameter ``index``'s gradient, accumulated: ``grad``. It goes into its
    bucket; the reduction writes the result into it at the end of the pass."""
    dm = _models.get(model)
    if dm is not None and dm._reducer is not None:
        dm._reducer.gradient_ready(index, grad)


@torch.library.custom_op("hvdtorch::backward_ended", mutates_args=("grads",))
def backward_ended(grads: List[torch.Tensor], indices: List[int], model: int) -> None:
    """The backward pass is over: the rest is launched, everything waited
    for, and every gradient given (that of parameter indices[i], in the
    reducer's order) gets its reduced value."""
    dm = _models.get(model)
    if dm is not None and dm._reducer is not None:
        full = [None] * len(dm._params)
        for i, g in zip(indices, grads):
            full[i] = g
        dm._reducer.backward_ended(full)


class PassState:
    """What the traced end of a pass reads (Dynamo guards on it and compiles
    one graph per value): whether this pass reduces, so that a parameter
    unused in it gets a .grad (the C++ hooks give it a view of its bucket,
    which holds the ranks' average), where a pass that only accumulates
    leaves .grad as it is. DistributedModel sets it before each forward and
    at no_sync()'s edges (GradientReducer::nextPassReduces)."""

    def __init__(self):
        self.reduces = False


def _after_accumulation(param: torch.Tensor, *, model: int, index: int, params: List[torch.Tensor], state) -> None:
    torch.ops.hvdtorch.gradient_ready(param.grad, model, index)
    # Queued by every hook: the first one run ends the pass, the rest find it ended.
    # Compiled autograd traces a queued callback only where a graph break is an error.
    with torch._dynamo.error_on_graph_break(True):
        torch.autograd.Variable._execution_engine.queue_callback(functools.partial(_end, params, model, state))


def _end(params: List[torch.Tensor], model: int, state: PassState) -> None:
    if state.reduces:
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
    # Only the gradients there are (auto-functionalization takes no list with holes).
    present = [i for i, p in enumerate(params) if p.grad is not None]
    torch.ops.hvdtorch.backward_ended([params[i].grad for i in present], present, model)


def compiled_autograd_on() -> bool:
    """Compiled autograd is on now (its context, or torch._dynamo.config.compiled_autograd
    inside a torch.compile'd function). Never before torch._dynamo is loaded (nothing is
    compiled then), so asking does not load it (compile_marks.py says why that matters)."""
    if "torch._dynamo" not in sys.modules:
        return False
    ca = torch._dynamo.compiled_autograd
    return bool(getattr(ca, "compiled_autograd_enabled", False) or getattr(ca, "in_compiled_autograd_region", False))


def refuse_compiled_autograd(front: str) -> None:
    """Raises, where a hook of ``front`` (DistributedOptimizer) finds compiled
    autograd tracing it, with the words of the C++ hooks' refusal
    (csrc/torch/accumulator_hooks.cpp). Compiled autograd's own flags are
    off while Dynamo traces its graph: a hook, or a stand-in .grad
    (pending_gradients.py), met while Dynamo compiles is under compiled
    autograd (neither is any part of a forward)."""
    if torch.compiler.is_compiling() or torch._guards.TracingContext.try_get() is not None or compiled_autograd_on():
        raise RuntimeError(
            f"hvdtorch: {front}: compiled autograd met hvdtorch's gradient hooks, which run only in the eager "
            "autograd engine. DistributedOptimizer and the sharded optimizer do not run under compiled autograd: "
            "wrap the model in hvd.DistributedModel (which hands its gradients to compiled autograd), or leave "
            "compiled autograd off"
        )


def use_traced_hooks(dm, params, state: PassState) -> list:
    """Moves ``dm``'s reducer to hooks compiled autograd traces, whose end of
    a pass reads ``state``; returns their handles (removed with the model)."""
    key = next(_keys)
    _models[key] = dm
    params = list(params)
    dm._reducer.use_traced_hooks()
    handles = [
        p.register_post_accumulate_grad_hook(
            functools.partial(_after_accumulation, model=key, index=i, params=params, state=state)
        )
        for i, p in enumerate(params)
    ]
    weakref.finalize(dm, _remove, list(handles))  # the parameters may outlive the model
    return handles


def _remove(handles) -> None:
    for h in handles:
        h.remove()


def call_module(module, args, kwargs):
    """``module(*args, **kwargs)`` in a frame of its own, called from frames
    Dynamo skips (DistributedModel's forward): under torch.compile this is
    the frame it compiles, the module's call inlined. (Called straight from
    a skipped frame, a torch.nn container such as nn.Sequential would not
    be compiled at all: Dynamo starts no graph in torch.nn's own frames.)"""
    return module(*args, **kwargs)


@disabled_when_compiled
def begin_bucketed_graphs(dm):
    """From now until end_bucketed_graphs(), graphs Dynamo compiles are split
    at ``dm``'s bucket size. Returns what to hand to end_bucketed_graphs()."""
    old = DistributedDataParallel._active_ddp_module
    DistributedDataParallel._active_ddp_module = dm
    return old


@disabled_when_compiled
def end_bucketed_graphs(old) -> None:
    DistributedDataParallel._active_ddp_module = old
