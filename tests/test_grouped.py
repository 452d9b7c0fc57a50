"""grouped_allgather on 1-4 processes: values, gradients and errors; one op per test id."""

import pytest

from tests.harness import run_ranks

OPS = ["grouped_allgather", "grouped_allgather_async"]


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
@pytest.mark.parametrize("op", OPS)
def test_values(op, nranks):
    run_ranks("tests.workers.grouped:values", nranks, args=[op], timeout=180)


@pytest.mark.parametrize("nranks", [1, 2, 3])
@pytest.mark.parametrize("op", ["grouped_allgather"])
def test_gradient(op, nranks):
    run_ranks("tests.workers.grouped:gradient", nranks, args=[op], timeout=120)


@pytest.mark.parametrize("nranks", [1, 3])
@pytest.mark.parametrize("op", OPS)
def test_errors(op, nranks):
    results = run_ranks("tests.workers.grouped:errors", nranks, args=[op], timeout=120)
    for res in results:
        assert f"rank {res.rank} raised ValueError" in res.output, res.output
