"""grouped_allreduce is differentiable as Horovod's: on 1-4 ranks and inside a process set."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_grouped_allreduce_gradients(nranks):
    run_ranks("tests.workers.grouped_allreduce_grad:check_gradients", nranks, timeout=120)


def test_grouped_allreduce_gradients_in_process_set():
    run_ranks("tests.workers.grouped_allreduce_grad:check_gradients_in_process_set", 4, timeout=120)
