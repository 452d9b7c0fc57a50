"""Every collective, every dtype, awkward shapes, on 1-4 ranks, against a local reference."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_all_collectives(nranks):
    run_ranks("tests.workers.collectives:check_all", nranks, timeout=240)


@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("shm", ["0", "1"])
def test_reducers_selected_per_call(nranks, shm):
    run_ranks("tests.workers.collectives:check_reducers", nranks, timeout=240, env={"HVDTORCH_SHM": shm})


@pytest.mark.parametrize("shm", ["0", "1"])
def test_large_messages_over_each_transport(shm):
    run_ranks("tests.workers.collectives:check_large_ring", 2, timeout=240, env={"HVDTORCH_SHM": shm})


@pytest.mark.parametrize("hosts", [["a", "a", "b", "b"], ["a", "b", "a", "b"]])
def test_allgather_across_hosts(hosts):
    run_ranks("tests.workers.collectives:allgather_across_hosts", 4, hosts=hosts, timeout=180)
