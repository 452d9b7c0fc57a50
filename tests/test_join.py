"""join() (Horovod's hvd.join): uneven numbers of batches per rank."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_collectives_go_on_while_ranks_have_joined(nranks):
    run_ranks("tests.workers.join:check_collectives_with_joined_ranks", nranks, timeout=90)


@pytest.mark.parametrize("kind,nranks", [("optimizer", 2), ("optimizer", 3), ("model", 2), ("model", 3)])
def test_uneven_batches_train_to_the_end_equal_to_the_reference(kind, nranks):
    run_ranks("tests.workers.join:train_uneven", nranks, args=[kind], timeout=120)
