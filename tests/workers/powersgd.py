"""Rank side of tests/test_powersgd.py: a small float64 network trained with
Compression.powersgd under DistributedModel or DistributedOptimizer (its
parameters are saved for the test's one-process reference of the same
algorithm); a state_dict round trip against uninterrupted training; the
combinations PowerSGD refuses; examples/learn.py with a compression option.

Every rank draws its own batches (seeded by step and rank), so the ranks'
gradients differ and the compression of their average shows."""

import copy
import importlib.util
import os

import torch
import torch.nn.functional as F

import hvdtorch as hvd
from tests.workers.common import device_of

# min_compression_rate 1.0: conv (4 x 6) and fc1 (8 x 24) are compressed at rank 2, fc2 (2 x 8) is not.
OPTIONS = dict(rank=2, start_iter=2, min_compression_rate=1.0, seed=7)
STEPS = 6
LR = 0.1
MOMENTUM = 0.9


class Net(torch.nn.Module):
    """A 3-D conv weight, two matrices (one too small to compress), biases: float64."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(2, 4, 3)
        self.fc1 = torch.nn.Linear(24, 8)
        self.fc2 = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(F.relu(self.conv(x)).flatten(1))))


def make_net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net().double()


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 2, 8, generator=g, dtype=torch.float64), torch.randn(4, 2, generator=g, dtype=torch.float64)


def loss_of(model, step: int, rank: int):
    dev = next(model.parameters()).device  # the batch is drawn on the CPU and moved: the same on every device
    x, y = (t.to(dev) for t in batch(step, rank))
    return ((model(x) - y) ** 2).mean()


def _wrap(net, kind: str, compressor, op=None):
    """(what forward goes through, the optimizer) for `kind` "model" or "optimizer"."""
    op = hvd.Average if op is None else op
    if kind == "model":
        # A small first bucket: two buckets, rebuilt after the first pass from the observed order.
        model = hvd.DistributedModel(net, compression=compressor, first_bucket_bytes=256, op=op)
        return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    return net, hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters(), compression=compressor, op=op)


def _steps(model, opt, steps: range) -> None:
    for step in steps:
        opt.zero_grad()
        loss_of(model, step, hvd.rank()).backward()
        opt.step()


# What each job size trains (name -> front, options over OPTIONS; "sum": reduce with hvd.Sum): the
# test's reference runs the same. One job per size: starting ranks is most of the time.
CONFIGS = {
    "model": ("model", {}),
    "optimizer": ("optimizer", {}),
    "model-sum": ("model", {"sum": True}),
    "model-rank1-from-start": ("model", {"rank": 1, "start_iter": 0}),
    "model-fp16": ("model", {"fp16": True}),
}


def configs_for(nranks: int):
    return list(CONFIGS) if nranks == 2 else ["model", "optimizer"] if nranks == 3 else ["model"]


def train(out_dir: str, device: str = "cpu") -> None:
    """STEPS steps of every configuration of this job's size on `device`
    (every rank on cuda:0 for "cuda"); rank 0 saves each one's parameters."""
    hvd.init()
    dev = device_of(device)
    for name in configs_for(hvd.size()):
        kind, options = CONFIGS[name]
        options = {**OPTIONS, **options}
        op = hvd.Sum if options.pop("sum", False) else hvd.Average
        net = make_net().to(dev)
        compressor = hvd.Compression.powersgd(**options)
        model, opt = _wrap(net, kind, compressor, op)
        _steps(model, opt, range(STEPS))
        # Alone in the job nothing travels and PowerSGD is never asked; otherwise every step is a reduced pass.
        assert compressor.iteration == (STEPS if hvd.size() > 1 else 0), (name, compressor.iteration)
        if hvd.rank() == 0:
            assert all(p.device == dev for p in net.parameters()), name
            torch.save([p.detach().cpu() for p in net.parameters()], os.path.join(out_dir, f"{name}.pt"))
    hvd.shutdown()


def train_in_a_set_without_rank_0(out_dir: str) -> None:
    """In the set [1, 2] of 3 ranks, DistributedModel and DistributedOptimizer
    with PowerSGD average over the set's two ranks, each drawing the batches
    of its rank in the set; the set's first rank saves the parameters for
    the two-rank reference. Rank 0, outside, takes part in nothing."""
    hvd.init()
    assert hvd.size() == 3
    tail = hvd.add_process_set([1, 2])
    for kind in ("model", "optimizer"):
        if not tail.included():
            continue
        net = make_net()
        compressor = hvd.Compression.powersgd(**OPTIONS)
        if kind == "model":
            model = hvd.DistributedModel(net, compression=compressor, first_bucket_bytes=256, process_set=tail)
            opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        else:
            model = net
            opt = hvd.DistributedOptimizer(
                torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM),
                named_parameters=net.named_parameters(),
                compression=compressor,
                process_set=tail,
            )
        for step in range(STEPS):
            opt.zero_grad()
            loss_of(model, step, tail.rank()).backward()
            opt.step()
        assert compressor.iteration == STEPS, (kind, compressor.iteration)
        if tail.rank() == 0:
            torch.save([p.detach() for p in net.parameters()], os.path.join(out_dir, f"set-{kind}.pt"))
        hvd.barrier(process_set=tail)
    hvd.barrier()
    hvd.shutdown()


def round_trips_and_refusals() -> None:
    hvd.init()
    round_trip("model")
    round_trip("optimizer")
    refusals()
    hvd.shutdown()


def round_trip(kind: str) -> None:
    """3 steps, state saved, a new network/compressor/optimizer loads it, 3 more steps == 6 steps at once."""
    net = make_net()
    model, opt = _wrap(net, kind, hvd.Compression.powersgd(**OPTIONS))
    _steps(model, opt, range(6))
    want = [p.detach().clone() for p in net.parameters()]

    first = make_net()
    compressor = hvd.Compression.powersgd(**OPTIONS)
    model, opt = _wrap(first, kind, compressor)
    _steps(model, opt, range(3))
    saved = copy.deepcopy(
        {"model": first.state_dict(), "optimizer": opt.state_dict(), "powersgd": compressor.state_dict()}
    )
    assert saved["powersgd"]["iteration"] == 3 and saved["powersgd"]["errors"], saved["powersgd"]["iteration"]
    if kind == "optimizer":
        assert saved["optimizer"]["hvdtorch_powersgd"]["iteration"] == 3

    second = make_net(seed=1)  # other weights: the loaded state must replace them
    compressor = hvd.Compression.powersgd(**OPTIONS)
    if kind == "model":
        compressor.load_state_dict(saved["powersgd"])  # before the model exists: applied when it is built
    model, opt = _wrap(second, kind, compressor)
    second.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])  # the optimizer's carries the compressor's state
    assert compressor.iteration == 3
    _steps(model, opt, range(3, 6))
    got = [p.detach() for p in second.parameters()]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-14)
    # A state that does not fit the model is refused, naming the parameter.
    bad = compressor.state_dict()
    index = next(iter(bad["errors"]))
    bad["errors"][index] = torch.zeros(3, 3, dtype=torch.float64)
    try:
        compressor.load_state_dict(bad)
    except ValueError as e:
        assert f"state of parameter {index}" in str(e), e
    else:
        raise AssertionError("a misshapen PowerSGD state was accepted")


def _raises(fn, *needles):
    try:
        fn()
    except ValueError as e:
        for needle in needles:
            assert needle in str(e), f"{needle!r} not in {e}"
        print(f"refused: {e}")
        return
    raise AssertionError(f"no ValueError with {needles}")


def refusals() -> None:
    """Every combination Compression.powersgd refuses, each with its reason."""
    psgd = hvd.Compression.powersgd

    def optimizer(net, **kw):
        opt = torch.optim.SGD(net.parameters(), lr=LR)
        return hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters(), **kw)

    for shard in (1, 2):
        _raises(
            lambda: optimizer(make_net(), compression=psgd(), shard=shard),
            f"shard={shard} does not combine with Compression.powersgd",
        )
    # A sharded optimizer taking over a PowerSGD DistributedModel's gradients.
    dm = hvd.DistributedModel(make_net(), compression=psgd())
    _raises(
        lambda: hvd.DistributedOptimizer(torch.optim.SGD(dm.parameters(), lr=LR), shard=2, model=dm),
        "shard=2 does not combine with Compression.powersgd",
    )
    _raises(lambda: optimizer(make_net(), compression=psgd(), op=hvd.Adasum), "op=hvd.Adasum", "Compression.powersgd")

    emb = torch.nn.Embedding(10, 4, sparse=True)
    opt = optimizer(emb, compression=psgd())
    emb(torch.tensor([1, 2 + hvd.rank()])).sum().backward()
    _raises(opt.step, "compresses dense gradients", "weight", "sparse_as_dense=True")
    # sparse_as_dense: the densified gradient is compressed like any other.
    emb = torch.nn.Embedding(10, 4, sparse=True)
    opt = optimizer(emb, compression=psgd(start_iter=0), sparse_as_dense=True)
    emb(torch.tensor([1, 2 + hvd.rank()])).sum().backward()
    opt.step()

    sets = [hvd.add_process_set([r]) for r in range(hvd.size())]
    mine = sets[hvd.rank()]
    _raises(lambda: hvd.DistributedModel(make_net(), compression=psgd(), process_set=mine), "has 1 rank(s)")
    _raises(lambda: optimizer(make_net(), compression=psgd(), process_set=mine), "has 1 rank(s)")

    complex_net = torch.nn.Linear(4, 4).to(torch.complex64)
    _raises(
        lambda: hvd.DistributedModel(complex_net, compression=psgd()),
        "real floating-point gradients",
        "'weight' is torch.complex64",
    )
    _raises(lambda: hvd.allreduce(torch.ones(3), compression=psgd()), "gradient buckets")
    shared = psgd()
    keep = hvd.DistributedModel(make_net(), compression=shared)
    _raises(lambda: hvd.DistributedModel(make_net(), compression=shared), "one compressor per model")
    del keep
    for bad, needle in ((dict(rank=0), "rank must be >= 1"), (dict(start_iter=-1), "start_iter must be >= 0")):
        _raises(lambda bad=bad: psgd(**bad), needle)


def learn(out_dir: str, *argv) -> None:
    """examples/learn.py's main() with `argv`, uncompressed then with PowerSGD rank 4 (each run inits and
    shuts hvdtorch down); rank 0 writes none.json and powersgd.json into `out_dir`."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "learn.py")
    spec = importlib.util.spec_from_file_location("learn_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, extra in (("none", []), ("powersgd", ["--compression", "powersgd", "--powersgd-rank", "4"])):
        module.main([*argv, *extra, "--result", os.path.join(out_dir, f"{name}.json")])
