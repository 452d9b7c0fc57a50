"""Compiled models (hvdtorch/training/compiled_model.py): each route trains
under torch.compile, and DistributedModel under compiled autograd, to the
parameters of the same route run eagerly (float64; the compiled kernels may
order sums differently, so rtol 1e-9)."""

import torch
import torch._dynamo
from torch._dynamo.utils import counters

import hvdtorch as hvd
from tests.workers.common import expect


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)


class _Net(torch.nn.Module):
    """Three layers and a branch that only some ranks use (``use_branch``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 16)
        self.c = torch.nn.Linear(16, 4)
        self.branch = torch.nn.Linear(16, 4)

    def forward(self, x, use_branch: bool = False):
        h = torch.relu(self.b(torch.relu(self.a(x))))
        out = self.c(h)
        return out + self.branch(h) if use_branch else out


def _batch(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10 * step + rank)
    return torch.randn(4, 8, generator=g, dtype=torch.float64)


def _train(route: str, mode: str, steps: int = 3, device: str = "cpu", **kw):
    """Trains a fresh net along ``route`` with ``mode`` ("eager", "compile":
    torch.compile of the model, "ca": forward and backward in one
    torch.compile'd function with compiled autograd on) on ``device``;
    returns its parameters. ``kw``: the DistributedModel's arguments."""
    r = hvd.rank()
    net = _Net().double().to(device)
    # The branch's rank (-1: none, a parameter no rank gives a gradient).
    branch_on = kw.pop("branch_on_rank", 0)
    accumulate = kw.pop("accumulate", False)
    local_only = kw.pop("local_only", False)
    if kw.pop("powersgd", False):  # its state is the run's own
        kw["compression"] = hvd.Compression.powersgd(rank=1, start_iter=1)
    # Weight decay moves a parameter whose .grad is zeros, not one whose .grad is None.
    base = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    if route == "model":
        model = hvd.DistributedModel(net, **kw)
        opt = base
    else:
        model = net
        shard = {"optimizer": 0, "shard1": 1, "shard2": 2}[route]
        opt = hvd.DistributedOptimizer(base, named_parameters=net.named_parameters(), shard=shard, **kw)
    fwd = torch.compile(model) if mode == "compile" else model

    def forward_backward(x):
        fwd(x, use_branch=branch_on == r).pow(2).sum().backward()

    # Read by torch.compile() when called: set first.
    torch._dynamo.config.compiled_autograd = mode == "ca"
    if mode == "ca":
        forward_backward = torch.compile(forward_backward)
    try:
        for step in range(steps):
            opt.zero_grad()
            if accumulate:  # every rank uses the branch here, then only branch_on_rank
                with model.no_sync():
                    fwd(_batch(r, 100 + step).to(device), use_branch=True).pow(2).sum().backward()
            if local_only:  # a step after a pass that only accumulated
                with model.no_sync():
                    forward_backward(_batch(r, step).to(device))
            else:
                forward_backward(_batch(r, step).to(device))
            if kw.get("sync") == "explicit":
                model.sync_gradients()
            opt.step()
    finally:
        torch._dynamo.config.compiled_autograd = False
    return [p.detach().clone() for p in net.parameters()]


def _same(route: str, mode: str, device: str = "cpu", **kw) -> None:
    torch._dynamo.reset()
    counters.clear()
    want = _train(route, "eager", device=device, **dict(kw))
    got = _train(route, mode, device=device, **dict(kw))
    _check(all(p.device.type == torch.device(device).type for p in got), f"parameters left {device}")
    what = f"rank {hvd.rank()}: {route} {mode} on {device} {kw}"
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12, msg=lambda m: f"{what}: parameter {i}: {m}")
    if kw.get("local_only"):
        return  # nothing was reduced: each rank trained its own
    # Every rank ends with the same parameters.
    flat = torch.cat([p.reshape(-1) for p in got]).reshape(1, -1)
    everyone = hvd.allgather(flat, name=f"compiled.{route}.{mode}.{len(kw)}")
    _check(torch.equal(everyone[0], everyone[-1]), f"{what}: ranks differ")
    if route == "model" and mode == "compile":
        # DistributedModel's forward runs outside the graph: no break inside the model.
        _check(not counters["graph_break"], f"{what}: graph breaks {dict(counters['graph_break'])}")


def every_route_compiled(device: str = "cpu") -> None:
    """torch.compile(model) on every route that compiles: DistributedModel
    (default, sync="explicit", an unused branch on one rank, PowerSGD),
    DistributedOptimizer, shard=1 and shard=2; on ``device`` (tests/test_gpu.py: "cuda")."""
    hvd.init()
    _same("model", "compile", device)
    _same("model", "compile", device, sync="explicit", fusion_bytes=512, first_bucket_bytes=512)
    _same("model", "compile", device, branch_on_rank=1)
    _same("model", "compile", device, branch_on_rank=-1)  # .grad None, as eager
    _same("model", "compile", device, powersgd=True)
    for route in ("optimizer", "shard1", "shard2"):
        _same(route, "compile", device)
    hvd.shutdown()


def compiled_autograd(device: str = "cpu") -> None:
    """DistributedModel under compiled autograd: small buckets (several
    launch during backward), sync="explicit", an unused branch on one rank,
    no_sync() accumulation (its branch unused in the reducing pass on one
    rank), a step after a no_sync() pass (the unused branch keeps no
    .grad), fp16 on the wire, PowerSGD, Sum with a predivide factor; a
    parameter no rank uses is refused by name. On ``device``."""
    hvd.init()
    _same("model", "ca", device, fusion_bytes=512, first_bucket_bytes=512)
    _same("model", "ca", device, sync="explicit")
    _same("model", "ca", device, branch_on_rank=1)
    _same("model", "ca", device, accumulate=True, branch_on_rank=1)
    _same("model", "ca", device, local_only=True, branch_on_rank=1)
    _same("model", "ca", device, compression=hvd.Compression.fp16)
    _same("model", "ca", device, powersgd=True)
    _same("model", "ca", device, op=hvd.Sum, gradient_predivide_factor=2.0)
    # A parameter no rank gives a gradient: compiled autograd would write zeros into its .grad.
    expect(
        Exception,
        ["got no gradient on any rank", "'branch.weight'", "compiled autograd off"],
        lambda: _train("model", "ca", steps=1, device=device, branch_on_rank=-1),
        hvd.rank(),
    )
    hvd.shutdown()


def compiled_autograd_refuses_optimizer() -> None:
    """DistributedOptimizer's hooks under compiled autograd: an error naming
    what works, not torch's "compiled_args nyi"."""
    hvd.init()
    expect(
        RuntimeError,
        ["compiled autograd met hvdtorch's gradient hooks", "wrap the model in hvd.DistributedModel"],
        lambda: _train("optimizer", "ca", steps=2),
        hvd.rank(),
    )
    hvd.shutdown()


def graphs_split_at_buckets() -> None:
    """The compiled forward is split into pieces of about one bucket (torch's
    DDPOptimizer, fed DistributedModel's cap), so that gradients come out of
    backward piece by piece and buckets launch while it runs; with
    torch._dynamo.config.optimize_ddp = False, one graph."""
    hvd.init()
    torch.manual_seed(0)
    layers = [torch.nn.Linear(512, 512) for _ in range(6)]  # 1 MiB of weight each
    pieces = []

    def counting_backend(gm, example_inputs):
        pieces.append(gm)
        return gm.forward

    for optimize, at_least, at_most in ((True, 3, 7), (False, 1, 1)):
        torch._dynamo.reset()
        pieces.clear()
        torch._dynamo.config.optimize_ddp = optimize
        try:
            dm = hvd.DistributedModel(torch.nn.Sequential(*layers), fusion_bytes=2 << 20, name=f"split{optimize}")
            torch.compile(dm, backend=counting_backend)(torch.randn(2, 512)).sum().backward()
        finally:
            torch._dynamo.config.optimize_ddp = True
        _check(at_least <= len(pieces) <= at_most, f"optimize_ddp={optimize}: {len(pieces)} compiled pieces")
    hvd.shutdown()
