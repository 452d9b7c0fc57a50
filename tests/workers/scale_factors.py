"""Rank side of tests/test_scale_factors.py: gradient_predivide_factor f
splits the average into a prescale 1/f before the sum and a postscale f
after it, so it must cancel on every gradient route: training with f equals
training without it (f = 4, a power of two: the scalings are exact, float16
included), and equals plain averaging (DistributedOptimizer without f).

Routes (ROUTES): DistributedModel, DistributedOptimizer, the sharded
optimizer (shard=1 and 2, alone or over a DistributedModel, whose options
then apply), Compression.fp16 on each, Compression.powersgd (compressing
from the first step, so its compressed slots carry the gradients) on
DistributedModel and DistributedOptimizer. op=hvd.Adasum refuses a factor.
Without shared memory (HVDTORCH_SHM=0, set by the test) shard=2
reduce-scatters; with it, it reduces in place (each route asserts which)."""

import os

import torch
import torch.nn.functional as F

import hvdtorch as hvd

F_FACTOR = 4.0
STEPS = 3
LR = 0.1


class Net(torch.nn.Module):
    """Two matrices PowerSGD compresses at rank 1 (min_compression_rate 1), biases it does not."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def _batch(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)


def _powersgd():
    return hvd.Compression.powersgd(rank=1, start_iter=0, min_compression_rate=1.0, seed=3)


def _train(route: str, factor: float, tag: str):
    """The parameters after STEPS steps of `route` with gradient_predivide_factor `factor`."""
    torch.manual_seed(0)
    net = Net()
    kind, _, compression = route.partition("+")
    comp = {"": hvd.Compression.none, "fp16": hvd.Compression.fp16, "powersgd": None}[compression]
    if comp is None:
        comp = _powersgd()
    front = net
    if kind == "model" or kind.startswith("model-shard"):
        front = hvd.DistributedModel(
            net, compression=comp, gradient_predivide_factor=factor, fusion_bytes=256, name=f"{tag}.model"
        )
        opt = torch.optim.SGD(front.parameters(), lr=LR, momentum=0.9)
        if kind.startswith("model-shard"):
            opt = hvd.DistributedOptimizer(opt, shard=int(kind[-1]), fusion_bytes=256)
    else:
        shard = int(kind[-1]) if kind.startswith("shard") else 0
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9),
            named_parameters=net.named_parameters(),
            compression=comp,
            gradient_predivide_factor=factor,
            shard=shard,
            fusion_bytes=256,
        )
    if "shard2" in kind:
        in_place = os.environ.get("HVDTORCH_SHM", "1") != "0"
        assert opt._gather_in_place == in_place, f"{route}: in place {opt._gather_in_place}, expected {in_place}"
    for step in range(STEPS):
        opt.zero_grad()
        x, y = _batch(step, hvd.rank())
        F.mse_loss(front(x), y).backward()
        opt.step()
    if compression == "powersgd":
        assert comp.iteration == STEPS, f"{route}: PowerSGD counted {comp.iteration} passes"
    return [p.detach().clone() for p in net.parameters()]


ROUTES = [
    "model",
    "optimizer",
    "shard1",
    "shard2",
    "model-shard1",
    "model-shard2",
    "model+fp16",
    "optimizer+fp16",
    "shard1+fp16",
    "shard2+fp16",
    "model+powersgd",
    "optimizer+powersgd",
]


def _head(t):
    return [round(v, 6) for v in t.flatten()[:4].tolist()]


def factor_cancels(routes: str = "all") -> None:
    hvd.init()
    chosen = ROUTES if routes == "all" else routes.split(",")
    plain = _train("optimizer", 1.0, "plain")
    wrong = []
    for route in chosen:
        with_f = _train(route, F_FACTOR, f"{route}.f")
        without = _train(route, 1.0, f"{route}.1")
        for name, a, b, c in zip(("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"), with_f, without, plain):
            if not torch.allclose(a, b, rtol=1e-5, atol=1e-6):
                wrong.append(f"{route} {name}: with f={F_FACTOR:g} {_head(a)}, without {_head(b)}")
            # Compressed routes approximate the average: only the exact ones equal plain averaging.
            exact = "powersgd" not in route and "fp16" not in route
            if exact and not torch.allclose(a, c, rtol=1e-5, atol=1e-6):
                wrong.append(f"{route} {name}: with f={F_FACTOR:g} {_head(a)}, plain averaging {_head(c)}")
    assert not wrong, f"rank {hvd.rank()}:\n  " + "\n  ".join(wrong)
    # Adasum has no average to split: a factor is refused, not ignored.
    for make in (
        lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(Net().parameters(), lr=LR), op=hvd.Adasum, gradient_predivide_factor=F_FACTOR
        ),
        lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(Net().parameters(), lr=LR), op=hvd.Sum, gradient_predivide_factor=F_FACTOR, shard=2
        ),
    ):
        try:
            make()
        except ValueError as e:
            assert "gradient_predivide_factor" in str(e), e
        else:
            raise AssertionError("a gradient_predivide_factor with an op other than Average was accepted")
    hvd.shutdown()
