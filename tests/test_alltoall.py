"""alltoall on 1-4 processes: values, gradients and errors; one op per test id."""

import pytest

from tests.harness import run_ranks

OPS = ["alltoall", "alltoall_async"]


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
@pytest.mark.parametrize("op", OPS)
def test_values(op, nranks):
    run_ranks("tests.workers.alltoall:values", nranks, args=[op], timeout=240)


@pytest.mark.parametrize("shm", ["0", "1"])
@pytest.mark.parametrize("op", ["alltoall"])
def test_values_over_each_transport_and_two_hosts(op, shm):
    run_ranks("tests.workers.alltoall:values", 4, hosts=list("aabb"), args=[op], timeout=240, env={"HVDTORCH_SHM": shm})


@pytest.mark.parametrize("nranks", [1, 2, 3])
@pytest.mark.parametrize("op", ["alltoall"])
def test_gradient(op, nranks):
    run_ranks("tests.workers.alltoall:gradient", nranks, args=[op], timeout=120)


@pytest.mark.parametrize("nranks", [1, 3])
@pytest.mark.parametrize("op", OPS)
def test_errors(op, nranks):
    results = run_ranks("tests.workers.alltoall:errors", nranks, args=[op], timeout=120)
    for res in results:
        assert f"rank {res.rank} raised ValueError" in res.output, res.output
