"""Seeded fuzzing of op sequences on 3 ranks (the generator: tests/workers/fuzz.py).

`make test` runs a fixed seed with at least 2,000 ops; `make fuzz` runs many
seeds and more steps (FUZZ_SEEDS, FUZZ_STEPS). A failure names the seed and
the op; FUZZ_SEEDS=N pytest tests/test_fuzz.py reproduces it.
"""

import os
import re

import pytest

from tests.harness import run_ranks

SEEDS = [int(s) for s in os.environ.get("FUZZ_SEEDS", "1").split(",")]
STEPS = int(os.environ.get("FUZZ_STEPS", "560"))


@pytest.mark.parametrize("seed", SEEDS)
def test_random_op_sequences_return_the_reference_or_the_documented_error(seed):
    # A small response cache, so that entries are evicted all the time.
    results = run_ranks(
        "tests.workers.fuzz:run",
        3,
        args=[str(seed), str(STEPS)],
        timeout=60 + STEPS * 0.5,
        env={"HVDTORCH_TIMEOUT": "20", "HVDTORCH_CACHE_CAPACITY": "6"},
    )
    for r in results:
        m = re.search(r"FUZZ rank=(\d) planned=(\d+) ops=(\d+) checked=(\d+) mismatches=(\d+) invalid=(\d+)", r.output)
        assert m, r.output
        planned, ops, checked, mismatches, invalid = map(int, m.groups()[1:])
        assert checked + mismatches + invalid == ops, m.group(0)
        assert mismatches > 0 and invalid > 0, f"seed {seed}: the faults were not exercised: {m.group(0)}"
    if STEPS >= 560:
        assert planned >= 2000, f"seed {seed}: only {planned} ops in the plan"
