"""Adasum (op=hvd.Adasum, reducer="adasum") on 1-4 processes against a
reference tree written in the test; errors."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
@pytest.mark.parametrize("op", ["allreduce_adasum"])
def test_values(op, nranks):
    run_ranks("tests.workers.adasum:values", nranks, timeout=120)


@pytest.mark.parametrize("op", ["allreduce_adasum"])
def test_values_across_emulated_hosts(op):
    run_ranks("tests.workers.adasum:values", 4, hosts=list("aabb"), timeout=120)


@pytest.mark.parametrize("op", ["allreduce_adasum"])
def test_errors(op):
    results = run_ranks("tests.workers.adasum:errors", 2, timeout=120)
    for res in results:
        assert f"rank {res.rank} raised ValueError" in res.output, res.output
