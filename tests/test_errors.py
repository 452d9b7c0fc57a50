"""Errors, never hangs: mismatches, bad arguments, a dead peer, a missing rank."""

import re
import signal

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [2, 3])
def test_mismatched_shape_raises_on_every_rank(nranks):
    results = run_ranks("tests.workers.errors:mismatched_shape", nranks, timeout=60)
    for r in results:
        assert f"rank {r.rank} raised" in r.output


def test_mismatched_dtype_op_root_and_allgather_shape():
    run_ranks("tests.workers.errors:mismatched_dtype_op_root", 2, timeout=60)


def test_bad_arguments_raise_value_error_locally():
    run_ranks("tests.workers.errors:bad_arguments", 2, timeout=60)


def test_killed_peer_makes_others_raise_at_once():
    # Detection of a dead peer must be clearly faster than the deadline, so
    # "at once" and "at the deadline" cannot be confused.
    timeout = 20
    results = run_ranks(
        "tests.workers.errors:peer_dies",
        3,
        timeout=90,
        expect_success=False,
        env={"HVDTORCH_TIMEOUT": str(timeout)},
        kill_rank=1,
        kill_after="READY-TO-DIE",
    )
    assert results[1].returncode == -9
    for r in (results[0], results[2]):
        assert r.returncode == 0, r.output
        m = re.search(r"raised after ([0-9.]+)s: (.*)", r.output)
        assert m, r.output
        assert float(m.group(1)) < timeout / 4, r.output
        # Every survivor names the rank that died, not a survivor that closed
        # its links on the way out.
        assert re.search(r"peer rank 1 \(pid \d+\) died", m.group(2)), r.output


def test_every_op_of_a_failed_fused_unit_raises():
    # A fused unit of several all-reduces fails in execution on rank 0: rank 1
    # negotiated it, then froze before sending any of its data (the worker
    # makes both certain, with no timing). Rank 0's unit fails at the
    # deadline, and each of its ops must raise, none waiting forever (this
    # test's deadline). The test kills the frozen rank 1 at the end.
    timeout = 5
    results = run_ranks(
        "tests.workers.errors:fused_unit_fails",
        2,
        timeout=60,
        expect_success=False,
        env={"HVDTORCH_TIMEOUT": str(timeout), "HVDTORCH_SHM": "0"},
        kill_rank=1,
        kill_after="FREEZE-ME",
        kill_signal=signal.SIGSTOP,
    )
    out = results[0].output
    assert results[0].returncode == 0, out
    assert "FREEZE-ME" in results[1].output, results[1].output
    m = re.search(r"rank 0: \d+ ops raised after ([0-9.]+)s, failed in unit", out)
    assert m and float(m.group(1)) < 4 * timeout, out


def test_live_rank_that_never_submits_gets_a_stall_warning_then_the_timeout(tmp_path):
    timeout, stall = 6.0, 1.0
    results = run_ranks(
        "tests.workers.errors:missing_rank_times_out",
        3,
        timeout=90,
        env={
            "HVDTORCH_TIMEOUT": str(timeout),
            "HVDTORCH_STALL_CHECK_TIME": str(stall),
            "HVDTORCH_TEST_FLAG": str(tmp_path / "raised"),
        },
    )
    # The coordinator (rank 0) warns once, naming who is missing.
    assert re.search(
        r"stall: allreduce 'only01' .* has waited [0-9.]+ s: ready on ranks \[0, 1\], "
        r"missing on ranks \[2\]",
        results[0].output,
    ), results[0].output
    for r in results[:2]:
        m = re.search(r"raised after ([0-9.]+)s: (.*)", r.output)
        assert m, r.output
        # The timeout path, not a shutdown: the deadline was waited out, and
        # not much longer (margin for a loaded 2-core machine).
        assert timeout <= float(m.group(1)) <= timeout + max(4.0, timeout / 2), r.output
        assert f"ranks [2] did not submit it within {timeout:g} s" in m.group(2), r.output
        assert "shut down" not in m.group(2), r.output


def test_distributed_model_raises_hvd_error_out_of_backward_and_leaves_nothing():
    """A peer killed in the middle of backward: loss.backward() raises
    hvdtorch.HvdError (not the RuntimeError torch makes of other C++ errors),
    naming the op and the dead rank; shutdown leaves no thread, fd or child;
    init works again. (The same on several real hosts: test_faults.py.)"""
    results = run_ranks(
        "tests.workers.faults:train_until_fault",
        2,
        args=["1", "3"],
        timeout=120,
        expect_success=False,
        env={"HVDTORCH_TIMEOUT": "20"},
        kill_rank=1,
        kill_after="VICTIM",
    )
    out = results[0].output
    assert results[0].returncode == 0, out
    m = re.search(r"SURVIVOR rank=0 at=[0-9.]+ type=(\w+) error=(.*)", out)
    assert m and m.group(1) == "HvdError", out
    assert re.search(r"allreduce 'model0\.g\d+\.b\d+'", m.group(2)) and "rank 1" in m.group(2), m.group(2)
    c = re.search(r"CLEAN rank=0 threads=(\d+)/(\d+) fds=(\d+)/(\d+) children=(\d+)", out)
    assert c, out
    t0, t1, f0, f1, kids = map(int, c.groups())
    assert (t1, f1, kids) == (t0, f0, 0), c.group(0) + out[-3000:]
    assert "REINIT-OK rank=0" in out, out


def test_a_frozen_rank_is_named_to_every_rank_through_the_coordinator():
    # Rank 0's wait on the frozen rank 2 times out; rank 1 waits on rank 0 meanwhile and must read rank
    # 0's last word naming rank 2, not "connection closed" by rank 0 (a Gloo timeout closes every
    # connection of its group unless the wait is ended without it: csrc/torch/c10d_deadline_watch.h).
    timeout = 4
    results = run_ranks(
        "tests.workers.errors:frozen_rank_named_by_the_coordinator",
        3,
        timeout=60,
        expect_success=False,
        env={"HVDTORCH_TIMEOUT": str(timeout), "HVDTORCH_SHM": "0", "HVDTORCH_DECENTRALIZED": "0"},
        kill_rank=2,
        kill_after="FREEZE-ME",
        kill_signal=signal.SIGSTOP,
    )
    assert "FREEZE-ME" in results[2].output, results[2].output
    for r in (0, 1):
        out = results[r].output
        assert results[r].returncode == 0, out
        m = re.search(rf"rank {r} raised after ([0-9.]+)s: (.*)", out)
        assert m, out
        assert "'stalled'" in m.group(2), out
        assert re.search(r"(receive from|send to) rank 2 (timed out|failed)", m.group(2)), out
        assert "closed" not in m.group(2), out
        assert float(m.group(1)) < 3 * timeout, out
