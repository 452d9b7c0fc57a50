"""Sharded optimizer (ZeRO stages 1 and 2): N ranks train exactly like one
process on the global batch, the state per rank shrinks N-fold, checkpoints
move between job sizes, and misuse is named."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_training_equals_single_process_and_state_bytes_per_rank(nranks):
    run_ranks("tests.workers.zero:check_training", nranks, args=["quick" if nranks in (1, 4) else "all"], timeout=120)


@pytest.mark.parametrize("nranks", [2, 3])
def test_parameters_are_updated_when_step_returns(nranks):
    run_ranks("tests.workers.zero:check_parameters_after_step", nranks, timeout=120)


def test_training_with_the_all_gather():
    # Without shared memory there is no registered memory: parameters come back by all-gather, not in place.
    run_ranks("tests.workers.zero:check_training", 2, args=["quick"], timeout=120, env={"HVDTORCH_SHM": "0"})


@pytest.mark.parametrize("nranks", [2, 3])
def test_memory_held_per_rank(nranks):
    run_ranks("tests.workers.zero:check_memory_held", nranks, timeout=60)


def test_memory_held_per_rank_without_registered_memory():
    run_ranks("tests.workers.zero:check_memory_held", 2, timeout=60, env={"HVDTORCH_SHM": "0"})


def test_cpu_shards_fix_the_mmap_threshold():
    run_ranks("tests.workers.zero:check_cpu_shards_fix_the_mmap_threshold", 2, timeout=60)


@pytest.mark.parametrize("nranks", [1, 3])
def test_accumulation_clipping_compression_uneven_data(nranks):
    run_ranks("tests.workers.zero:check_accumulation_clipping_compression", nranks, timeout=120)


@pytest.mark.parametrize("saved,resumed", [(3, 2), (2, 1)])
def test_checkpoints_across_job_sizes(tmp_path, saved, resumed):
    run_ranks("tests.workers.zero:save_checkpoints", saved, args=[str(tmp_path)], timeout=90)
    run_ranks("tests.workers.zero:load_checkpoints", resumed, args=[str(tmp_path), str(saved)], timeout=90)


def test_errors():
    results = run_ranks("tests.workers.zero:check_errors", 2, timeout=60)
    for res in results:
        assert f"rank {res.rank} raised ValueError" in res.output, res.output


@pytest.mark.parametrize("nranks", [2, 3])
def test_join_with_uneven_data(nranks):
    run_ranks("tests.workers.zero:check_join", nranks, timeout=120)


def test_process_set():
    run_ranks("tests.workers.zero:check_process_set", 3, timeout=60)
