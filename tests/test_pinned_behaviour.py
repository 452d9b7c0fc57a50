"""Behaviours pinned so that breaking them fails a test (each was a mutation
of tools/mutants.toml that the rest of the suite let through): the bucket
layout of DistributedModel and DistributedOptimizer (a wrong layout still
trains correctly, so only the layout itself can show it), and what a
parameter unused in a pass contributes when gradients accumulate."""

import torch

from hvdtorch.training.buckets import complete_order, layers_by_name, plan_buckets
from tests.harness import run_ranks


def _params(*specs):
    """specs: (numel, dtype) per parameter."""
    return [torch.zeros(n, dtype=dt) for n, dt in specs]


def test_buckets_fill_up_to_the_cap_with_a_smaller_first_bucket():
    f32 = torch.float32
    params = _params(*[(25, f32)] * 8)  # 100 bytes each
    # First bucket capped at 250 bytes (2 params), the rest at 400 (4 params).
    assert plan_buckets(params, range(8), 400, 250) == [[0, 1], [2, 3, 4, 5], [6, 7]]
    # A cap that a parameter fills exactly still takes it.
    assert plan_buckets(params, range(8), 300, 200) == [[0, 1], [2, 3, 4], [5, 6, 7]]
    # No first-bucket cap: every bucket up to fusion_bytes.
    assert plan_buckets(params, range(8), 400, 0) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # The order given is the order of filling.
    assert plan_buckets(params, reversed(range(8)), 400, 0) == [[7, 6, 5, 4], [3, 2, 1, 0]]


def test_a_parameter_larger_than_the_cap_gets_a_bucket_of_its_own():
    f32 = torch.float32
    params = _params((25, f32), (1000, f32), (25, f32))
    assert plan_buckets(params, range(3), 400, 0) == [[0], [1], [2]]


def test_buckets_hold_one_dtype_and_fusion_bytes_zero_means_one_per_parameter():
    f32, f64, bf16 = torch.float32, torch.float64, torch.bfloat16
    params = _params((10, f32), (10, f64), (10, f32), (10, bf16), (10, f64))
    layout = plan_buckets(params, range(5), 1 << 20, 0)
    assert sorted(sorted(b) for b in layout) == [[0, 2], [1, 4], [3]]
    for b in layout:
        assert len({params[i].dtype for i in b}) == 1, layout
    assert plan_buckets(params, range(5), 0, 0) == [[0], [1], [2], [3], [4]]


def test_a_layer_stays_in_one_bucket_where_it_fits():
    f32 = torch.float32
    params = _params(*[(25, f32)] * 6)  # 100 bytes each
    layers = ["a", "a", "b", "b", "c", "c"]
    assert plan_buckets(params, range(6), 300, 0) == [[0, 1, 2], [3, 4, 5]]
    # The bucket that would end with layer b's first parameter closes before it.
    assert plan_buckets(params, range(6), 300, 0, layer_of=layers) == [[0, 1], [2, 3], [4, 5]]
    # A bucket that is all one layer is split by size as before.
    assert plan_buckets(params, range(6), 300, 0, layer_of=["a"] * 6) == [[0, 1, 2], [3, 4, 5]]
    # Parameters without a layer never move.
    assert plan_buckets(params, range(6), 300, 0, layer_of=[None] * 6) == [[0, 1, 2], [3, 4, 5]]
    # In reverse order (how backward produces them): bias then weight of each layer.
    assert plan_buckets(params, reversed(range(6)), 300, 0, layer_of=layers) == [[5, 4], [3, 2], [1, 0]]
    # The first bucket's smaller cap too.
    assert plan_buckets(params, range(6), 400, 300, layer_of=layers) == [[0, 1], [2, 3, 4, 5]]


def test_layers_by_name_are_the_owning_modules():
    names = ["features.0.weight", "features.0.bias", "scale", "head.weight", None]
    assert layers_by_name(names) == ["features.0", "features.0", None, "head", None]


def test_complete_order_appends_unready_parameters_in_reverse_registration_order():
    assert complete_order([3, 1], 5) == [3, 1, 4, 2, 0]
    assert complete_order([], 3) == [2, 1, 0]
    assert complete_order([0, 1, 2], 3) == [0, 1, 2]


def test_unused_parameter_keeps_what_it_accumulated():
    run_ranks("tests.workers.pinned:unused_parameter_keeps_accumulated_gradient", 2, timeout=120)
