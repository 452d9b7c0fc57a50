"""Ops inside a process set smaller than the job: values and gradients scale
by, and travel within, the set (a 2-rank set in a 3-rank job)."""

from tests.harness import run_ranks


def test_reducescatter_values_and_gradient_scale_by_the_set():
    run_ranks("tests.workers.process_set_paths:check_reducescatter_in_set", 3, timeout=90)


def test_alltoall_values_and_gradient_stay_in_the_set():
    run_ranks("tests.workers.process_set_paths:check_alltoall_in_set", 3, timeout=90)


def test_broadcast_optimizer_state_stays_in_the_set():
    run_ranks("tests.workers.process_set_paths:check_broadcast_optimizer_state_in_set", 3, timeout=90)
