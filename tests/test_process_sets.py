"""Process sets: ops, gradients, training and errors inside subsets of ranks."""

from tests.harness import run_ranks


def test_process_sets_ops_training_and_errors():
    run_ranks("tests.workers.process_sets:check_process_sets", 4, timeout=240)


def test_mismatch_inside_a_set_names_the_set():
    run_ranks("tests.workers.process_sets:check_mismatch_in_set", 4, timeout=120)


def test_bucket_order_comes_from_the_sets_first_rank_in_a_set_without_rank_0():
    run_ranks("tests.workers.process_sets:check_bucket_order_in_a_set_without_rank_0", 3, timeout=90)


def test_module_state_and_shards_come_from_the_sets_first_rank_in_a_set_without_rank_0():
    run_ranks("tests.workers.process_sets:check_module_state_and_shards_in_a_set_without_rank_0", 3, timeout=90)
