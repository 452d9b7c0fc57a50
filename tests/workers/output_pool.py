"""Rank side of tests/test_output_pool.py: the fresh host outputs of the
collectives come from the output pool (csrc/torch/output_pool.h): a block
freed by its last tensor serves the next output of its size class (sizes
between class boundaries too), a tensor
still held is never written under, the pool keeps at most its limit, small
outputs bypass it, and shutdown() frees what it keeps."""

import time

import torch

import hvdtorch as hvd
from hvdtorch import _C
from tests.workers.common import available_reducers

MIB = 1 << 20


def _stats():
    return _C.output_pool_stats()


def _wait_returned(blocks: int) -> None:
    """Waits until ``blocks`` pooled blocks in all have come back: the
    engine's thread may drop its own reference to an output just after the
    op completed, and a block returns with the last reference."""
    deadline = time.monotonic() + 10
    while _stats()["returned"] < blocks:
        assert time.monotonic() < deadline, f"no block came back to the pool: {_stats()}"
        time.sleep(0.001)


def _x(numel: int, r: int) -> torch.Tensor:
    return torch.arange(numel, dtype=torch.float32) + r


def _sum_of_ranks(numel: int, n: int) -> torch.Tensor:
    return sum(_x(numel, q) for q in range(n))


def reuse_and_never_under_a_held_tensor() -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    numel = MIB // 4  # 1 MiB of float32
    assert _stats()["limit_bytes"] == 256 * MIB, _stats()
    a = hvd.allreduce(_x(numel, r), op=hvd.Sum, name="a")
    where = a.data_ptr()
    del a
    _wait_returned(1)
    before = _stats()
    # A nearby size has the same size class: the freed block serves it.
    b = hvd.allreduce(_x(numel - 3, r), op=hvd.Sum, name="b")
    after = _stats()
    assert b.data_ptr() == where, (hex(b.data_ptr()), hex(where))
    assert after["reused"] == before["reused"] + 1 and after["fresh"] == before["fresh"], (before, after)
    torch.testing.assert_close(b, _sum_of_ranks(numel - 3, n))
    # Held (b itself, and a view of another output): never handed out again while held.
    view = hvd.allreduce(_x(numel, r), op=hvd.Sum, name="c")[: numel // 2]
    held = {b.data_ptr(), view.data_ptr()}
    for k in range(4):
        out = hvd.allreduce(_x(numel, r + 10 * k), op=hvd.Sum, name=f"d{k}")
        assert out.data_ptr() not in held, k
        torch.testing.assert_close(out, _sum_of_ranks(numel, n) + 10 * k * n)
    torch.testing.assert_close(b, _sum_of_ranks(numel - 3, n))
    torch.testing.assert_close(view, _sum_of_ranks(numel, n)[: numel // 2])
    # Storage on the pool is resizable, as torch's own.
    b.resize_(2 * numel)
    b[numel:] = 1.0
    # Small outputs bypass the pool.
    small = _stats()
    for k in range(3):
        hvd.allreduce(_x(1000, r), name=f"small{k}")
    assert {k: _stats()[k] for k in ("reused", "fresh")} == {k: small[k] for k in ("reused", "fresh")}
    hvd.shutdown()


def _size_class(nbytes: int) -> int:
    """OutputPool::sizeClass: eight classes per power of two."""
    step = (1 << (nbytes.bit_length() - 1)) // 8
    return -(-nbytes // step) * step


def reuse_between_class_boundaries() -> None:
    """Outputs of sizes between two class boundaries (1 MiB + 40 KiB, + 100
    KiB, ...: all in the class of 1 MiB + 128 KiB) each reuse the block the
    last one freed: it is filed by its class, not by the size asked for.
    So eight such outputs in turn map one block, and the pool keeps that one
    class-sized block, not a block per size (up to its limit)."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    sizes = [MIB + k * 1024 for k in (40, 100, 13, 127, 64, 1, 90, 120)]  # bytes, one class
    cls = _size_class(sizes[0])
    assert cls == MIB + 128 * 1024 and all(_size_class(b) == cls for b in sizes), cls
    base = _stats()
    where = None
    for k, nbytes in enumerate(sizes):
        numel = nbytes // 4
        before = _stats()
        out = hvd.allreduce(_x(numel, r), op=hvd.Sum, name=f"between{k}")
        after = _stats()
        torch.testing.assert_close(out, _sum_of_ranks(numel, n))
        if k == 0:
            assert after["fresh"] == before["fresh"] + 1, (before, after)
            where = out.data_ptr()
        else:
            assert out.data_ptr() == where, (k, nbytes, hex(out.data_ptr()), hex(where))
            assert after["reused"] == before["reused"] + 1 and after["fresh"] == before["fresh"], (k, before, after)
        del out
        _wait_returned(before["returned"] + 1)
        s = _stats()
        # Held as one block of its class: what the next output of the class takes.
        assert s["kept_blocks"] == base["kept_blocks"] + 1 and s["kept_bytes"] == base["kept_bytes"] + cls, (k, s)
    s = _stats()
    assert s["fresh"] == base["fresh"] + 1 and s["reused"] == base["reused"] + len(sizes) - 1, (base, s)
    assert s["dropped"] == base["dropped"], (base, s)
    hvd.shutdown()


def every_op_with_a_fresh_output() -> None:
    """Each op that returns a new host tensor takes it from the pool: a second
    call after the first output is freed reuses it."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    rows = MIB // 4 // 16  # 1 MiB of float32 as rows of 16
    x = torch.full((rows * n, 16), float(r + 1))
    calls = {
        "allreduce": lambda k: hvd.allreduce(x, name=f"ar{k}"),
        "grouped_allreduce": lambda k: hvd.grouped_allreduce([x, x], name=f"gar{k}"),
        "allgather": lambda k: hvd.allgather(x, name=f"ag{k}"),
        "broadcast": lambda k: hvd.broadcast(x, root_rank=0, name=f"bc{k}"),
        "alltoall": lambda k: hvd.alltoall(x, name=f"a2a{k}"),
        "reducescatter": lambda k: hvd.reducescatter(x, name=f"rs{k}"),
        "reduce": lambda k: hvd.reduce(x, root_rank=0, name=f"red{k}"),
    }
    for op, call in calls.items():
        returned = _stats()["returned"]
        call(0)  # the first output is freed on return
        _wait_returned(returned + 1)
        before = _stats()
        out = call(1)
        after = _stats()
        assert after["reused"] > before["reused"], (op, before, after)
        del out
    hvd.shutdown()


def fresh_allreduce_reads_its_input() -> None:
    """An out-of-place all-reduce on every reducer (the node reducer reads
    the input and writes the output itself: Reducer::allreduceInto) gives
    the reduction of the inputs, in an output that held an earlier result,
    and leaves the input as it was; with a prescale factor too."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for reducer in available_reducers(hvd.runtime.state().engine):
        for k, pre in enumerate((1.0, 1.0, 3.0)):  # the second call reuses the first's freed output
            x = torch.arange(MIB // 4, dtype=torch.float32) + 10.0 * r + k
            kept = x.clone()
            out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=pre, name=f"in.{reducer}.{k}", reducer=reducer)
            want = pre * sum(torch.arange(MIB // 4, dtype=torch.float32) + 10.0 * q + k for q in range(n))
            torch.testing.assert_close(out, want, msg=lambda m: f"rank {r}: {reducer}, call {k}: {m}")
            assert torch.equal(x, kept), f"rank {r}: {reducer}, call {k}: the input changed"
            del out
    hvd.shutdown()


def bounded_and_released() -> None:
    """HVDTORCH_OUTPUT_POOL_BYTES=4 MiB: eight freed 1 MiB outputs leave at
    most 4 MiB kept, the rest freed; shutdown() frees what it keeps, and an
    output held past it stays valid and is freed when it goes."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    numel = MIB // 4
    assert _stats()["limit_bytes"] == 4 * MIB, _stats()
    outs = [hvd.allreduce(_x(numel, r + k), op=hvd.Sum, name=f"o{k}") for k in range(8)]
    dropped, returned = _stats()["dropped"], _stats()["returned"]
    del outs
    _wait_returned(returned + 8)
    s = _stats()
    assert s["kept_bytes"] <= 4 * MIB and s["kept_blocks"] >= 1, s
    assert s["dropped"] >= dropped + 4, s
    kept_past = hvd.allreduce(_x(numel, r), op=hvd.Sum, name="past")
    hvd.shutdown()
    s = _stats()
    assert s["limit_bytes"] == 0 and s["kept_bytes"] == 0 and s["kept_blocks"] == 0, s
    torch.testing.assert_close(kept_past, _sum_of_ranks(numel, n))
    del kept_past  # the engine has stopped: the last reference was this one
    assert _stats()["dropped"] == s["dropped"] + 1 and _stats()["kept_bytes"] == 0, _stats()


def turned_off() -> None:
    """HVDTORCH_OUTPUT_POOL_BYTES=0: every output is torch's own allocation."""
    hvd.init()
    r = hvd.rank()
    for k in range(3):
        hvd.allreduce(_x(MIB // 4, r), name=f"off{k}")
    s = _stats()
    assert s["limit_bytes"] == 0 and s["reused"] == 0 and s["fresh"] == 0 and s["kept_bytes"] == 0, s
    hvd.shutdown()
