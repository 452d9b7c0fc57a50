"""Rank-side checks of reducescatter and grouped_reducescatter: values against
a reference reduced from every rank's input (each rank can compute them
all) and split as Horovod splits, gradients with row-distinct upstream
gradients, and every error case."""

import time

import torch

import hvdtorch as hvd
from tests.workers.alltoall import DTYPES
from tests.workers.collectives import OPS, assert_equal, reference, value
from tests.workers.common import expect as _expect


def share(full: torch.Tensor, r: int, n: int) -> torch.Tensor:
    """Rank r's rows: dim0 // n each, one more for the first dim0 % n ranks."""
    dim0 = full.shape[0]
    rows = [dim0 // n + (k < dim0 % n) for k in range(n)]
    return full.narrow(0, sum(rows[:r]), rows[r])


def shapes(n: int):
    # dim0 < size, dim0 a multiple of size, uneven, empty rows, empty tensor.
    return [(1,), (max(n - 1, 1), 3), (2 * n, 2), (2 * n + 1,), (7, 0), (0, 4), (5, 2, 3)]


def _single(op_name, tensor, op, pre, post):
    if op_name == "reducescatter_async":
        return hvd.synchronize(hvd.reducescatter_async(tensor, op=op, prescale_factor=pre, postscale_factor=post))
    return hvd.reducescatter(tensor, op=op, prescale_factor=pre, postscale_factor=post)


def _grouped(op_name, tensors, op, pre, post):
    if op_name == "grouped_reducescatter_async":
        return hvd.synchronize(
            hvd.grouped_reducescatter_async(tensors, op=op, prescale_factor=pre, postscale_factor=post)
        )
    return hvd.grouped_reducescatter(tensors, op=op, prescale_factor=pre, postscale_factor=post)


def values(op_name: str):
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    grouped = op_name.startswith("grouped")
    case = 0
    for dtype in DTYPES:
        for op in OPS:
            if dtype == torch.bool and op == hvd.Average:
                continue
            case += 1
            if grouped:
                # Mixed shapes in one group, and a second dtype to make two runs.
                specs = [(s, dtype) for s in shapes(n)] + [((3, 2), torch.float64)]
                inputs = [[value(k, s, dt, 100 * case + i) for i, (s, dt) in enumerate(specs)] for k in range(n)]
                outs = _grouped(op_name, inputs[r], op, 1.0, 1.0)
                assert isinstance(outs, list) and len(outs) == len(specs), outs
                for i, out in enumerate(outs):
                    want = share(reference(op, [inputs[k][i] for k in range(n)]), r, n)
                    assert_equal(out, want, f"{op_name} {OPS[op]} {specs[i]}", op != hvd.Average)
            else:
                for i, s in enumerate(shapes(n)):
                    inputs = [value(k, s, dtype, 100 * case + i) for k in range(n)]
                    out = _single(op_name, inputs[r], op, 1.0, 1.0)
                    want = share(reference(op, inputs), r, n)
                    assert_equal(out, want, f"{op_name} {OPS[op]} {dtype} {s}", op != hvd.Average)
                    assert torch.equal(inputs[r], value(r, s, dtype, 100 * case + i)), "input was modified"
    # Scale factors: postscale * reduce(prescale * x).
    x = torch.full((2 * n + 1, 2), float(r + 1), dtype=torch.float64)
    want = torch.full((2 * n + 1, 2), 0.5 * 3.0 * sum(range(1, n + 1)), dtype=torch.float64)
    if grouped:
        got = _grouped(op_name, [x, x.float()], hvd.Sum, 3.0, 0.5)
        assert_equal(got[0], share(want, r, n), "grouped scales")
        assert_equal(got[1], share(want.float(), r, n), "grouped scales float32")
    else:
        assert_equal(_single(op_name, x, hvd.Sum, 3.0, 0.5), share(want, r, n), "scales")
        # Average with a scale: (sum / n) * postscale.
        avg = _single(op_name, x, hvd.Average, 1.0, 2.0)
        torch.testing.assert_close(avg, share(want * (2.0 / 1.5) / n, r, n))
        # Non-contiguous input.
        base = (torch.arange(6.0 * n).reshape(3, 2 * n) + r).t()
        ref = share(sum((torch.arange(6.0 * n).reshape(3, 2 * n) + k).t() for k in range(n)), r, n)
        assert_equal(_single(op_name, base, hvd.Sum, 1.0, 1.0), ref, "non-contiguous")
    hvd.shutdown()


def gradient(op_name: str):
    """Upstream gradient different in every row on every rank; Horovod's rule:
    grad = allgather(upstream) (x size for Sum, x scale factors)."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    grouped = op_name.startswith("grouped")
    for op, factor in ((hvd.Sum, n), (hvd.Average, 1)):
        for pre, post in ((1.0, 1.0), (2.0, 0.25)):
            shapes_ = [(2 * n + 1, 3), (n, 2)] if grouped else [(2 * n + 1, 3)]
            xs = [torch.ones(s, dtype=torch.float64, requires_grad=True) for s in shapes_]
            outs = (
                hvd.grouped_reducescatter(xs, op=op, prescale_factor=pre, postscale_factor=post)
                if grouped
                else [hvd.reducescatter(xs[0], op=op, prescale_factor=pre, postscale_factor=post)]
            )

            def upstream(k, shape, t):  # rank k's gradient for its share of tensor t
                rows = shape[0] // n + (k < shape[0] % n)
                cols = shape[1]
                return (
                    torch.arange(cols, dtype=torch.float64)
                    + 10 * torch.arange(rows, dtype=torch.float64)[:, None]
                    + 1000 * k
                    + 100000 * t
                )

            loss = sum((o * upstream(r, s, t)).sum() for t, (o, s) in enumerate(zip(outs, shapes_)))
            loss.backward()
            for t, (x, s) in enumerate(zip(xs, shapes_)):
                want = torch.cat([upstream(k, s, t) for k in range(n)]) * factor * pre * post
                assert torch.equal(x.grad, want), (
                    f"{OPS[op]} pre={pre} post={post} tensor {t}: {x.grad.tolist()} want {want.tolist()}"
                )
    # Min/Max/Product have no gradient.
    x = torch.ones(n, requires_grad=True)
    y = hvd.grouped_reducescatter([x], op=hvd.Max)[0] if grouped else hvd.reducescatter(x, op=hvd.Max)
    _expect(ValueError, ["no gradient", "Average or Sum"], lambda: y.sum().backward(), r)
    hvd.shutdown()


def errors(op_name: str):
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    grouped = op_name.startswith("grouped")
    label = "grouped_reducescatter" if grouped else "reducescatter"

    def run(t, name, op=hvd.Average, **kw):
        if grouped:
            return hvd.grouped_reducescatter([t], name=name, op=op, **kw)
        return hvd.reducescatter(t, name=name, op=op, **kw)

    me = f"rank {r}: reducescatter"
    t0 = time.time()
    _expect(ValueError, [me, "'scalar'", "at least one dimension"], lambda: run(torch.tensor(1.0), "scalar"), r)
    _expect(ValueError, [me, "Adasum"], lambda: run(torch.ones(n), "adasum", op=hvd.Adasum), r)
    _expect(ValueError, [me, "Average is not defined for bool"], lambda: run(torch.ones(n, dtype=torch.bool), "b"), r)
    _expect(
        ValueError,
        [me, "scale factors"],
        lambda: run(torch.ones(n, dtype=torch.bool), "bs", op=hvd.Sum, prescale_factor=2.0),
        r,
    )
    _expect(ValueError, ["unknown reduce op 9"], lambda: run(torch.ones(n), "op9", op=9), r)
    _expect(ValueError, [f"rank {r}", "sparse"], lambda: run(torch.eye(2).to_sparse(), "sparse"), r)
    assert time.time() - t0 < 5, "local errors took too long"
    if n > 1:
        _expect(
            hvd.HvdError,
            [f"mismatched reducescatter '{label}.shape'", "shape", "ranks [1]"],
            lambda: run(torch.ones(n + (r == 1)), f"{label}.shape"),
            r,
        )
        _expect(
            hvd.HvdError,
            [f"mismatched reducescatter '{label}.op'", "reduce op", "ranks [0]"],
            lambda: run(torch.ones(n), f"{label}.op", op=hvd.Max if r == 0 else hvd.Sum),
            r,
        )
    if grouped and n > 1:
        _expect(
            hvd.HvdError,
            ["mismatched reducescatter 'count'", "group of"],
            lambda: hvd.grouped_reducescatter([torch.ones(n)] * (1 + (r == 0)), name="count"),
            r,
        )
    out = run(torch.full((n,), float(r)), "after", op=hvd.Sum)
    out = out[0] if grouped else out
    assert out.tolist() == [float(sum(range(n)))], out
    hvd.shutdown()
