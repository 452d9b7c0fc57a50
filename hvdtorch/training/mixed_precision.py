"""Mixed precision as FSDP2's MixedPrecisionPolicy defines it, for
DistributedModel and every sharded stage:

    model = hvd.DistributedModel(net, mixed_precision=hvd.MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32))

Contract:
  * The parameters stay in their own dtype (the fp32 masters the optimizer
    steps, and what state_dict() and checkpoints hold). A forward computes
    with copies in ``param_dtype``: unsharded (DistributedModel, shard=1/2),
    each floating-point parameter is cast for the forward
    (cast_parameters: a differentiable cast, so autograd accumulates the
    gradient into the parameter's own .grad, in its own dtype); shard=3
    casts each shard before its all-gather, so the gathered parameters are
    ``param_dtype`` and the gathers move half the bytes
    (zero/gather_routes.py), as FSDP2 does.
  * Gradients are reduced in ``reduce_dtype``; None means ``param_dtype``
    (FSDP2's rule). A reduce dtype narrower than the parameters' is the
    gradient core's wire codec ("bf16" or "fp16", gradients/wire_codec.h):
    buckets travel in it and the average is converted back into the
    parameters' dtype. Accumulated passes add up in the parameters' dtype.
  * ``cast_forward_inputs``: floating-point tensors among the forward's
    arguments are cast to ``param_dtype``; ``output_dtype``: floating-point
    tensors among its outputs are cast to it (None: left as computed).
  * DDP's ``mixed_precision=_MixedPrecision(param_dtype, reduce_dtype,
    buffer_dtype)`` is taken with the same meaning, its ``buffer_dtype``
    casting the floating-point buffers once, at the wrap, as DDP does (DDP
    accumulates in param_dtype; here gradients accumulate in full
    precision, FSDP2's way). FSDP2's own policy object is taken as is.
"""

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch

_CODECS = {torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    param_dtype: Optional[torch.dtype] = None
    reduce_dtype: Optional[torch.dtype] = None
    output_dtype: Optional[torch.dtype] = None
    cast_forward_inputs: bool = True
    buffer_dtype: Optional[torch.dtype] = None  # DDP's _MixedPrecision only: buffers cast at the wrap

    def __post_init__(self):
        for field in ("param_dtype", "reduce_dtype", "output_dtype", "buffer_dtype"):
            d = getattr(self, field)
            if d is not None and (not isinstance(d, torch.dtype) or not d.is_floating_point):
                raise ValueError(f"hvdtorch: MixedPrecisionPolicy({field}={d!r}): a floating-point torch.dtype or None")
        reduce = self.reduce_dtype or self.param_dtype
        if reduce is not None and reduce not in (torch.float32, torch.float64, *_CODECS):
            raise ValueError(
                f"hvdtorch: MixedPrecisionPolicy: gradients reduce in float32, bfloat16 or float16, not {reduce}"
            )

    def codec(self) -> str:
        """The wire codec that reduces full-precision gradients in this
        policy's reduce dtype ("none": in their own)."""
        reduce = self.reduce_dtype or self.param_dtype
        if reduce is None or reduce in (torch.float32, torch.float64):
            return "none"
        return _CODECS[reduce]


def as_policy(given) -> Optional[MixedPrecisionPolicy]:
    """Ours, FSDP2's MixedPrecisionPolicy, or DDP's _MixedPrecision, as ours."""
    if given is None or isinstance(given, MixedPrecisionPolicy):
        return given
    fields = ("param_dtype", "reduce_dtype")
    if not all(hasattr(given, f) for f in fields):
        raise TypeError(
            f"hvdtorch: mixed_precision= takes hvd.MixedPrecisionPolicy (or FSDP2's MixedPrecisionPolicy, or DDP's "
            f"_MixedPrecision), not {type(given).__name__}"
        )
    return MixedPrecisionPolicy(
        param_dtype=given.param_dtype,
        reduce_dtype=given.reduce_dtype,
        output_dtype=getattr(given, "output_dtype", None),
        cast_forward_inputs=bool(getattr(given, "cast_forward_inputs", True)),
        buffer_dtype=getattr(given, "buffer_dtype", None),
    )


def cast_buffers(module: torch.nn.Module, dtype: Optional[torch.dtype]) -> None:
    """DDP's buffer_dtype: the floating-point buffers become ``dtype``, once."""
    if dtype is None:
        return
    for b in module.buffers():
        if b.is_floating_point():
            b.data = b.data.to(dtype)


@contextlib.contextmanager
def cast_parameters(module: torch.nn.Module, dtype: Optional[torch.dtype]):
    """Inside, every floating-point parameter of ``module`` reads as its cast
    to ``dtype`` (one cast per parameter, shared by the modules that tie
    it); autograd takes the gradient back through the cast."""
    if dtype is None:
        yield
        return
    casts, swapped = {}, []
    try:
        for m in module.modules():
            for name, p in m._parameters.items():
                if p is None or not p.is_floating_point() or p.dtype == dtype:
                    continue
                cast = casts.get(id(p))
                if cast is None:
                    cast = casts[id(p)] = p.to(dtype)
                m._parameters[name] = cast  # the dict itself: a module refuses a non-Parameter by setattr
                swapped.append((m, name, p))
        yield
    finally:
        for m, name, p in swapped:
            m._parameters[name] = p


def cast_floating(tree, dtype: Optional[torch.dtype]):
    """``tree`` (tensors in tuples, lists and dicts) with its floating-point tensors cast to ``dtype``."""
    if dtype is None:
        return tree
    if isinstance(tree, torch.Tensor):
        return tree.to(dtype) if tree.is_floating_point() else tree
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a namedtuple
        return type(tree)(*(cast_floating(t, dtype) for t in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(cast_floating(t, dtype) for t in tree)
    if isinstance(tree, dict):
        return {k: cast_floating(v, dtype) for k, v in tree.items()}
    return tree
