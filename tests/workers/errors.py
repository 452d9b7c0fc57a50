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
        (
            "dtype ComplexFloat is not supported (hvdtorch reduces uint8, int8",
            lambda: hvd.allreduce(torch.ones(3, dtype=torch.complex64)),
        ),
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


FUSED_OPS = 4


class _GatedGroup(torch.distributed.ProcessGroup):
    """A Gloo group whose point-to-point calls (the engine's links over it)
    first call `gate()`, on the engine thread that posts them."""

    def __init__(self, inner, gate):
        super().__init__(inner.rank(), inner.size())
        self.inner, self.gate = inner, gate

    def send(self, tensors, dst, tag):
        self.gate()
        return self.inner.send(tensors, dst, tag)

    def recv(self, tensors, src, tag):
        self.gate()
        return self.inner.recv(tensors, src, tag)


def _freeze_this_rank():
    """Stops the whole rank (SIGSTOP) from the calling thread, after saying FREEZE-ME; the call never
    returns, whenever the stop lands (the test kills the rank at the end)."""
    import signal
    import threading

    print("FREEZE-ME", flush=True)
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    threading.Event().wait()


# The gated groups, for the life of the rank: the engine's calls reach their Python methods only while
# the objects live.
_KEPT_GROUPS = []


def _init_with_gates(gated_rank: int, control_gate, data_gate=None):
    """hvd.init(), with rank `gated_rank`'s engine talking through _GatedGroups: its control group
    calls `control_gate`, its data group `data_gate` (if given), before each point-to-point call."""
    from hvdtorch import _C

    engine_class = _C.Engine
    if int(os.environ["RANK"]) == gated_rank:

        def gated_engine(opts, rank, hosts, control, data, *rest):
            groups = [_GatedGroup(control, control_gate), _GatedGroup(data, data_gate) if data_gate else data]
            _KEPT_GROUPS.extend(groups)
            return engine_class(opts, rank, hosts, *groups, *rest)

        _C.Engine = gated_engine
    try:
        hvd.init()
    finally:
        _C.Engine = engine_class


def fused_unit_fails():
    """FUSED_OPS all-reduces, negotiated together and so one fused unit, fail
    in execution on rank 0: rank 1 negotiated them, then froze before it
    posted any of their data. Every op of the unit must raise, none left
    waiting (the test's deadline catches one that waits). An op that failed
    in its unit says so: "rank 0: allreduce '<the unit's first op>' failed".

    Both are certain, by order, not timing. Rank 1's engine talks through
    gates: its control and data groups wrapped (links over c10d:
    HVDTORCH_SHM=0), each point-to-point call first calling the gate.
    - One unit. Rank 0 submits the ops, then an all-reduce: once that
      returns on rank 1, rank 0's control thread has taken the ops into a
      cycle no later than the one it negotiated in. Rank 1 then holds its
      control thread at its next link call (inside a cycle, after that
      cycle took its new ops; rank 0's cycle waits on it meanwhile),
      submits all the ops and lets it go: its next cycle takes them
      together, and it is the first in which any of them is pending on
      every rank, so one answer holds them all and they fuse.
    - Negotiated, never exchanged. Rank 1 has nothing else in flight: the
      first data-link call its engine makes after that is the unit's first
      message, posted by its executor. There rank 1 stops (SIGSTOP), and
      that call never returns. Rank 0 gets none of rank 1's data: its unit
      fails at the deadline. The test kills rank 1 at the end (FREEZE-ME)."""
    import re
    import threading

    timeout = float(os.environ["HVDTORCH_TIMEOUT"])
    held, release, freeze = threading.Event(), threading.Event(), threading.Event()
    hold = threading.Event()

    def control_gate():
        if hold.is_set():
            hold.clear()
            held.set()
            release.wait()

    def data_gate():
        if freeze.is_set():
            _freeze_this_rank()

    _init_with_gates(1, control_gate, data_gate)
    r, n = hvd.rank(), hvd.size()
    tensors = [torch.full((1 << 16,), float(k + 1)) for k in range(FUSED_OPS)]  # 256 KB each

    def submit(tag):
        return [hvd.allreduce_async(t, op=hvd.Sum, name=f"{tag}.{k}", reducer="ring") for k, t in enumerate(tensors)]

    for k, h in enumerate(submit("warm")):  # links made, rank 1's gates in use
        assert torch.equal(hvd.synchronize(h), tensors[k] * n)
    t0 = time.time()
    if r == 0:
        hs = submit("fused")
    hvd.allreduce(torch.ones(1), op=hvd.Sum, name="submitted", reducer="ring")
    if r == 1:
        hold.set()
        assert held.wait(4 * timeout), "rank 1: the control thread never reached a link"
        freeze.set()
        hs = submit("fused")
        release.set()
    errors = []
    for h in hs:
        try:
            hvd.synchronize(h)
        except hvd.HvdError as e:
            errors.append(str(e))
    took = time.time() - t0
    for e in errors:
        print(f"rank {r} op error: {e[:300]}", flush=True)
    units = [m.group(1) for m in (re.match(r"rank \d+: allreduce '([^']+)' failed: ", e) for e in errors) if m]
    print(f"rank {r}: {len(errors)} ops raised after {took:.1f}s, failed in unit: {units}", flush=True)
    assert len(units) == FUSED_OPS and len(set(units)) == 1, f"rank {r}: the ops did not all fail in one unit: {errors}"


def frozen_rank_named_by_the_coordinator():
    """Rank 2 freezes (SIGSTOP) at its next control-link call: every link is
    over Gloo (HVDTORCH_SHM=0) and every cycle a star exchange through rank 0
    (HVDTORCH_DECENTRALIZED=0), so rank 1 sent its message and waits for
    rank 0's answer while rank 0's wait on rank 2 times out. Rank 0's last
    word must still reach rank 1, naming rank 2: a timed-out wait on one Gloo
    link must not close the group's other connections. Certain by order, not
    timing: rank 1 waits a grace longer than rank 0 (Context::relayGrace)."""
    import threading

    freeze = threading.Event()

    def control_gate():
        if freeze.is_set():
            _freeze_this_rank()

    _init_with_gates(2, control_gate)
    r = hvd.rank()
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="warm"), torch.full((2,), 3.0))
    if r == 2:
        freeze.set()
    t0 = time.time()
    try:
        hvd.allreduce(torch.ones(2), op=hvd.Sum, name="stalled")
    except hvd.HvdError as e:
        print(f"rank {r} raised after {time.time() - t0:.1f}s: {e}", flush=True)
        hvd.shutdown()
        return
    raise AssertionError(f"rank {r}: the all-reduce returned although rank 2 is frozen")
