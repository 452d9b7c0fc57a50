"""Every reducer on every topology, and the shared-memory transport's failure behaviour."""

import os
import re

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("layout", ["a", "ab", "aab", "aaaa", "aabb", "abcd"])
def test_every_reducer_on_topology(layout):
    # One letter per rank: ranks with the same letter share an (emulated) host.
    run_ranks("tests.workers.reducers:every_reducer", len(layout), hosts=list(layout), args=[layout], timeout=280)


def test_every_reducer_without_shared_memory():
    run_ranks(
        "tests.workers.reducers:every_reducer",
        4,
        hosts=list("aabb"),
        args=["aabb"],
        timeout=280,
        env={"HVDTORCH_SHM": "0"},
    )


@pytest.mark.parametrize("reducer", ["auto", "ring"])
def test_registered_buffers_take_the_registered_reducer_under_auto(reducer):
    run_ranks(
        "tests.workers.reducers:registered_buffers_take_the_registered_reducer",
        2,
        args=[reducer],
        timeout=90,
        env={"HVDTORCH_REDUCER": reducer, "HVDTORCH_CALIBRATE": "0"},
    )


def test_killed_rank_leaves_no_shared_memory():
    results = run_ranks(
        "tests.workers.reducers:dies_during_node_allreduce",
        3,
        timeout=90,
        expect_success=False,
        env={"HVDTORCH_TIMEOUT": "15"},
        kill_rank=1,
        kill_after="SHM-IN-USE",
    )
    assert results[1].returncode == -9
    for r in (results[0], results[2]):
        assert r.returncode == 0 and "raised" in r.output, r.output
    # This job's segments only: other jobs on the machine (a parallel test run) make and remove their own.
    token = re.search(r"SHM-TOKEN (\S+)", results[0].output).group(1)
    leftover = [f for f in os.listdir("/dev/shm") if f.startswith(f"hvdtorch-{token}")]
    assert not leftover, f"shared-memory segments left in /dev/shm: {sorted(leftover)}"


def test_stopped_peer_hits_the_deadline_not_a_hang():
    import signal

    results = run_ranks(
        "tests.workers.reducers:stopped_peer_hits_deadline",
        3,
        timeout=90,
        expect_success=False,
        env={"HVDTORCH_TIMEOUT": "4"},
        kill_rank=1,
        kill_after="STOP-ME",
        kill_signal=signal.SIGSTOP,
    )
    for r in (results[0], results[2]):
        assert r.returncode == 0, r.output
        m = re.search(r"raised after ([0-9.]+)s", r.output)
        assert m and float(m.group(1)) < 30, r.output
