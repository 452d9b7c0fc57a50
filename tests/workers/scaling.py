"""Average, pre- and postscale factors, and exact integer averages, against
references computed with Python integers and plain arithmetic on each rank
(every rank knows every rank's input)."""

import torch

import hvdtorch as hvd


def trunc_div(a: int, b: int) -> int:
    """Integer division truncating toward zero, in exact Python integers."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def check_float_scaling():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    total = n * (n + 1) / 2  # ranks hold 1 .. n
    for dtype in (torch.float32, torch.float64):
        x = torch.full((5,), float(r + 1), dtype=dtype)
        cases = [
            # (op, prescale, postscale, expected)
            (hvd.Average, 1.0, 1.0, total / n),
            (hvd.Average, 1.0, 2.0, total / n * 2.0),  # the user's postscale is kept with Average
            (hvd.Average, 3.0, 1.0, total * 3.0 / n),
            (hvd.Average, 2.0, 5.0, total * 2.0 / n * 5.0),
            (hvd.Sum, 2.0, 0.25, total * 0.5),
            (hvd.Sum, 1.0, 1.0, total),
        ]
        for op, pre, post, want in cases:
            what = f"{dtype} op={op} prescale={pre} postscale={post}"
            got = hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post)
            torch.testing.assert_close(got, torch.full((5,), want, dtype=dtype), msg=lambda m: f"{what}: {m}")
            inplace = x.clone()
            hvd.allreduce_(inplace, op=op, prescale_factor=pre, postscale_factor=post)
            torch.testing.assert_close(inplace, got, msg=lambda m: f"in place, {what}: {m}")
            grouped = hvd.grouped_allreduce([x, x[:2]], op=op, prescale_factor=pre, postscale_factor=post)
            torch.testing.assert_close(grouped[0], got, msg=lambda m: f"grouped, {what}: {m}")
    hvd.shutdown()


def _int_inputs(k: int, n: int):
    """Rank k's int64 input: large, sign-mixed and small values."""
    big = 2**53 + 1
    return [big, -big, (2**62) // n - k, -(2**62) // n + k, -7 if k == 0 else 2 + k, 3 * k - 4, 1, -1]


def check_integer_average():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    inputs = [_int_inputs(k, n) for k in range(n)]
    want = [trunc_div(sum(col), n) for col in zip(*inputs)]
    got = hvd.allreduce(torch.tensor(inputs[r], dtype=torch.int64), op=hvd.Average)
    assert got.tolist() == want, f"int64 Average: got {got.tolist()} want {want}"
    # Narrow dtypes, fused together in one group with mixed signs.
    for dtype, lo, hi in (
        (torch.int32, -(2**28), 2**28),
        (torch.int16, -4000, 4000),
        (torch.int8, -30, 30),
        (torch.uint8, 0, 60),
    ):
        g = torch.Generator().manual_seed(7)
        table = torch.randint(lo, hi, (n, 33), generator=g, dtype=torch.int64)
        want = [trunc_div(int(s), n) for s in table.sum(0).tolist()]
        got = hvd.grouped_allreduce([table[r].to(dtype), table[r].to(dtype)[:5]], op=hvd.Average)
        assert got[0].tolist() == want, f"{dtype} Average: got {got[0].tolist()} want {want}"
        assert got[1].tolist() == want[:5], f"{dtype} Average (second of a group): {got[1].tolist()}"
    # Every rank holds 1: the average is exactly 1 at every size.
    ones = hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Average)
    assert ones.tolist() == [1, 1, 1], ones
    # Pre/postscale on integers, where their order shows: each rank's value is
    # prescaled first (truncated), summed, divided exactly, then postscaled.
    vals = [3 + 2 * k for k in range(n)]  # odd: halving truncates each one
    pre = [int(v * 0.5) for v in vals]
    want = trunc_div(sum(pre), n) * 3
    got = hvd.allreduce(
        torch.tensor([vals[r]], dtype=torch.int32), op=hvd.Average, prescale_factor=0.5, postscale_factor=3.0
    )
    assert got.tolist() == [want], f"int Average with pre 0.5, post 3: got {got.tolist()} want {want}"
    hvd.shutdown()
