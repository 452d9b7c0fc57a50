"""Rank-side checks of reduce: the root's result against a reference built
from every rank's input (each rank can compute them all), every other
rank's output equal to its own input, the inputs of the out-of-place forms
untouched, a process set without rank 0, joined ranks, and every error
case."""

import time

import torch

import hvdtorch as hvd
from tests.workers.collectives import DTYPES, OPS, assert_equal, reference, value
from tests.workers.common import expect as _expect

FORMS = ["reduce", "reduce_", "reduce_async", "reduce_async_"]


def _run(form: str, tensor, root: int, op, name=None, process_set=None):
    """One reduce through `form`; returns what the caller sees (the tensor itself for the in-place forms)."""
    kw = dict(op=op, name=name, process_set=process_set)
    if form == "reduce":
        return hvd.reduce(tensor, root, **kw)
    if form == "reduce_":
        return hvd.reduce_(tensor, root, **kw)
    if form == "reduce_async":
        return hvd.synchronize(hvd.reduce_async(tensor, root, **kw))
    return hvd.synchronize(hvd.reduce_async_(tensor, root, **kw))


def values():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    case = 0
    for dtype in DTYPES:
        for op in OPS:
            if dtype == torch.bool and op == hvd.Average:
                continue
            for shape in ((), (0,), (7, 3)):
                for root in range(n):
                    case += 1
                    form = FORMS[case % len(FORMS)]
                    inputs = [value(k, shape, dtype, case) for k in range(n)]
                    x = inputs[r].clone()
                    got = _run(form, x, root, op)
                    what = f"{form} {OPS[op]} {dtype} {shape} root {root} on rank {r}"
                    if r == root:
                        assert_equal(got, reference(op, inputs), what, exact=op != hvd.Average)
                    else:
                        assert_equal(got, inputs[r], f"{what}: a non-root's output is not its input")
                    if form.endswith("_"):
                        assert got is x, f"{what}: the in-place form returned another tensor"
                    else:
                        assert_equal(x, inputs[r], f"{what}: the input changed")
                        assert got is not x, f"{what}: the out-of-place form returned its input"
    # Average by default, root 0 by default; a non-contiguous input.
    got = hvd.reduce(torch.full((3,), float(r + 1), dtype=torch.float64))
    want = torch.full((3,), sum(range(1, n + 1)) / n if r == 0 else r + 1.0, dtype=torch.float64)
    assert_equal(got, want, "reduce with the defaults", exact=False)
    base = torch.arange(12.0).reshape(3, 4) + r
    hvd.reduce_(base.t(), n - 1, op=hvd.Sum)
    want = torch.arange(12.0).reshape(3, 4) * n + sum(range(n)) if r == n - 1 else torch.arange(12.0).reshape(3, 4) + r
    assert_equal(base, want, "reduce_ of a view wrote through to its base (the root only)")
    hvd.shutdown()


def errors():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    me = f"rank {r}: reduce"
    t0 = time.time()
    # Raised locally on every rank, naming it, before anything is sent.
    for bad in (n, -1):
        _expect(
            ValueError,
            [me, f"'root.{bad}'", f"root_rank {bad} is not a rank in [0, {n})"],
            lambda: hvd.reduce(torch.ones(3), bad, name=f"root.{bad}"),
            r,
        )
    _expect(ValueError, [me, "Adasum has no reduce"], lambda: hvd.reduce(torch.ones(3), 0, op=hvd.Adasum), r)
    _expect(
        ValueError,
        [me, "Average is not defined for bool"],
        lambda: hvd.reduce(torch.ones(3, dtype=torch.bool), 0, op=hvd.Average),
        r,
    )
    _expect(ValueError, ["unknown reduce op 9"], lambda: hvd.reduce(torch.ones(3), 0, op=9), r)
    assert time.time() - t0 < 5, "local errors took too long"
    if n > 1:
        # Disagreements across ranks: an error on every rank naming what differs and who sent what.
        last = n - 1
        others = list(range(last))
        _expect(
            hvd.HvdError,
            ["mismatched reduce 'roots'", "root rank 0 vs 1", f"ranks {others} submitted", f"ranks [{last}] submitted"],
            lambda: hvd.reduce(torch.ones(3), 1 if r == last else 0, op=hvd.Sum, name="roots"),
            r,
        )
        _expect(
            hvd.HvdError,
            ["mismatched reduce 'ops'", "reduce op Sum vs Max", f"ranks [{last}] submitted"],
            lambda: hvd.reduce(torch.ones(3), 0, op=hvd.Max if r == last else hvd.Sum, name="ops"),
            r,
        )
        _expect(
            hvd.HvdError,
            ["mismatched reduce 'shapes'", "shape [3] vs [4]", f"ranks [{last}] submitted"],
            lambda: hvd.reduce(torch.ones(4 if r == last else 3), 0, name="shapes"),
            r,
        )
    # Still in step: a correct reduce works.
    got = hvd.reduce(torch.full((2,), float(r)), n - 1, op=hvd.Sum, name="after")
    assert_equal(got, torch.full((2,), float(sum(range(n)) if r == n - 1 else r)), "after")
    hvd.shutdown()


def in_a_set_without_rank_0():
    """Set [1, 2] of 3 ranks: root_rank is a global rank of the set; rank 0,
    outside it, runs a global reduce meanwhile; a root outside the set is an
    error."""
    hvd.init()
    r = hvd.rank()
    pair = hvd.add_process_set([1, 2])
    h = hvd.reduce_async(torch.full((2,), float(r)), 0, op=hvd.Sum, name="global")
    if pair.included():
        for root in (2, 1):
            x = torch.full((3,), float(r))
            got = hvd.reduce(x, root, op=hvd.Sum, process_set=pair)
            assert_equal(got, torch.full((3,), 3.0 if r == root else float(r)), f"reduce in the set, root {root}")
            # Average divides by the set's size.
            y = torch.full((3,), float(r))
            hvd.reduce_(y, root, op=hvd.Average, process_set=pair)
            assert_equal(
                y, torch.full((3,), 1.5 if r == root else float(r)), f"reduce_ Average in the set, root {root}"
            )
        _expect(
            ValueError,
            [f"rank {r}: reduce", "root_rank 0 is not in process set 1 [1, 2]"],
            lambda: hvd.reduce(torch.ones(1), 0, process_set=pair),
            r,
        )
    assert_equal(hvd.synchronize(h), torch.full((2,), 3.0 if r == 0 else float(r)), "the global reduce beside the set")
    hvd.barrier()  # rank 0's shutdown would stop the set's ops still pending
    hvd.shutdown()


def with_a_joined_rank():
    """The last rank joins at once: a Sum or Average reduce goes on with its
    zeros (Average still divides by every rank), a Min cannot, and a reduce
    whose root has joined is an error naming it."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    last = n - 1
    if r != last:
        got = hvd.reduce(torch.full((2,), float(r + 1)), 0, op=hvd.Sum, name="sum")
        active = sum(range(1, n))
        assert_equal(got, torch.full((2,), float(active) if r == 0 else float(r + 1)), "Sum with a joined rank")
        got = hvd.reduce(torch.full((2,), float(r + 1)), 0, op=hvd.Average, name="avg")
        assert_equal(got, torch.full((2,), active / n if r == 0 else float(r + 1)), "Average", exact=False)
        _expect(
            hvd.HvdError,
            [f"cannot run while ranks [{last}] have joined"],
            lambda: hvd.reduce(torch.ones(2), 0, op=hvd.Min, name="min"),
            r,
        )
        _expect(
            hvd.HvdError,
            ["reduce 'to.joined'", f"its root rank [{last}] has joined"],
            lambda: hvd.reduce(torch.ones(2), last, op=hvd.Sum, name="to.joined"),
            r,
        )
    assert hvd.join() == (0 if n == 1 else n - 2)
    hvd.shutdown()
