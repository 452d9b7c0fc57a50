"""The gradient reducer's per-bucket strategies, through _C.GradientReducer on 2 and 3 ranks."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [2, 3])
def test_each_strategy_hands_back_the_average_or_this_ranks_shard(nranks):
    run_ranks("tests.workers.bucket_strategies:check_strategies", nranks, timeout=90)
