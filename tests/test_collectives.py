"""Every collective, every dtype, awkward shapes, on 1-4 ranks, against a local reference."""
import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_all_collectives(nranks):
    run_ranks("tests.workers.collectives:check_all", nranks, timeout=240)


@pytest.mark.parametrize("nranks", [2, 3])
def test_reducers_selected_per_call(nranks):
    run_ranks("tests.workers.collectives:check_reducers", nranks, timeout=240)
