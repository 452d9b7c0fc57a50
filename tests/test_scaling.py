"""Average and scale factors on every path, and exact integer averages."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_average_keeps_pre_and_postscale(nranks):
    run_ranks("tests.workers.scaling:check_float_scaling", nranks, timeout=120)


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_integer_average_is_exact(nranks):
    run_ranks("tests.workers.scaling:check_integer_average", nranks, timeout=120)
