"""DistributedOptimizer(groups=[...]): parameters left out of the groups are
reduced too, each in a group of its own (as Horovod does)."""

import torch

from hvdtorch.training.optimizer import _layout
from tests.harness import run_ranks


def test_leftover_parameters_get_a_group_each():
    params = [torch.zeros(2), torch.zeros(3), torch.zeros(4), torch.zeros(5), torch.zeros(1, dtype=torch.float64)]
    layout = _layout(params, [[params[0], params[2], params[4]]], fusion_bytes=1 << 20)
    # The group is split by dtype; 1 and 3 are left over, one bucket each.
    assert sorted(map(sorted, layout)) == [[0, 2], [1], [3], [4]], layout


def test_training_with_leftover_parameters_equals_reference():
    run_ranks("tests.workers.optimizer_groups:check_groups_with_leftovers", 3, timeout=120)
