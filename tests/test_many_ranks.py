"""More ranks than cores: the collectives and a decentralized steady state.

`make test` runs 8 ranks; `make scale` runs HVDTORCH_TEST_RANKS=32 (about
5 minutes on two cores)."""

import os

from tests.harness import run_ranks

RANKS = int(os.environ.get("HVDTORCH_TEST_RANKS", "8"))


def test_collectives_and_steady_state_on_many_ranks():
    results = run_ranks(
        "tests.workers.scale:check_many_ranks",
        RANKS,
        timeout=120 + 12 * RANKS,
        env={"OMP_NUM_THREADS": "1", "HVDTORCH_TIMEOUT": str(60 + 4 * RANKS), "HVDTORCH_CALIBRATE": "0"},
    )
    lines = [line for r in results for line in r.output.splitlines() if line.startswith("NEGOTIATION")]
    assert len(lines) == RANKS, lines
    print("\n".join(lines))
