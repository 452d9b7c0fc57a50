"""Horovod's names and behaviours beyond the collectives: exceptions, build flags,
is_homogeneous, the run-time timeline, average=, and DistributedOptimizer's contract."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [1, 2])
def test_exception_classes_and_build_flags(nranks):
    run_ranks("tests.workers.horovod_names:check_names_and_flags", nranks, timeout=60)


@pytest.mark.parametrize(
    "hosts,expected",
    [
        (["a", "a", "b", "b"], "yes"),
        (["a", "a", "b"], "no"),
        # local_size * cross_size equals the world size on rank 3 here although
        # the hosts differ: the answer must come from every host's count.
        (["a", "a", "a", "b", "b", "c"], "no"),
    ],
)
def test_is_homogeneous_is_the_same_on_every_rank(hosts, expected):
    run_ranks(
        "tests.workers.horovod_names:check_is_homogeneous",
        len(hosts),
        hosts=hosts,
        args=[expected],
        env={"HVDTORCH_CALIBRATE": "0"},
        timeout=120,
    )


def test_lost_peer_raises_horovod_internal_error():
    results = run_ranks(
        "tests.workers.horovod_names:lost_peer",
        2,
        timeout=60,
        expect_success=False,
        env={"HVDTORCH_TIMEOUT": "10"},
        kill_rank=1,
        kill_after="READY-TO-DIE",
    )
    assert results[0].returncode == 0 and "caught HorovodInternalError" in results[0].output, results[0].output


@pytest.mark.parametrize("nranks", [1, 3])
def test_average_argument_on_every_op(nranks):
    run_ranks("tests.workers.horovod_names:check_average_argument", nranks, timeout=60)


def test_timeline_started_and_stopped_at_run_time(tmp_path):
    run_ranks("tests.workers.horovod_names:check_timeline_at_run_time", 2, args=[str(tmp_path)], timeout=60)


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_optimizer_without_names_with_predivide_and_accumulation_equals_reference(nranks):
    run_ranks("tests.workers.horovod_names:check_optimizer_training", nranks, timeout=120)


@pytest.mark.parametrize("nranks", [1, 2])
def test_optimizer_misuse_raises_and_warns_as_horovod(nranks):
    run_ranks("tests.workers.horovod_names:check_optimizer_misuse", nranks, timeout=90)
