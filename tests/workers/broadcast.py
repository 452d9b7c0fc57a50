"""Rank-side checks of broadcast: values from every root in every form
against the root's input (each rank can compute every rank's input), the
input of the out-of-place forms untouched, a process set without rank 0,
and every error case."""

import time

import torch

import hvdtorch as hvd
from tests.workers.collectives import DTYPES, assert_equal, value
from tests.workers.common import expect as _expect

FORMS = ["broadcast", "broadcast_", "broadcast_async", "broadcast_async_"]


def _run(form: str, tensor, root: int, name=None, process_set=None):
    """One broadcast through `form`; returns what the caller sees (the tensor itself for the in-place forms)."""
    if form == "broadcast":
        return hvd.broadcast(tensor, root, name=name, process_set=process_set)
    if form == "broadcast_":
        return hvd.broadcast_(tensor, root, name=name, process_set=process_set)
    if form == "broadcast_async":
        return hvd.synchronize(hvd.broadcast_async(tensor, root, name=name, process_set=process_set))
    return hvd.synchronize(hvd.broadcast_async_(tensor, root, name=name, process_set=process_set))


def values():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    case = 0
    for dtype in DTYPES:
        for shape in ((), (0,), (4, 5)):
            for root in range(n):
                for form in FORMS:
                    case += 1
                    x = value(r, shape, dtype, case)
                    want = value(root, shape, dtype, case)
                    got = _run(form, x, root)
                    what = f"{form} {dtype} {shape} root {root}"
                    assert_equal(got, want, what)
                    if form.endswith("_"):
                        assert got is x, f"{what}: the in-place form returned another tensor"
                    else:
                        assert_equal(x, value(r, shape, dtype, case), f"{what}: the input changed")
    # A non-contiguous tensor: in place, the result reaches the view's base.
    for form in ("broadcast", "broadcast_"):
        base = torch.arange(12.0).reshape(3, 4) + 100 * r
        got = _run(form, base.t(), n - 1)
        want = (torch.arange(12.0).reshape(3, 4) + 100 * (n - 1)).t()
        assert_equal(got, want, f"{form} non-contiguous")
        if form == "broadcast_":
            assert_equal(base.t(), want, "broadcast_ of a view wrote through to its base")
    hvd.shutdown()


def errors():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    me = f"rank {r}: broadcast"
    t0 = time.time()
    # A root outside the world: raised locally on every rank, before anything is sent.
    for bad in (n, -1):
        _expect(
            ValueError,
            [me, f"'root.{bad}'", f"root_rank {bad} is not a rank in [0, {n})"],
            lambda: hvd.broadcast(torch.ones(3), bad, name=f"root.{bad}"),
            r,
        )
    assert time.time() - t0 < 5, "local errors took too long"
    if n > 1:
        # Disagreements across ranks: an error on every rank naming what differs and who sent what.
        last = n - 1
        others = list(range(last))
        _expect(
            hvd.HvdError,
            ["mismatched broadcast 'roots'", "root rank 0 vs 1", f"ranks {others} submitted", f"ranks [{last}]"],
            lambda: hvd.broadcast(torch.ones(3), 1 if r == last else 0, name="roots"),
            r,
        )
        _expect(
            hvd.HvdError,
            ["mismatched broadcast 'shapes'", "shape [3] vs [4]", f"ranks [{last}] submitted"],
            lambda: hvd.broadcast(torch.ones(4 if r == last else 3), 0, name="shapes"),
            r,
        )
        _expect(
            hvd.HvdError,
            ["mismatched broadcast 'dtypes'", "dtype float32 vs int64"],
            lambda: hvd.broadcast(torch.ones(3, dtype=torch.int64 if r == last else torch.float32), 0, name="dtypes"),
            r,
        )
    # Still in step: a correct broadcast works.
    assert_equal(
        hvd.broadcast(torch.full((2,), float(r)), n - 1, name="after"), torch.full((2,), float(n - 1)), "after"
    )
    hvd.shutdown()


def in_a_set_without_rank_0():
    """Set [1, 2] of 3 ranks: root_rank is a global rank of the set (2, the
    set's rank 1); rank 0, outside it, runs a global op meanwhile and is
    refused a set op; a root outside the set is an error."""
    hvd.init()
    r = hvd.rank()
    pair = hvd.add_process_set([1, 2])
    h = hvd.allreduce_async(torch.full((2,), float(r)), op=hvd.Sum, name="global")
    if pair.included():
        for root in (2, 1):
            x = torch.full((3,), float(r))
            got = hvd.broadcast(x, root, process_set=pair)
            assert_equal(got, torch.full((3,), float(root)), f"broadcast in the set, root {root}")
            assert_equal(x, torch.full((3,), float(r)), "broadcast in a set changed its input")
            y = torch.full((3,), float(r))
            hvd.broadcast_(y, root, process_set=pair)
            assert_equal(y, torch.full((3,), float(root)), f"broadcast_ in the set, root {root}")
        _expect(
            ValueError,
            [f"rank {r}: broadcast", "root_rank 0 is not in process set 1 [1, 2]"],
            lambda: hvd.broadcast(torch.ones(1), 0, process_set=pair),
            r,
        )
    else:
        _expect(
            ValueError, ["does not include this rank"], lambda: hvd.broadcast(torch.ones(1), 1, process_set=pair), r
        )
    assert_equal(hvd.synchronize(h), torch.full((2,), 3.0), "the global all-reduce beside the set")
    hvd.barrier()  # rank 0's shutdown would stop the set's ops still pending
    hvd.shutdown()
