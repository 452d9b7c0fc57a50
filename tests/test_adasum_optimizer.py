"""DistributedOptimizer(op=hvd.Adasum), Horovod's delta optimizer: equal to a
one-process reference on 1-4 ranks and in a process set, its contract's
errors, convergence on a small model, and the way the deltas go: through the
gradient core's reducer, one op per bucket, fp16 on its wire."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_equals_reference(nranks):
    run_ranks("tests.workers.adasum_optimizer:check_equivalence", nranks, timeout=180)


@pytest.mark.parametrize(
    "nranks,ranks_in_set", [(4, ["0", "2", "3"]), (3, ["1", "2"])], ids=["0-2-3", "without-rank-0"]
)
def test_equals_reference_in_process_set(nranks, ranks_in_set):
    run_ranks("tests.workers.adasum_optimizer:check_equivalence", nranks, args=ranks_in_set, timeout=180)


def test_contract():
    run_ranks("tests.workers.adasum_optimizer:check_contract", 2, timeout=120)


@pytest.mark.parametrize("nranks", [2, 3])
def test_converges(nranks):
    run_ranks("tests.workers.adasum_optimizer:check_convergence", nranks, timeout=180)


def test_deltas_go_through_the_reducer_one_op_per_bucket_passes_per_parameter(tmp_path):
    run_ranks("tests.workers.adasum_optimizer:check_one_op_per_bucket", 2, args=[str(tmp_path)], timeout=120)


@pytest.mark.parametrize("nranks", [2, 3])
def test_fp16_wire_equals_compressing_the_deltas(nranks):
    run_ranks("tests.workers.adasum_optimizer:check_wire", nranks, timeout=120)
