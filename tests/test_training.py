"""DistributedModel / DistributedOptimizer: N ranks train exactly like one process on the global batch."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_distributed_model_equals_single_process(nranks):
    run_ranks(
        "tests.workers.training:check_distributed_model", nranks, timeout=280, args=["all" if nranks != 4 else "quick"]
    )


@pytest.mark.parametrize("nranks", [2, 3])
def test_unused_tied_and_mixed_dtype_parameters(nranks):
    run_ranks("tests.workers.training:check_special_models", nranks, timeout=120)


@pytest.mark.parametrize("nranks", [2, 3])
def test_accumulation_optimizer_and_broadcasts(nranks):
    run_ranks("tests.workers.training:check_accumulation_and_optimizer", nranks, timeout=180)


@pytest.mark.parametrize("nranks", [2, 3])
def test_unused_parameters_zero_filled_every_iteration(nranks):
    run_ranks("tests.workers.training:check_unused_zero_fill_over_iterations", nranks, timeout=120)


@pytest.mark.parametrize("nranks", [2, 3])
def test_gradient_predivide_factor(nranks):
    run_ranks("tests.workers.training:check_gradient_predivide_factor", nranks, timeout=120)


@pytest.mark.parametrize("nranks", [2, 3])
def test_buckets_reduced_in_place_in_registered_memory(nranks):
    run_ranks(
        "tests.workers.training:check_buckets_reduced_in_place",
        nranks,
        timeout=120,
        env={"HVDTORCH_FUSION_THRESHOLD": "0"},
    )


def test_plain_buckets_without_shared_memory():
    run_ranks(
        "tests.workers.training:check_no_registered_memory_without_shm", 2, timeout=120, env={"HVDTORCH_SHM": "0"}
    )


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_parameter_unused_everywhere_left_alone(nranks):
    run_ranks("tests.workers.training:unused_everywhere_like_one_process", nranks, timeout=120)
