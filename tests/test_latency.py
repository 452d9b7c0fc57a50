"""The engine's per-op latency log, as Python reads it (the breakdown of
benchmarks/allreduce.py --breakdown)."""

from tests.harness import run_ranks


def test_every_waited_allreduce_logs_its_hand_off_phases():
    results = run_ranks("tests.workers.latency:phases_of_small_allreduces", 2, timeout=90)
    for r in results:
        assert f"rank {r.rank}: LATENCY-OK" in r.output, r.output
