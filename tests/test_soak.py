"""Nothing grows: DistributedModel steps and init()/shutdown() cycles on 2 ranks.

`make test` runs short versions; `make soak` the long ones (SOAK_STEPS=20000,
SOAK_CYCLES=1000). After a warm-up, RSS (after malloc_trim, sampled through
the run: the minimum of the last samples against that of the first, see
_RssTrend in tests/workers/soak.py) may grow by at most 8 MiB and the
numbers of threads and file descriptors must not grow at all; no shared-memory
segment of any of the jobs may exist at the end.
"""

import os
import re

from tests.harness import run_ranks

STEPS = int(os.environ.get("SOAK_STEPS", "1500"))
CYCLES = int(os.environ.get("SOAK_CYCLES", "40"))
RSS_LIMIT_KIB = 8 * 1024


def _check(results, what, n):
    for r in results:
        m = re.search(
            rf"SOAK rank=(\d) what={what} n=(\d+) rss_growth_kib=(-?\d+) threads=(\d+)/(\d+) "
            rf"fds=(\d+)/(\d+) shm=(\d+)",
            r.output,
        )
        assert m, r.output
        _, count, rss, t0, t1, f0, f1, shm = map(int, m.groups())
        assert count == n, m.group(0)
        assert rss <= RSS_LIMIT_KIB, f"rank {r.rank}: RSS grew by {rss} KiB over {n} {what}: {m.group(0)}"
        assert t1 <= t0 and f1 <= f0, f"rank {r.rank}: threads or fds grew: {m.group(0)}"
        assert shm == 0, f"rank {r.rank}: {shm} shared-memory segments left: {m.group(0)}"
        print(m.group(0))  # make soak (-s) shows the numbers it checked


def test_distributed_model_steps_do_not_grow():
    warmup = min(200, STEPS // 5)
    results = run_ranks(
        "tests.workers.soak:train",
        2,
        args=[str(STEPS), str(warmup)],
        timeout=60 + STEPS * 0.05,
        env={"HVDTORCH_TIMEOUT": "30"},
    )
    _check(results, "train", STEPS - warmup)


def test_init_shutdown_cycles_do_not_grow():
    warmup = min(50, CYCLES // 2)
    results = run_ranks(
        "tests.workers.soak:cycles",
        2,
        args=[str(CYCLES), str(warmup)],
        timeout=60 + CYCLES * 2,
        env={"HVDTORCH_TIMEOUT": "30"},
    )
    _check(results, "cycles", CYCLES - warmup)
