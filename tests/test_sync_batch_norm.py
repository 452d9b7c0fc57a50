"""hvd.SyncBatchNorm: N ranks with their shards equal one BatchNorm on the global batch."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_sync_batch_norm_equals_batch_norm_on_the_global_batch(nranks):
    run_ranks("tests.workers.sync_batch_norm:check_against_batch_norm", nranks, timeout=150)


@pytest.mark.parametrize("nranks", [2, 3])
def test_training_with_sync_batch_norm_equals_single_process(nranks):
    run_ranks("tests.workers.sync_batch_norm:check_training_with_optimizer", nranks, timeout=120)


@pytest.mark.parametrize("nranks", [1, 2])
def test_sync_batch_norm_bad_input(nranks):
    run_ranks("tests.workers.sync_batch_norm:check_bad_input", nranks, timeout=60)


def test_sync_batch_norm_over_a_process_set():
    run_ranks("tests.workers.sync_batch_norm:check_process_set", 3, timeout=90)
