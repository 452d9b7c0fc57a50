"""The options of the gradient core's reducer (_C.GradientReducerOptions,
GradReducerOptions in csrc/torch/grad_reducer_options.h), filled by name.

Every gradient path (DistributedModel, DistributedOptimizer, the sharded
optimizer, the Adasum optimizer) builds its _C.GradientReducer from these,
so a field is named where it is set, and the wire codec is decided here
once from the user's ``compression``: Compression.fp16 -> "fp16", every
other -> "none" (PowerSGD is a strategy, given as ``strategy_instance``;
the codec rule of wire_codec.h then picks each bucket's wire dtype)."""

from .. import _C
from ..collectives.compression import Compression


def reducer_options(*, compression=Compression.none, codec=None, **fields) -> "_C.GradientReducerOptions":
    """``fields``: GradientReducerOptions' fields by name (an unknown name
    is an AttributeError); ``compression``: the user's, giving the codec,
    unless ``codec`` names it (a mixed-precision policy's reduce dtype,
    training/mixed_precision.py)."""
    options = _C.GradientReducerOptions()
    options.codec = codec or ("fp16" if compression is Compression.fp16 else "none")
    for name, value in fields.items():
        if not hasattr(options, name):
            raise AttributeError(f"hvdtorch: GradientReducerOptions has no field {name!r}")
        setattr(options, name, value)
    return options
