"""broadcast on 1-4 processes: values from every root in every form, on two
emulated hosts, in a process set without rank 0, and errors; one op per
test id. Gradients: tests/test_autograd.py; the object and parameter
helpers: tests/test_training.py and tests/test_process_sets.py; a joined
root: tests/test_join.py."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_values(nranks):
    run_ranks("tests.workers.broadcast:values", nranks, timeout=240)


@pytest.mark.parametrize("shm", ["0", "1"])
def test_values_over_each_transport_and_two_hosts(shm):
    run_ranks("tests.workers.broadcast:values", 4, hosts=list("aabb"), timeout=240, env={"HVDTORCH_SHM": shm})


@pytest.mark.parametrize("nranks", [1, 3])
def test_errors(nranks):
    results = run_ranks("tests.workers.broadcast:errors", nranks, timeout=120)
    for res in results:
        assert f"rank {res.rank} raised ValueError" in res.output, res.output


def test_in_a_process_set_without_rank_0():
    run_ranks("tests.workers.broadcast:in_a_set_without_rank_0", 3, timeout=120)
