"""Rank-side error scenarios: each must raise clearly, on every rank, fast."""
import time

import torch

import hvdtorch as hvd


def mismatched_shape():
    hvd.init()
    r = hvd.rank()
    t0 = time.time()
    try:
        hvd.allreduce(torch.ones(3 if r != 1 else 4), name="grad.w")
    except hvd.HvdError as e:
        msg = str(e)
        assert "mismatched allreduce 'grad.w'" in msg, msg
        assert "ranks [1]" in msg and "shape" in msg, msg
        print(f"rank {r} raised in {time.time() - t0:.2f}s: {msg}")
    else:
        raise AssertionError("mismatched shapes did not raise")
    assert time.time() - t0 < 5, "mismatch took too long to report"
    # The job goes on after a mismatch.
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(hvd.size())))
    hvd.shutdown()


def mismatched_dtype_op_root():
    hvd.init()
    r = hvd.rank()
    cases = [
        ("dtype", lambda: hvd.allreduce(torch.ones(3, dtype=torch.float32 if r else torch.float64), name="d")),
        ("reduce op", lambda: hvd.allreduce(torch.ones(3), op=hvd.Sum if r else hvd.Max, name="o")),
        ("root rank", lambda: hvd.broadcast(torch.ones(3), root_rank=r % 2, name="b")),
        ("shape", lambda: hvd.allgather(torch.ones(2, 3 + r), name="g")),
    ]
    for what, call in cases:
        try:
            call()
        except hvd.HvdError as e:
            assert what in str(e), f"{what}: {e}"
        else:
            raise AssertionError(f"mismatched {what} did not raise")
    hvd.shutdown()


def bad_arguments():
    hvd.init()
    h = hvd.allreduce_async(torch.ones(2), name="same")
    try:
        hvd.allreduce_async(torch.ones(2), name="same")
    except ValueError as e:
        assert "already pending" in str(e), e
    else:
        raise AssertionError("duplicate name accepted")
    hvd.synchronize(h)
    for what, call in [
        ("sparse", lambda: hvd.allreduce(torch.eye(3).to_sparse())),
        ("meta", lambda: hvd.allreduce(torch.empty(3, device="meta"))),
        ("dtype ComplexFloat is not supported", lambda: hvd.allreduce(torch.ones(3, dtype=torch.complex64))),
        ("Average is not defined for bool", lambda: hvd.allreduce(torch.ones(3, dtype=torch.bool))),
        ("root_rank", lambda: hvd.broadcast(torch.ones(3), root_rank=hvd.size())),
        ("Adasum", lambda: hvd.allreduce(torch.ones(3), op=hvd.Adasum)),
        ("unknown reducer", lambda: hvd.allreduce(torch.ones(3), reducer="bogus")),
    ]:
        try:
            call()
        except ValueError as e:
            assert what in str(e), f"{what}: {e}"
        else:
            raise AssertionError(f"{what} accepted")
    # Nothing was sent for the rejected calls: the ranks are still in step.
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(hvd.size())))
    hvd.shutdown()


def peer_dies():
    hvd.init()
    r = hvd.rank()
    hvd.allreduce(torch.ones(4), name="warmup")
    if r == 1:
        print("READY-TO-DIE", flush=True)
        time.sleep(60)  # the harness kills this rank now
        return
    time.sleep(0.5)
    t0 = time.time()
    try:
        for i in range(1000):
            hvd.allreduce(torch.ones(1000), name=f"after.{i}")
    except hvd.HvdError as e:
        print(f"rank {r} raised after {time.time() - t0:.1f}s: {e}", flush=True)
    else:
        raise AssertionError("no error although rank 1 died")
    # Every later call fails at once with the original reason.
    try:
        hvd.allreduce(torch.ones(1), name="later")
    except hvd.HvdError:
        pass
    else:
        raise AssertionError("engine kept accepting work after a peer died")


def missing_rank_times_out():
    hvd.init()
    r = hvd.rank()
    if r == 2:
        time.sleep(1)
        hvd.shutdown()
        return
    try:
        hvd.allreduce(torch.ones(3), name="only01")
    except hvd.HvdError as e:
        msg = str(e)
        print(f"rank {r}: {msg}", flush=True)
        assert "only01" in msg, msg
    else:
        raise AssertionError("op missing on rank 2 completed")
