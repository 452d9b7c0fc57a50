"""Rank-side checks of every collective against a reference computed locally.

Every rank can compute every other rank's input (inputs are a function of
rank and case), so each rank checks the full result by itself.
"""

import torch

import hvdtorch as hvd
from tests.workers.common import available_reducers

DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
]
OPS = {hvd.Sum: "Sum", hvd.Average: "Average", hvd.Min: "Min", hvd.Max: "Max", hvd.Product: "Product"}


def value(rank: int, shape, dtype, case: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * case + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    low = 0 if dtype == torch.uint8 else -2
    # Small integers: sums and products are exact in every dtype, so results
    # can be compared exactly whatever order a reducer adds them in.
    v = torch.randint(low, 3, shape, generator=g)
    v[v == 0] = 1  # keeps products informative
    return v.to(dtype)


def reference(op: int, inputs):
    if inputs[0].dtype == torch.bool:
        stack = torch.stack(inputs)
        return stack.any(0) if op in (hvd.Sum, hvd.Max) else stack.all(0)
    wide = torch.stack([t.double() for t in inputs])
    if op in (hvd.Sum, hvd.Average):
        out = wide.sum(0)
    elif op == hvd.Min:
        out = wide.min(0).values
    elif op == hvd.Max:
        out = wide.max(0).values
    else:
        out = wide.prod(0)
    if op == hvd.Average:
        out = out * (1.0 / len(inputs))
        if not inputs[0].dtype.is_floating_point:
            out = out.trunc()
    return out.to(inputs[0].dtype)


def shapes(n: int):
    return [(), (0,), (1,), (max(n - 1, 1),), (7, 3), (5, 1, 3)]


def assert_equal(got, want, what, exact=True):
    # Sums of small integers are exact; Average scales in the dtype itself,
    # which may round one ulp away from the float64 reference.
    if got.dtype.is_floating_point and (not exact or got.dtype in (torch.float16, torch.bfloat16)):
        torch.testing.assert_close(got, want, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(got, want), f"{what}: got {got.flatten()[:8].tolist()} want {want.flatten()[:8].tolist()}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"


def check_allreduce(reducers=("auto",)):
    r, n = hvd.rank(), hvd.size()
    case = 0
    for reducer in reducers:
        for dtype in DTYPES:
            for op in OPS:
                if dtype == torch.bool and op == hvd.Average:
                    continue
                for shape in shapes(n):
                    case += 1
                    inputs = [value(k, shape, dtype, case) for k in range(n)]
                    want = reference(op, inputs)
                    got = hvd.allreduce(inputs[r], op=op, name=f"ar.{case}", reducer=reducer)
                    exact = op != hvd.Average
                    assert_equal(got, want, f"allreduce {OPS[op]} {dtype} {shape} reducer={reducer}", exact)
                    inplace = inputs[r].clone()
                    hvd.allreduce_(inplace, op=op, reducer=reducer)
                    assert_equal(inplace, want, f"allreduce_ {OPS[op]} {dtype} {shape} reducer={reducer}", exact)


def check_large():
    r, n = hvd.rank(), hvd.size()
    count = 1_000_003
    x = torch.arange(count, dtype=torch.float32) % 97 + r
    want = (torch.arange(count, dtype=torch.float32) % 97) * n + sum(range(n))
    for reducer in ("ring", "auto"):
        assert_equal(hvd.allreduce(x, op=hvd.Sum, reducer=reducer), want, f"large allreduce {reducer}")
    avg = hvd.allreduce(x, op=hvd.Average)
    torch.testing.assert_close(avg, want / n)


def check_scales_and_async():
    r, n = hvd.rank(), hvd.size()
    x = torch.full((10,), float(r + 1), dtype=torch.float64)
    total = float(sum(range(1, n + 1)))
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
    assert_equal(got, torch.full((10,), total * 0.5, dtype=torch.float64), "pre/postscale")
    # Many named async ops submitted in a rank-dependent order.
    names = [f"async.{i}" for i in range(12)]
    order = names[r:] + names[:r]
    handles = {}
    for nm in order:
        i = names.index(nm)
        handles[nm] = hvd.allreduce_async(torch.full((i + 1,), float(i + r)), name=nm, op=hvd.Sum)
    for nm, h in handles.items():
        i = names.index(nm)
        assert_equal(hvd.synchronize(h), torch.full((i + 1,), float(i * n + sum(range(n)))), f"async {nm}")
    # Grouped allreduce with mixed dtypes.
    ts = [torch.full((3,), float(r)), torch.full((2, 2), r, dtype=torch.int32), torch.ones(5, dtype=torch.float64)]
    outs = hvd.grouped_allreduce(ts, op=hvd.Sum)
    s = float(sum(range(n)))
    assert_equal(outs[0], torch.full((3,), s), "grouped[0]")
    assert_equal(outs[1], torch.full((2, 2), int(s), dtype=torch.int32), "grouped[1]")
    assert_equal(outs[2], torch.full((5,), float(n), dtype=torch.float64), "grouped[2]")
    ts2 = [t.clone() for t in ts]
    hvd.grouped_allreduce_(ts2, op=hvd.Sum)
    assert_equal(ts2[0], outs[0], "grouped_ in place")
    # poll eventually turns true.
    h = hvd.allreduce_async(torch.ones(3), name="polled")
    import time

    deadline = time.time() + 10
    while not hvd.poll(h):
        assert time.time() < deadline, "poll never became true"
        time.sleep(0.001)
    assert_equal(hvd.synchronize(h), torch.ones(3), "polled result")


def check_noncontiguous():
    r, n = hvd.rank(), hvd.size()
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) + r
    view = base.t()  # non-contiguous
    want = (torch.arange(12, dtype=torch.float32).reshape(3, 4) * n + sum(range(n))).t()
    assert_equal(hvd.allreduce(view, op=hvd.Sum), want, "non-contiguous allreduce")
    hvd.allreduce_(view, op=hvd.Sum)
    assert_equal(view, want, "non-contiguous allreduce_")
    assert_equal(base.t(), want, "non-contiguous allreduce_ wrote through to the base")
    col = (torch.arange(8.0).reshape(4, 2) + r)[:, 1]
    g = hvd.allgather(col)
    assert g.shape == (4 * n,)


def check_allgather():
    r, n = hvd.rank(), hvd.size()
    for case, dtype in enumerate(DTYPES):
        rows = [k % 3 for k in range(n)]  # some ranks contribute no rows
        mine = value(r, (rows[r], 2, 3), dtype, 500 + case)
        got = hvd.allgather(mine, name=f"ag.{case}")
        want = torch.cat([value(k, (rows[k], 2, 3), dtype, 500 + case) for k in range(n)])
        assert_equal(got, want, f"allgather {dtype}")
        scalar = hvd.allgather(value(r, (), dtype, 700 + case))
        want = torch.stack([value(k, (), dtype, 700 + case) for k in range(n)])
        assert_equal(scalar, want, f"allgather scalar {dtype}")


def check_all():
    hvd.init()
    check_allreduce()
    check_large()
    check_scales_and_async()
    check_noncontiguous()
    check_allgather()  # broadcast: tests/workers/broadcast.py
    hvd.barrier()
    hvd.shutdown()


def check_reducers():
    """Every reducer, selected per call, on a reduced dtype/shape matrix."""
    hvd.init()
    global DTYPES
    DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]
    check_allreduce(reducers=available_reducers(hvd.runtime.state().engine))
    hvd.shutdown()


def check_large_ring():
    """Chunks of many segments: over Gloo a send completes only once the peer
    posted its receive, which a ring must never wait on before posting its own."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    count = 6_000_000  # 24 MB: > 2 x window segments of 1 MiB per chunk
    x = torch.full((count,), float(r + 1))
    for reducer in ("ring", "central", "auto"):
        got = hvd.allreduce(x, op=hvd.Sum, reducer=reducer, name=f"big.{reducer}")
        assert torch.equal(got, torch.full((count,), float(sum(range(1, n + 1))))), reducer
    hvd.shutdown()


def allgather_across_hosts():
    """All-gathers between emulated hosts of two ranks each (the hierarchical
    all-gather, csrc/core/algorithms/hierarchical_allgather.h): every dtype,
    ranks with no rows, scalars, and a grouped all-gather of tensors whose
    rows differ per rank."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    check_allgather()
    mine = [value(r, (r + t, 3), torch.float32, 900 + t) for t in range(3)]
    got = hvd.grouped_allgather(mine, name="ag.grouped.hosts")
    for t in range(3):
        want = torch.cat([value(k, (k + t, 3), torch.float32, 900 + t) for k in range(n)])
        assert_equal(got[t], want, f"grouped allgather tensor {t}")
    hvd.shutdown()
