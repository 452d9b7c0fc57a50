"""The function Ray Train's TorchTrainer runs on every worker (tests/test_ray.py).

Ray has already made the default process group; hvd.init() adopts it. Each
worker trains on its slice of every global batch and writes what it saw and
its final weights to config["out"]/rank-<r>.json.
"""

import json
import os

import torch
import torch.nn.functional as F

STEPS = 6
GLOBAL_BATCH = 8


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(GLOBAL_BATCH, 6, generator=g), torch.randint(0, 3, (GLOBAL_BATCH,), generator=g)


def train_loop(config):
    import torch.distributed as dist

    import hvdtorch as hvd

    group_before = dist.is_initialized()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    net = hvd.DistributedModel(model())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x, y = batch(step)
        loss = F.cross_entropy(net(x[rank::size]), y[rank::size])
        opt.zero_grad()
        loss.backward()
        opt.step()
    engine = hvd.runtime.state().engine
    info = {
        "rank": rank,
        "size": size,
        "local_rank": hvd.local_rank(),
        "group_before_init": group_before,
        "adopted": not hvd.runtime.state().owns_default_group,
        "links": {str(k): v for k, v in engine.link_kinds().items()},
        "weights": torch.cat([p.detach().flatten() for p in net.parameters()]).tolist(),
    }
    hvd.shutdown()
    assert dist.is_initialized(), "hvd.shutdown() destroyed the process group Ray owns"
    with open(os.path.join(config["out"], f"rank-{rank}.json"), "w") as f:
        json.dump(info, f)
