"""reducescatter and grouped_reducescatter on 1-4 processes: values,
gradients and errors; one op per test id."""

import pytest

from tests.harness import run_ranks

OPS = ["reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async"]


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
@pytest.mark.parametrize("op", OPS)
def test_values(op, nranks):
    run_ranks("tests.workers.reducescatter:values", nranks, args=[op], timeout=240)


# One host with shared memory runs the node reducer's reduce-scatter; without
# it, or across emulated hosts, the ring's.
@pytest.mark.parametrize(
    "hosts,shm", [("aaa", "0"), ("aabb", "1"), ("abc", "1")], ids=["ring-c10d", "ring-two-hosts", "ring-three-hosts"]
)
@pytest.mark.parametrize("op", ["reducescatter"])
def test_values_per_algorithm(op, hosts, shm):
    run_ranks(
        "tests.workers.reducescatter:values",
        len(hosts),
        hosts=list(hosts),
        args=[op],
        timeout=240,
        env={"HVDTORCH_SHM": shm},
    )


@pytest.mark.parametrize("nranks", [1, 2, 3])
@pytest.mark.parametrize("op", ["reducescatter", "grouped_reducescatter"])
def test_gradient(op, nranks):
    run_ranks("tests.workers.reducescatter:gradient", nranks, args=[op], timeout=120)


@pytest.mark.parametrize("nranks", [1, 3])
@pytest.mark.parametrize("op", ["reducescatter", "grouped_reducescatter"])
def test_errors(op, nranks):
    results = run_ranks("tests.workers.reducescatter:errors", nranks, args=[op], timeout=120)
    for res in results:
        assert f"rank {res.rank} raised ValueError" in res.output, res.output
