"""Gradient compression, as in Horovod: compress before the all-reduce,
decompress after. ``fp16`` halves the bytes on the wire for float32/float64.
Which dtype goes on the wire is the gradient core's codec rule (wire_dtype).

Unlike Horovod's FP16Compressor, which converts every floating-point tensor,
``fp16`` leaves 16-bit floats as they are: a bfloat16 tensor sent as float16
would save no byte, lose its range (float16 overflows above 65504) and gain
mantissa bits it does not have.

``powersgd(...)`` is of another kind: a low-rank compressor of gradient
buckets with state of its own (collectives/powersgd.py), for
DistributedModel and DistributedOptimizer only."""

import torch

from .. import _C
from .powersgd import PowerSGDCompressor


def wire_dtype(codec: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of ``dtype`` travels in under ``codec`` ("none",
    "fp16"): the gradient core's codec seam (csrc/core/gradients/wire_codec.h),
    the one rule for every path that compresses (the ops here, the gradient
    buckets of DistributedModel, DistributedOptimizer and the sharded
    optimizer)."""
    return _C.wire_dtype(codec, dtype)


class Compressor:
    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    @staticmethod
    def compress(tensor):
        wire = wire_dtype("fp16", tensor.dtype)
        if wire != tensor.dtype:
            return tensor.to(wire), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
    # Compression.powersgd(rank=4, ...): a new compressor (with its own state) per model or optimizer.
    powersgd = PowerSGDCompressor


def check_bucket_compression(compression, where: str) -> None:
    """Gradient buckets travel in one of the gradient core's codecs: Compression.none, Compression.fp16
    (wire_codec.h) or Compression.powersgd(...) (a bucket strategy). A compressor of the user's own would
    be skipped by the buckets, so it is refused, naming ``where`` and what to do instead."""
    if compression in (Compression.none, Compression.fp16) or isinstance(compression, PowerSGDCompressor):
        return
    raise ValueError(
        f"hvdtorch: {where}: compression={compression!r} is a compressor of your own, and gradient buckets "
        "travel only as Compression.none, Compression.fp16 or Compression.powersgd(...); compress single "
        "tensors with hvd.allreduce(..., compression=...), or use op=hvd.Adasum, whose step applies any "
        "compressor to the update"
    )
