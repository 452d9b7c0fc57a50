"""Gradients of allreduce, allgather and broadcast with row-distinct upstream gradients."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_collective_gradients(nranks):
    run_ranks("tests.workers.autograd:check_gradients", nranks, timeout=120)
