"""Rank-side checks of alltoall: values against a reference built from every
rank's input (each rank can compute them all), gradients with row-distinct
upstream gradients, and every error case."""

import time

import torch

import hvdtorch as hvd
from tests.workers import collectives
from tests.workers.collectives import assert_equal, value
from tests.workers.common import expect as _expect

# The collectives' dtypes less int16, which these per-op tests leave to
# tests/workers/collectives.py.
DTYPES = [d for d in collectives.DTYPES if d != torch.int16]


def splits_of(rank: int, n: int, kind: str):
    """Rows rank `rank` sends to each rank."""
    if kind == "equal":
        return [2] * n
    if kind == "uneven":  # different per pair, zeros included, rank 1 sends nothing
        return [0 if rank == 1 else (rank * 3 + d * 2) % 4 for d in range(n)]
    if kind == "one":  # dim0 < size: each rank sends one row to the next rank only
        return [1 if d == (rank + 1) % n else 0 for d in range(n)]
    raise ValueError(kind)


def expected(me: int, n: int, inputs, splits):
    """What rank `me` receives: from each rank in turn, that rank's block for `me`."""
    parts = []
    for src in range(n):
        start = sum(splits[src][:me])
        parts.append(inputs[src].narrow(0, start, splits[src][me]))
    return torch.cat(parts)


def _run(op: str, tensor, splits):
    """One call through `op`; always returns (output, received_splits)."""
    if op == "alltoall_async":
        return hvd.synchronize(hvd.alltoall_async(tensor, splits))
    if splits is None:
        out = hvd.alltoall(tensor)
        assert isinstance(out, torch.Tensor), f"alltoall without splits returned {type(out)}"
        return out, None
    return hvd.alltoall(tensor, splits)


def values(op: str):
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    case = 0
    for dtype in DTYPES:
        for kind in ("equal", "uneven", "one"):
            for trailing in ((), (3,), (2, 0), (2, 3)):
                case += 1
                splits = [splits_of(k, n, kind) for k in range(n)]
                inputs = [value(k, (sum(splits[k]),) + trailing, dtype, case) for k in range(n)]
                want = expected(r, n, inputs, splits)
                # splits as a list, and as an int64 tensor: received_splits follows its dtype.
                as_tensor = case % 2 == 0
                given = torch.tensor(splits[r], dtype=torch.int64) if as_tensor else splits[r]
                out, received = _run(op, inputs[r], given)
                what = f"{op} {dtype} {kind} {trailing}"
                assert_equal(out, want, what)
                assert received.tolist() == [splits[k][r] for k in range(n)], f"{what}: received {received}"
                assert received.dtype == (torch.int64 if as_tensor else torch.int32), f"{what}: {received.dtype}"
        # No splits: dimension 0 divided evenly.
        case += 1
        inputs = [value(k, (3 * n, 2), dtype, case) for k in range(n)]
        out, received = _run(op, inputs[r], None)
        assert_equal(out, expected(r, n, inputs, [[3] * n] * n), f"{op} {dtype} even")
        if op == "alltoall_async":
            assert received.tolist() == [3] * n and received.dtype == torch.int32, received
    # Empty tensor, and a non-contiguous input.
    out, _ = _run(op, torch.empty(0, 4), [0] * n)
    assert out.shape == (0, 4), out.shape
    base = torch.arange(4.0 * n).reshape(2, 2 * n) + 100 * r
    out, _ = _run(op, base.t(), [2] * n)  # (2n, 2), not contiguous
    want = torch.cat([(torch.arange(4.0 * n).reshape(2, 2 * n) + 100 * k).t()[2 * r : 2 * r + 2] for k in range(n)])
    assert_equal(out, want, f"{op} non-contiguous")
    hvd.shutdown()


def gradient(op: str):
    """d(sum(out * g))/d(in) with g different in every row on every rank: each
    input row must get the upstream gradient of the very row it became."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for kind in ("uneven", "equal"):
        splits = [splits_of(k, n, kind) for k in range(n)]
        rows = [sum(s) for s in splits]
        x = torch.arange(rows[r] * 3, dtype=torch.float64).reshape(rows[r], 3).requires_grad_()
        out, received = hvd.alltoall(x, torch.tensor(splits[r], dtype=torch.int32))
        assert not received.requires_grad
        # Upstream gradient of rank k's output: row j is 1000*k + 10*j + column.
        out_rows = [sum(splits[s][k] for s in range(n)) for k in range(n)]
        g = [
            torch.arange(3, dtype=torch.float64)
            + 10 * torch.arange(out_rows[k], dtype=torch.float64)[:, None]
            + 1000 * k
            for k in range(n)
        ]
        (out * g[r]).sum().backward()
        # Row i of my input went to rank d as row (rows from ranks < me to d) + (i - my offset for d).
        want = torch.empty(rows[r], 3, dtype=torch.float64)
        for d in range(n):
            start = sum(splits[r][:d])
            at = sum(splits[s][d] for s in range(r))
            for i in range(splits[r][d]):
                want[start + i] = g[d][at + i]
        assert torch.equal(x.grad, want), f"{kind}: grad {x.grad.tolist()} want {want.tolist()}"
    # Without splits the output alone is differentiable.
    x = torch.ones(2 * n, 2, requires_grad=True)
    y = hvd.alltoall(x)
    (y * (r + 1)).sum().backward()
    want = torch.cat([torch.full((2, 2), float(d + 1)) for d in range(n)])
    assert torch.equal(x.grad, want), x.grad
    hvd.shutdown()


def errors(op: str):
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    run = (
        (lambda t, s, name: hvd.synchronize(hvd.alltoall_async(t, s, name=name)))
        if op == "alltoall_async"
        else (lambda t, s, name: hvd.alltoall(t, s, name=name))
    )
    me = f"rank {r}: alltoall"
    t0 = time.time()
    # Raised locally on every rank, naming it, before anything is sent.
    _expect(ValueError, [me, "'bad.sum'", "sum to", str(n + 1)], lambda: run(torch.ones(n + 1), [1] * n, "bad.sum"), r)
    _expect(ValueError, [me, "entries", "one per rank"], lambda: run(torch.ones(n + 1), [1] * (n + 1), "bad.len"), r)
    _expect(
        ValueError,
        [me, "negative"],
        lambda: run(torch.ones(n), [-1, 2] + [0] * (n - 2) if n > 1 else [-1], "bad.neg"),
        r,
    )
    _expect(ValueError, [f"rank {r}", "integers", "float32"], lambda: run(torch.ones(n), torch.ones(n), "bad.dtype"), r)
    _expect(ValueError, [f"rank {r}", "integers"], lambda: run(torch.ones(n), [1.0] * n, "bad.float"), r)
    _expect(ValueError, [me, "at least one dimension"], lambda: run(torch.tensor(1.0), None, "bad.scalar"), r)
    if n > 1:
        _expect(
            ValueError, [me, "multiple of the number of ranks"], lambda: run(torch.ones(n + 1), None, "bad.even"), r
        )
    assert time.time() - t0 < 5, "local errors took too long"
    if n > 1:
        # Disagreements across ranks: an error on every rank naming who sent what.
        msg = _expect(
            hvd.HvdError,
            ["mismatched alltoall 'trailing'", "shape", "ranks [1]"],
            lambda: run(torch.ones(n, 3 if r == 1 else 2), None, "trailing"),
            r,
        )
        assert "allows only the first dimension to differ" in msg, msg
        _expect(
            hvd.HvdError,
            ["mismatched alltoall 'dtype'", "dtype", "ranks [0]"],
            lambda: run(torch.ones(n, dtype=torch.float64 if r == 0 else torch.float32), None, "dtype"),
            r,
        )
    # Still in step: a correct alltoall works.
    out, _ = hvd.synchronize(hvd.alltoall_async(torch.full((n,), float(r)), name="after"))
    assert out.tolist() == [float(k) for k in range(n)], out
    hvd.shutdown()
