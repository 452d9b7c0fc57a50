"""Errors, never hangs: mismatches, bad arguments, a dead peer, a missing rank."""
import re
import time

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


def test_killed_peer_makes_others_raise_within_timeout():
    t0 = time.time()
    results = run_ranks("tests.workers.errors:peer_dies", 3, timeout=60, expect_success=False,
                        env={"HVDTORCH_TIMEOUT": "10"}, kill_rank=1, kill_after="READY-TO-DIE")
    elapsed = time.time() - t0
    assert results[1].returncode == -9
    for r in (results[0], results[2]):
        assert r.returncode == 0, r.output
        m = re.search(r"raised after ([0-9.]+)s", r.output)
        assert m and float(m.group(1)) <= 10, r.output
    assert elapsed < 45


def test_op_missing_on_one_rank_fails_on_the_others():
    # Rank 2 shuts down instead of joining the op: the others must be told.
    results = run_ranks("tests.workers.errors:missing_rank_times_out", 3, timeout=60,
                        env={"HVDTORCH_TIMEOUT": "5"})
    for r in results[:2]:
        assert "only01" in r.output and ("shut down" in r.output or "did not submit" in r.output), r.output
