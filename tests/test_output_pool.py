"""The output pool on 2 ranks (tests/workers/output_pool.py): reuse, also of
sizes between class boundaries, a held tensor never reused under it, every
op with a fresh host output, the bound, the release at shutdown, and the
knob turning it off."""

from tests.harness import run_ranks


def test_reuse_and_never_under_a_held_tensor():
    run_ranks("tests.workers.output_pool:reuse_and_never_under_a_held_tensor", 2, timeout=120)


def test_reuse_between_class_boundaries():
    run_ranks("tests.workers.output_pool:reuse_between_class_boundaries", 2, timeout=120)


def test_every_op_with_a_fresh_output():
    run_ranks("tests.workers.output_pool:every_op_with_a_fresh_output", 2, timeout=120)


def test_fresh_allreduce_reads_its_input():
    run_ranks("tests.workers.output_pool:fresh_allreduce_reads_its_input", 2, timeout=120)


def test_bounded_and_released():
    run_ranks(
        "tests.workers.output_pool:bounded_and_released",
        2,
        timeout=120,
        env={"HVDTORCH_OUTPUT_POOL_BYTES": str(4 << 20)},
    )


def test_turned_off():
    run_ranks("tests.workers.output_pool:turned_off", 2, timeout=120, env={"HVDTORCH_OUTPUT_POOL_BYTES": "0"})
