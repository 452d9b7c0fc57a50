"""Rank side of tests/test_compression.py: fp16 compression of allreduce and
grouped_allreduce, on the job and inside a process set. Integers and float16
pass through unchanged (exact sums); float32/float64 come back in their own
dtype within float16's precision; gradients flow through compression."""

import torch

import hvdtorch as hvd


def _check(process_set, members):
    r = hvd.rank()
    fp16 = hvd.Compression.fp16
    # 3001 + rank is not a float16 value: any rounding shows in the sum.
    for dtype in (torch.int64, torch.int32, torch.int16):
        x = torch.full((4,), 3001 + r, dtype=dtype)
        got = hvd.allreduce(x, op=hvd.Sum, compression=fp16, process_set=process_set, name=f"int.{dtype}")
        want = torch.full((4,), sum(3001 + k for k in members), dtype=dtype)
        assert got.dtype == dtype and torch.equal(got, want), f"{dtype}: {got.tolist()} want {want.tolist()}"
    outs = hvd.grouped_allreduce(
        [torch.full((3,), 3001 + r, dtype=torch.int64), torch.full((2,), 0.5 + r, dtype=torch.float64)],
        op=hvd.Sum,
        compression=fp16,
        process_set=process_set,
    )
    assert torch.equal(outs[0], torch.full((3,), sum(3001 + k for k in members), dtype=torch.int64)), outs[0]
    assert outs[1].dtype == torch.float64
    torch.testing.assert_close(outs[1], torch.full((2,), sum(0.5 + k for k in members), dtype=torch.float64))
    # Floating point: the caller's dtype back, values within float16's precision; the gradient
    # of an Average is the Average of the upstream gradients.
    x = torch.linspace(-2, 2, 7, dtype=torch.float64).mul(r + 1).requires_grad_()
    y = hvd.allreduce(x, compression=fp16, process_set=process_set, name="float")
    assert y.dtype == torch.float64
    want = torch.linspace(-2, 2, 7, dtype=torch.float64) * sum(k + 1 for k in members) / len(members)
    torch.testing.assert_close(y.detach(), want, atol=2e-3, rtol=1e-3)
    (y * (r + 1)).sum().backward()
    torch.testing.assert_close(
        x.grad, torch.full((7,), sum(k + 1 for k in members) / len(members), dtype=torch.float64), atol=2e-3, rtol=1e-3
    )


def check_fp16_compression():
    hvd.init()
    n = hvd.size()
    _check(None, list(range(n)))
    if n > 2:
        ps = hvd.add_process_set([0, n - 1])
        if ps.included():
            _check(ps, ps.ranks)
        hvd.barrier()
    hvd.shutdown()
