"""Compression.fp16: compresses float32 and float64 only; integers, float16
and bfloat16 pass through untouched, in the compressor itself, in
reductions of 2 and 3 ranks (on the job and inside a process set) and in
every gradient path's buckets."""

import pytest
import torch

import hvdtorch as hvd
from tests.harness import run_ranks


@pytest.mark.parametrize(
    "dtype", [torch.int64, torch.int32, torch.int16, torch.uint8, torch.bool, torch.float16, torch.bfloat16]
)
def test_fp16_leaves_integers_bool_and_16_bit_floats_alone(dtype):
    t = torch.ones(3, dtype=dtype)
    out, ctx = hvd.Compression.fp16.compress(t)
    assert out is t and ctx is None
    assert hvd.Compression.fp16.decompress(out, ctx) is t


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fp16_compresses_floating_point_and_restores_the_dtype(dtype):
    t = torch.tensor([1.0, -0.5, 3.0], dtype=dtype)
    out, ctx = hvd.Compression.fp16.compress(t)
    assert out.dtype == torch.float16 and ctx == dtype
    back = hvd.Compression.fp16.decompress(out, ctx)
    assert back.dtype == dtype and torch.equal(back, t)


@pytest.mark.parametrize("nranks", [2, 3])
def test_fp16_compressed_reductions_against_reference(nranks):
    run_ranks("tests.workers.compression:check_fp16_compression", nranks, timeout=90)


@pytest.mark.parametrize("nranks", [2, 3])
def test_gradient_paths_send_float32_as_float16_and_bfloat16_as_it_is(nranks):
    run_ranks("tests.workers.compression:check_gradients_on_the_wire", nranks, timeout=90)


def test_gradient_buckets_refuse_a_compressor_of_the_users_own():
    run_ranks("tests.workers.compression:check_own_compressor_refused_by_gradient_buckets", 2, timeout=90)


def test_a_compressor_of_the_users_own_is_refused_or_applied_with_every_op():
    run_ranks("tests.workers.compression:check_own_compressor_with_every_op", 2, timeout=90)
