"""shard=3 (parameters sharded at rest): N ranks train exactly like one
process on the global batch in every supported pattern, nothing stays
gathered between uses, full state dicts move between job sizes, and misuse
is named."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_training_equals_single_process(nranks):
    run_ranks("tests.workers.zero3:check_training", nranks, args=["all" if nranks == 2 else "quick"], timeout=180)


def test_training_with_the_all_gather_between_hosts():
    run_ranks("tests.workers.zero3:check_training", 2, args=["quick"], timeout=120, env={"HVDTORCH_SHM": "0"})


@pytest.mark.parametrize("nranks", [2, 3])
def test_memory_at_rest(nranks):
    run_ranks("tests.workers.zero3:check_memory_at_rest", nranks, timeout=120)


def test_memory_at_rest_reduce_scattered():
    run_ranks("tests.workers.zero3:check_memory_at_rest", 2, timeout=120, env={"HVDTORCH_SHM": "0"})


def test_kept_buckets():
    run_ranks("tests.workers.zero3:check_kept_buckets", 2, timeout=120)


def test_gathered_parameters_and_state_dicts_across_job_sizes(tmp_path):
    env = {"ZERO3_CKPT": str(tmp_path / "full.pt")}
    run_ranks("tests.workers.zero3:check_gathered_parameters_and_state_dicts", 2, timeout=120, env=env)
    run_ranks("tests.workers.zero3:check_load_saved_elsewhere", 3, timeout=120, env=env)


def test_errors():
    run_ranks("tests.workers.zero3:check_errors", 2, timeout=120)


def test_eval_and_inference():
    run_ranks("tests.workers.zero3:check_eval_and_inference", 2, timeout=120)
