"""gradient_predivide_factor (a prescale 1/f and a postscale f around the
sum) cancels on every gradient route: DistributedModel, DistributedOptimizer,
the sharded optimizer (shard=1 and 2, in place and by reduce-scatter),
Compression.fp16 and Compression.powersgd; op=hvd.Adasum refuses it
(tests/workers/scale_factors.py)."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("shm", ["1", "0"], ids=["in-place", "reduce-scatter"])
def test_the_predivide_factor_cancels_on_every_route(shm):
    run_ranks("tests.workers.scale_factors:factor_cancels", 2, env={"HVDTORCH_SHM": shm}, timeout=150)
