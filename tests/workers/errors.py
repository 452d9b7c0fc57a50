"""Rank-side error scenarios: each must raise clearly, on every rank, fast."""

import os
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
    # A mismatch is reported in the cycle that sees it, far below the deadline.
    timeout = float(os.environ["HVDTORCH_TIMEOUT"])
    assert time.time() - t0 < timeout / 4, f"mismatch took too long to report (HVDTORCH_TIMEOUT={timeout:g})"
    # The job goes on after a mismatch.
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(hvd.size())))
    hvd.shutdown()


def mismatched_dtype_op_root():
    """Rank 1 differs from the others in one field per case; every rank raises,
    and the message says what differs and what each side submitted."""
    hvd.init()
    r = hvd.rank()
    odd = r == 1
    cases = [
        (
            "dtype float32 vs float64",
            lambda: hvd.allreduce(torch.ones(3, dtype=torch.float64 if odd else torch.float32), name="d"),
            "float32 [3]",
            "float64 [3]",
        ),
        (
            "reduce op Sum vs Max",
            lambda: hvd.allreduce(torch.ones(3), op=hvd.Max if odd else hvd.Sum, name="o"),
            "Sum)",
            "Max)",
        ),
        (
            "reduce op Average vs Sum",
            lambda: hvd.allreduce(torch.ones(3), op=hvd.Sum if odd else hvd.Average, name="a"),
            "Average)",
            "Sum)",
        ),
        (
            "scale factors (prescale 1, postscale 1) vs (prescale 2, postscale 1)",
            lambda: hvd.allreduce(torch.ones(3), prescale_factor=2.0 if odd else 1.0, name="pre"),
            "",
            "",
        ),
        (
            "scale factors (prescale 1, postscale 1) vs (prescale 1, postscale 3)",
            lambda: hvd.allreduce(torch.ones(3), postscale_factor=3.0 if odd else 1.0, name="post"),
            "",
            "",
        ),
        (
            "root rank 0 vs 1",
            lambda: hvd.broadcast(torch.ones(3), root_rank=1 if odd else 0, name="b"),
            "root 0",
            "root 1",
        ),
        (
            "shape [2, 3] vs [2, 4]",
            lambda: hvd.allgather(torch.ones(2, 4 if odd else 3), name="g"),
            "float32 [2, 3]",
            "float32 [2, 4]",
        ),
        (
            "shape [3] vs [4]",
            lambda: hvd.allreduce(torch.ones(4 if odd else 3), name="s"),
            "float32 [3]",
            "float32 [4]",
        ),
    ]
    others = [k for k in range(hvd.size()) if k != 1]
    for what, call, mine, theirs in cases:
        try:
            call()
        except hvd.HvdError as e:
            msg = str(e)
            assert what in msg, f"rank {r}, {what}: {msg}"
            assert f"ranks {others} submitted" in msg and "ranks [1] submitted" in msg, f"rank {r}: {msg}"
            assert mine in msg and theirs in msg, f"rank {r}, {what}: {msg}"
        else:
            raise AssertionError(f"rank {r}: mismatched {what} did not raise")
    # Still in step afterwards.
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(hvd.size())))
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
        ("no reducer serves Adasum on int32", lambda: hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum)),
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
    """Rank 2 stays alive and keeps its engine running but never submits
    "only01": ranks 0 and 1 see a stall warning, then the timeout error. Then
    every rank meets again on a new op, so the job ends cleanly."""
    hvd.init()
    r = hvd.rank()
    flag = os.environ["HVDTORCH_TEST_FLAG"]
    if r == 2:
        deadline = time.time() + 120
        while not os.path.exists(flag):  # rank 0 creates it once it has raised
            assert time.time() < deadline, "ranks 0 and 1 never reported the timeout"
            time.sleep(0.05)
    else:
        t0 = time.time()
        try:
            hvd.allreduce(torch.ones(3), name="only01")
        except hvd.HvdError as e:
            print(f"rank {r} raised after {time.time() - t0:.2f}s: {e}", flush=True)
        else:
            raise AssertionError("op missing on rank 2 completed")
        if r == 0:
            open(flag, "w").close()
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after"), torch.full((2,), 3.0))
    hvd.shutdown()
