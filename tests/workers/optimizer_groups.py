"""Rank side of tests/test_optimizer_groups.py: DistributedOptimizer(groups=[...])
with parameters left out of every group; training equals one process on the
global batch, on the job and inside a process set."""

import copy

import torch

import hvdtorch as hvd
from tests.workers.horovod_names import STEPS, Net, reference, shard_loss


def _train(model, r, n, **kw):
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), named_parameters=model.named_parameters(), **kw
    )
    for s in range(STEPS):
        opt.zero_grad()
        shard_loss(model, s, r, n).backward()
        opt.step()


def _close(model, ref, what):
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(
            p.detach(), q.detach(), atol=1e-5, rtol=1e-4, msg=lambda m: f"rank {hvd.rank()}: {what}: {name}: {m}"
        )


def check_groups_with_leftovers():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    base = Net()
    # The biases are in no group: each must still be averaged.
    model = copy.deepcopy(base)
    _train(model, r, n, groups=[[model.fc1.weight, model.fc2.weight]])
    _close(model, reference(base, n, 1), "groups without the biases")
    # Inside a set: the members average over the set's shards (a set of the
    # job's first and last rank, renumbered 0 and 1 for the shards).
    ps = hvd.add_process_set([0, n - 1])
    if ps.included():
        model = copy.deepcopy(base)
        _train(model, ps.rank(), ps.size(), groups=[[model.fc2.bias]], process_set=ps)
        _close(model, reference(base, ps.size(), 1), "set, groups of one bias")
    hvd.barrier()
    hvd.shutdown()
