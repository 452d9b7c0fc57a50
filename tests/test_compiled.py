"""Compiled models on 2 ranks (tests/workers/compiled.py; docs/guide.md,
"Compiled models")."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize(
    "check",
    ["every_route_compiled", "compiled_autograd", "compiled_autograd_refuses_optimizer", "graphs_split_at_buckets"],
)
def test_compiled(check):
    run_ranks(f"tests.workers.compiled:{check}", 2, timeout=300)
