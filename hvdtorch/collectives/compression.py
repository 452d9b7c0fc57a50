"""Gradient compression, as in Horovod: compress before the all-reduce,
decompress after. ``fp16`` halves the bytes on the wire for float32/float64.

Unlike Horovod's FP16Compressor, which converts every floating-point tensor,
``fp16`` leaves 16-bit floats as they are: a bfloat16 tensor sent as float16
would save no byte, lose its range (float16 overflows above 65504) and gain
mantissa bits it does not have."""

import torch


def fp16_wire(dtype: torch.dtype) -> bool:
    """Whether Compression.fp16 sends tensors of ``dtype`` as float16: the
    32- and 64-bit floats. The one rule for every path that compresses
    (the ops here, the gradient buckets in C++ and of the sharded optimizer)."""
    return dtype.is_floating_point and dtype.itemsize > 2


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
        if fp16_wire(tensor.dtype):
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
