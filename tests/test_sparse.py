"""Sparse tensors: sparse_allreduce_async, and sparse gradients (nn.Embedding(sparse=True))
through DistributedOptimizer, all-gathered or densified, equal to single-process training."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_sparse_allreduce_equals_dense_reference(nranks):
    run_ranks("tests.workers.sparse:check_sparse_allreduce", nranks, timeout=90)


@pytest.mark.parametrize(
    "nranks,mode",
    [
        (1, "gather"),
        (2, "gather"),
        (3, "gather"),
        (4, "gather"),
        (2, "dense"),
        (3, "dense"),
        (3, "gather2"),
        (2, "absent0"),
        (3, "absent0"),
    ],
)
def test_sparse_embedding_training_equals_single_process(nranks, mode):
    run_ranks("tests.workers.sparse:check_embedding_training", nranks, args=[mode], timeout=120)


def test_sparse_adam_gets_sparse_gradients_back_with_sparse_as_dense():
    run_ranks("tests.workers.sparse:check_sparse_adam_with_sparse_as_dense", 2, timeout=90)


def test_gradient_turning_sparse_after_the_first_step_is_a_clear_error():
    run_ranks("tests.workers.sparse:check_sparse_gradient_turning_up_late", 2, timeout=60)


def test_distributed_model_rejects_sparse_embeddings_clearly():
    run_ranks("tests.workers.sparse:check_distributed_model_rejects_sparse_embeddings", 2, timeout=60)


@pytest.mark.parametrize("mode", ["gather", "absent0"])
def test_sparse_reductions_and_optimizer_over_a_process_set(mode):
    run_ranks("tests.workers.sparse:check_process_set", 3, args=[mode], timeout=120)
