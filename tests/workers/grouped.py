"""Rank-side checks of grouped_allgather: values against a reference built
from every rank's inputs, gradients with row-distinct upstream gradients,
and errors."""

import torch

import hvdtorch as hvd
from tests.workers.collectives import assert_equal, value
from tests.workers.common import expect as _expect

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.int64, torch.uint8, torch.bool]


def _gather(op_name, tensors, name=None):
    if op_name == "grouped_allgather_async":
        return hvd.synchronize(hvd.grouped_allgather_async(tensors, name=name))
    return hvd.grouped_allgather(tensors, name=name)


def values(op_name: str):
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for case, dtype in enumerate(DTYPES):
        # Per rank: different first dimensions (rank 1 contributes no rows to
        # the first tensor), mixed dtypes and shapes in one group, a scalar.
        specs = [
            lambda k: ((k % 3, 2, 3), dtype),
            lambda k: ((k + 1,), torch.float64),
            lambda k: ((0, 5), dtype),
            lambda k: ((), dtype),
        ]
        inputs = [[value(k, *spec(k), 10 * case + i) for i, spec in enumerate(specs)] for k in range(n)]
        outs = _gather(op_name, inputs[r])
        assert isinstance(outs, list) and len(outs) == len(specs), outs
        for i, out in enumerate(outs):
            want = torch.cat([inputs[k][i].reshape(-1) if inputs[k][i].dim() == 0 else inputs[k][i] for k in range(n)])
            assert_equal(out, want, f"{op_name} {dtype} tensor {i}")
    # One tensor in the group, and a non-contiguous one.
    col = (torch.arange(8.0).reshape(4, 2) + r)[:, 1]
    outs = _gather(op_name, [col])
    assert_equal(outs[0], torch.cat([(torch.arange(8.0).reshape(4, 2) + k)[:, 1] for k in range(n)]), "non-contiguous")
    hvd.shutdown()


def gradient(op_name: str):
    """Horovod's allgather rule per tensor: the averaged upstream gradient's rows of this rank."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    rows = [[k + 1 for k in range(n)], [2 * (n - k) for k in range(n)]]  # per tensor, per rank
    xs = [
        torch.zeros(rows[0][r], 3, dtype=torch.float64, requires_grad=True),
        torch.zeros(rows[1][r], dtype=torch.float32, requires_grad=True),
    ]
    outs = hvd.grouped_allgather(xs)

    def upstream(k, t):  # rank k's gradient of output t: every row different, on every rank
        total = sum(rows[t])
        base = 10 * torch.arange(total, dtype=torch.float64) + 1000 * k + 100000 * t
        return (base[:, None] + torch.arange(3)) if t == 0 else base.float()

    (sum((o * upstream(r, t)).sum() for t, o in enumerate(outs))).backward()
    for t, x in enumerate(xs):
        mean = sum(upstream(k, t) for k in range(n)) / n
        want = mean.narrow(0, sum(rows[t][:r]), rows[t][r])
        torch.testing.assert_close(x.grad, want.to(x.dtype), msg=lambda m: f"tensor {t}: {m}")
    hvd.shutdown()


def errors(op_name: str):
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    _expect(ValueError, [f"rank {r}", "sparse"], lambda: _gather(op_name, [torch.ones(2), torch.eye(2).to_sparse()]), r)
    if n > 1:
        _expect(
            hvd.HvdError,
            ["mismatched allgather 'count'", "group of", "ranks [0]"],
            lambda: _gather(op_name, [torch.ones(2)] * (2 if r == 0 else 1), name="count"),
            r,
        )
        _expect(
            hvd.HvdError,
            ["mismatched allgather 'trailing'", "(tensor 1 of the group)", "ranks [1]"],
            lambda: _gather(op_name, [torch.ones(2), torch.ones(1, 2 + (r == 1))], name="trailing"),
            r,
        )
        _expect(
            hvd.HvdError,
            ["mismatched allgather 'dtype'", "dtype", "ranks [1]"],
            lambda: _gather(op_name, [torch.ones(2, dtype=torch.float64 if r == 1 else torch.float32)], name="dtype"),
            r,
        )
    outs = _gather(op_name, [torch.full((1,), float(r))], name="after")
    assert outs[0].tolist() == [float(k) for k in range(n)], outs
    hvd.shutdown()
