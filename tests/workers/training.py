"""N-rank training must equal single-process training on the same global batch.

Every rank builds the same model (same seed), trains on its shard of each
global batch through hvdtorch, and also trains a private copy on the whole
global batch; parameters must match after several steps.
"""

import copy

import torch
import torch.nn.functional as F

import hvdtorch as hvd
from tests.workers.common import registered_reducers

STEPS = 4
PER_RANK = 3


class Net(torch.nn.Module):
    """Conv + MLP with an unused branch and tied weights."""

    def __init__(self, tied=False, unused=False):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.fc1 = torch.nn.Linear(4 * 4 * 4, 16)
        self.fc2 = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 5)
        self.unused = torch.nn.Linear(16, 16) if unused else None
        if tied:
            self.fc2.weight = self.fc1.weight if self.fc1.weight.shape == self.fc2.weight.shape else self.fc2.weight
            self.extra = torch.nn.Linear(16, 16)
            self.extra.weight = self.fc2.weight  # used twice in forward
        self.tied = tied

    def forward(self, x):
        h = F.relu(self.conv(x)).flatten(1)
        h = F.relu(self.fc1(h))
        h = F.relu(self.fc2(h))
        if self.tied:
            h = F.relu(self.extra(h))
        return self.head(h)


def batch(step, n):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(PER_RANK * n, 2, 4, 4, generator=g)
    y = torch.randint(0, 5, (PER_RANK * n,), generator=g)
    return x, y


def shard(t, r):
    return t[r * PER_RANK : (r + 1) * PER_RANK]


def make_opt(kind, params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9) if kind == "sgd" else torch.optim.Adam(params, lr=0.01)


def assert_params_close(a, b, what, atol=1e-5):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(
            p.detach(), q.detach(), atol=atol, rtol=1e-4, msg=lambda m, name=name: f"{what}: parameter {name}: {m}"
        )


def train_reference(model, kind, n, steps=STEPS):
    opt = make_opt(kind, model.parameters())
    for s in range(steps):
        x, y = batch(s, n)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def check_distributed_model(configs="all"):
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    modes = {
        "none": (False, 0),
        "P": (True, 0),
        "F": (False, 1 << 20),
        "P+F": (True, 1 << 20),
        "P+F small buckets": (True, 600),
    }
    reducers = ["auto", *registered_reducers()]
    cases = [(red, mode, "sgd") for red in reducers for mode in modes] + [("auto", "P+F", "adam")]
    if configs == "quick":
        cases = [("auto", "P+F", "sgd"), ("ring", "none", "adam")]
    for reducer, mode, kind in cases:
        torch.manual_seed(0)
        base = Net()
        ref = train_reference(copy.deepcopy(base), kind, n)
        pipeline, fusion = modes[mode]
        model = hvd.DistributedModel(
            copy.deepcopy(base),
            reducer=reducer,
            pipeline=pipeline,
            fusion_bytes=fusion,
            first_bucket_bytes=min(fusion, 300),
        )
        opt = make_opt(kind, model.parameters())
        for s in range(STEPS):
            x, y = batch(s, n)
            opt.zero_grad()
            F.cross_entropy(model(shard(x, r)), shard(y, r)).backward()
            opt.step()
        # Adam divides by sqrt(v): for near-zero gradients it turns the rounding
        # of a different summation order (mean of shard means vs global mean)
        # into visible differences, so it gets a looser absolute tolerance.
        assert_params_close(
            model.module,
            ref,
            f"DistributedModel reducer={reducer} mode={mode} opt={kind}",
            atol=1e-4 if kind == "adam" else 1e-5,
        )
    hvd.shutdown()


def check_special_models():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    # Unused parameters and tied parameters.
    for kw in ({"unused": True}, {"tied": True}):
        torch.manual_seed(1)
        base = Net(**kw)
        ref = train_reference(copy.deepcopy(base), "sgd", n)
        model = hvd.DistributedModel(copy.deepcopy(base), fusion_bytes=2048, first_bucket_bytes=256)
        opt = make_opt("sgd", model.parameters())
        for s in range(STEPS):
            x, y = batch(s, n)
            opt.zero_grad()
            F.cross_entropy(model(shard(x, r)), shard(y, r)).backward()
            opt.step()
        assert_params_close(model.module, ref, f"model {kw}")
        if kw.get("unused"):  # no rank's gradient: None, as under DDP
            assert model.module.unused.weight.grad is None, "a parameter no rank used got a gradient"
    # The wrapper is transparent: eval/no_grad forwards, attributes, state_dict keys.
    wrapped = hvd.DistributedModel(Net(), name="transparent")
    wrapped.eval()
    assert not wrapped.module.training and not wrapped.training
    with torch.no_grad():
        out = wrapped(batch(0, n)[0][:2])
    assert out.shape == (2, 5) and not out.requires_grad
    assert wrapped.fc1 is wrapped.module.fc1
    assert list(wrapped.state_dict()) == list(Net().state_dict())
    wrapped.train()
    assert wrapped.module.training
    # sync="explicit" with a forward before sync_gradients() on the iteration
    # that rebuilds the buckets.
    torch.manual_seed(6)
    base = Net()
    ref = train_reference(copy.deepcopy(base), "sgd", n, steps=3)
    model = hvd.DistributedModel(copy.deepcopy(base), sync="explicit", fusion_bytes=2048, first_bucket_bytes=256)
    opt = make_opt("sgd", model.parameters())
    for s in range(3):
        x, y = batch(s, n)
        opt.zero_grad()
        F.cross_entropy(model(shard(x, r)), shard(y, r)).backward()
        with torch.enable_grad():
            model(shard(x, r)[:1])  # a forward before the sync, grad mode on
        model.sync_gradients()
        opt.step()
    assert_params_close(model.module, ref, "explicit sync with a forward before sync_gradients")
    # An unused branch on one rank only: must not hang, and the gradients average.
    torch.manual_seed(2)
    lin = torch.nn.ModuleDict({"a": torch.nn.Linear(3, 3), "b": torch.nn.Linear(3, 3)})
    model = hvd.DistributedModel(_Branchy(lin))
    out = model(torch.ones(1, 3), use_b=(r == 0))
    out.sum().backward()
    gb = model.module.layers["b"].weight.grad
    want_b = torch.ones(3, 3) / n  # only rank 0 contributed ones
    torch.testing.assert_close(gb, want_b)
    # Mixed float32 + bfloat16 parameters.
    torch.manual_seed(3)
    mixed = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Linear(6, 6).to(torch.bfloat16))
    model = hvd.DistributedModel(mixed, fusion_bytes=1 << 20)
    before = copy.deepcopy(mixed)
    x = torch.full((2, 6), float(r + 1))  # every rank's gradient differs
    mixed[1](mixed[0](x).to(torch.bfloat16)).float().sum().backward()
    assert all(p.grad is not None for p in mixed.parameters())
    g0 = mixed[0].weight.grad.clone()
    g1 = mixed[1].weight.grad.clone()
    local0, local1 = [], []
    for k in range(n):  # recompute every rank's local gradient here
        m2 = copy.deepcopy(before)
        xx = torch.full((2, 6), float(k + 1))
        m2[1](m2[0](xx).to(torch.bfloat16)).float().sum().backward()
        local0.append(m2[0].weight.grad)
        local1.append(m2[1].weight.grad.float())
    torch.testing.assert_close(g0, sum(local0) / n)
    assert g1.dtype == torch.bfloat16
    torch.testing.assert_close(g1.float(), sum(local1) / n, atol=0.05, rtol=0.02)
    hvd.shutdown()


class _Branchy(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = layers

    def forward(self, x, use_b):
        h = self.layers["a"](x)
        return self.layers["b"](x) + h if use_b else h


def check_accumulation_and_optimizer():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    # Gradient accumulation with no_sync(): two micro-batches per step equal
    # one step on both (sum of gradients).
    torch.manual_seed(4)
    base = Net()
    ref = copy.deepcopy(base)
    ref_opt = make_opt("sgd", ref.parameters())
    model = hvd.DistributedModel(copy.deepcopy(base), fusion_bytes=4096)
    opt = make_opt("sgd", model.parameters())
    for s in range(3):
        x1, y1 = batch(10 + s, n)
        x2, y2 = batch(20 + s, n)
        ref_opt.zero_grad()
        (F.cross_entropy(ref(x1), y1) + F.cross_entropy(ref(x2), y2)).backward()
        ref_opt.step()
        opt.zero_grad()
        with model.no_sync():
            F.cross_entropy(model(shard(x1, r)), shard(y1, r)).backward()
        F.cross_entropy(model(shard(x2, r)), shard(y2, r)).backward()
        opt.step()
    assert_params_close(model.module, ref, "no_sync accumulation")

    # backward_passes_per_step=2 does the same without a context manager.
    model2 = hvd.DistributedModel(copy.deepcopy(base), fusion_bytes=4096, backward_passes_per_step=2)
    opt2 = make_opt("sgd", model2.parameters())
    for s in range(3):
        x1, y1 = batch(10 + s, n)
        x2, y2 = batch(20 + s, n)
        opt2.zero_grad()
        F.cross_entropy(model2(shard(x1, r)), shard(y1, r)).backward()
        F.cross_entropy(model2(shard(x2, r)), shard(y2, r)).backward()
        opt2.step()
    assert_params_close(model2.module, ref, "backward_passes_per_step=2")

    # DistributedOptimizer (Horovod API), SGD and Adam, with and without fp16 compression.
    for kind, compression, atol in (
        ("sgd", hvd.Compression.none, 1e-5),
        ("adam", hvd.Compression.none, 1e-4),
        ("sgd", hvd.Compression.fp16, 2e-3),
    ):
        torch.manual_seed(5)
        base = Net()
        reference = train_reference(copy.deepcopy(base), kind, n)
        model = copy.deepcopy(base)
        opt = hvd.DistributedOptimizer(
            make_opt(kind, model.parameters()), named_parameters=model.named_parameters(), compression=compression
        )
        for s in range(STEPS):
            x, y = batch(s, n)
            opt.zero_grad()
            F.cross_entropy(model(shard(x, r)), shard(y, r)).backward()
            opt.step()
        assert_params_close(model, reference, f"DistributedOptimizer {kind} {compression.__name__}", atol=atol)

    # Broadcast of parameters and optimizer state from a non-zero root.
    root = n - 1
    torch.manual_seed(100 + r)  # every rank starts different
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=0.001 * (r + 1))
    F.cross_entropy(model(batch(0, n)[0][:2]), batch(0, n)[1][:2]).backward()
    opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    torch.manual_seed(100 + root)
    want = Net()
    want_opt = torch.optim.Adam(want.parameters(), lr=0.001 * (root + 1))
    F.cross_entropy(want(batch(0, n)[0][:2]), batch(0, n)[1][:2]).backward()
    want_opt.step()
    assert_params_close(model, want, "broadcast_parameters")
    assert opt.param_groups[0]["lr"] == want_opt.param_groups[0]["lr"]
    for p, q in zip(model.parameters(), want.parameters()):
        torch.testing.assert_close(opt.state[p]["exp_avg"], want_opt.state[q]["exp_avg"])
    assert hvd.broadcast_object({"a": r}, root_rank=root) == {"a": root}
    assert hvd.allgather_object(("x", r)) == [("x", k) for k in range(n)]
    hvd.shutdown()


def _branch_usage(step: int, k: int) -> bool:
    """Whether rank k uses branch b in `step`: everyone does, except rank 1 in
    step 2 (a parameter unused on one rank only, in a later iteration, so a
    bucket still holding an older gradient would show)."""
    return not (step == 2 and k == 1)


def _branchy_local_grads(base, step, k):
    """Rank k's local gradients of `base` (a fresh copy) in `step`."""
    m = copy.deepcopy(base)
    x = torch.full((2, 3), float(k + 1 + step))
    m(x, use_b=_branch_usage(step, k)).square().sum().backward()
    return {name: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for name, p in m.named_parameters()}


def check_unused_zero_fill_over_iterations():
    """Gradients of every step must be the average of every rank's local
    gradient of that step, with zeros for a branch a rank did not use; the
    parameters do not move (lr 0), so each step's reference is exact."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(2)
    base = _Branchy(torch.nn.ModuleDict({"a": torch.nn.Linear(3, 3), "b": torch.nn.Linear(3, 3)}))
    for how in ("model", "optimizer", "model-one-bucket"):
        net = copy.deepcopy(base)
        if how == "optimizer":
            model = net
            opt = hvd.DistributedOptimizer(
                torch.optim.SGD(net.parameters(), lr=0.0), named_parameters=net.named_parameters(), fusion_bytes=1 << 20
            )
        else:
            model = hvd.DistributedModel(
                net,
                fusion_bytes=(1 << 20) if how == "model-one-bucket" else 64,
                first_bucket_bytes=64,
                name=f"zero.{how}",
            )
            opt = torch.optim.SGD(net.parameters(), lr=0.0)
        for step in range(5):
            for set_to_none in (True, False):  # .grad dropped, or kept and zeroed
                opt.zero_grad(set_to_none=set_to_none)
                x = torch.full((2, 3), float(r + 1 + step))
                model(x, use_b=_branch_usage(step, r)).square().sum().backward()
                opt.step()
                local = [_branchy_local_grads(base, step, k) for k in range(n)]
                for name, p in net.named_parameters():
                    want = sum(g[name] for g in local) / n
                    torch.testing.assert_close(p.grad, want, msg=lambda m: f"{how}, step {step}, {name}: {m}")
    hvd.shutdown()


def check_gradient_predivide_factor():
    """gradient_predivide_factor splits the average into a prescale 1/f and a
    postscale f/size: training must equal the single-process reference for
    any f (dropping the postscale f would shrink every step by f)."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for f in (2.0, 4.0):
        torch.manual_seed(11)
        base = Net()
        ref = train_reference(copy.deepcopy(base), "sgd", n)
        model = hvd.DistributedModel(
            copy.deepcopy(base), gradient_predivide_factor=f, fusion_bytes=4096, name=f"predivide.{f}"
        )
        opt = make_opt("sgd", model.parameters())
        net2 = copy.deepcopy(base)
        opt2 = hvd.DistributedOptimizer(
            make_opt("sgd", net2.parameters()), named_parameters=net2.named_parameters(), gradient_predivide_factor=f
        )
        for s in range(STEPS):
            x, y = batch(s, n)
            opt.zero_grad()
            F.cross_entropy(model(shard(x, r)), shard(y, r)).backward()
            opt.step()
            opt2.zero_grad()
            F.cross_entropy(net2(shard(x, r)), shard(y, r)).backward()
            opt2.step()
        assert_params_close(model.module, ref, f"DistributedModel gradient_predivide_factor={f}")
        assert_params_close(net2, ref, f"DistributedOptimizer gradient_predivide_factor={f}")
    hvd.shutdown()


def check_buckets_reduced_in_place():
    """DistributedModel's buckets live in registered memory and the node
    reducer reduces them in place: every rank maps its peers' buckets, and
    training still equals the single-process reference."""
    from hvdtorch import runtime

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    engine = runtime.state().engine
    torch.manual_seed(0)
    base = Net()
    ref = train_reference(copy.deepcopy(base), "sgd", n)
    model = hvd.DistributedModel(copy.deepcopy(base), fusion_bytes=1 << 10, first_bucket_bytes=300)
    opt = make_opt("sgd", model.parameters())
    for s in range(STEPS):
        x, y = batch(s, n)
        opt.zero_grad()
        F.cross_entropy(model(shard(x, r)), shard(y, r)).backward()
        opt.step()
    assert_params_close(model.module, ref, "DistributedModel with registered buckets")
    buckets = len(model.bucket_bytes())
    own, peers = engine.registered_stats()
    assert buckets > 1, f"the model should have several buckets, got {buckets}"
    assert own >= buckets, f"rank {r}: {own} registered buffers for {buckets} buckets"
    # The engine fuses nothing here (HVDTORCH_FUSION_THRESHOLD=0), so every
    # bucket ran alone, in place: this rank maps each peer's buckets, and the
    # buckets before the first-iteration rebuild no more (freed by their owner).
    assert peers == buckets * (n - 1), f"rank {r}: {peers} peer buffers mapped, want {buckets * (n - 1)}"
    del model, opt
    hvd.shutdown()


def check_no_registered_memory_without_shm():
    """HVDTORCH_SHM=0: no registered memory; buckets are plain tensors."""
    from hvdtorch import runtime

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    assert runtime.state().engine.registered_stats() == (0, 0)
    torch.manual_seed(0)
    base = Net()
    ref = train_reference(copy.deepcopy(base), "sgd", n, steps=2)
    model = hvd.DistributedModel(copy.deepcopy(base), fusion_bytes=1 << 10)
    opt = make_opt("sgd", model.parameters())
    for s in range(2):
        x, y = batch(s, n)
        opt.zero_grad()
        F.cross_entropy(model(shard(x, r)), shard(y, r)).backward()
        opt.step()
    assert_params_close(model.module, ref, "DistributedModel without shared memory")
    hvd.shutdown()


class _ThreeBranches(torch.nn.Module):
    """``a`` always; ``b`` in the steps every rank uses it; ``c`` on rank 0
    only; ``z`` on rank 0 only, with a gradient of exact zeros (used: its
    reduced gradient is zero, as an unused one's, and it must still step)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 3).double()
        self.b = torch.nn.Linear(3, 3).double()
        self.c = torch.nn.Linear(3, 3).double()
        self.z = torch.nn.Linear(3, 3).double()

    def forward(self, x, use_b, use_c):
        h = self.a(x)
        if use_b:
            h = h + self.b(x).tanh()
        if use_c:
            h = h + self.c(x).sin() + 0.0 * self.z(x)
        return h


def _b_used(step):
    return step in (0, 3)  # unused everywhere in steps 1, 2 and 4


def _three_branch_batch(step, k):
    g = torch.Generator().manual_seed(10 * step + k)
    return torch.randn(2, 3, dtype=torch.float64, generator=g)


def unused_everywhere_like_one_process():
    """A parameter no rank gives a gradient in a step keeps .grad None, so a
    stateful optimizer with weight decay leaves it alone, as in one process
    and under DDP: every gradient route, parameters equal in float64 after
    each step to one process on the global batch (whose b gets no gradient
    in steps 1, 2 and 4, while c does on rank 0 only every step)."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(4)
    base = _ThreeBranches()

    def opt_of(kind, params):
        if kind == "adamw":
            return torch.optim.AdamW(params, lr=0.05, weight_decay=0.1)
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.1)

    def local_loss(m, step, k):
        return m(_three_branch_batch(step, k), _b_used(step), k == 0).square().mean()

    routes = ("model", "model-explicit", "sync_and_step", "optimizer", "optimizer-no-sync-pass")
    for kind in ("adamw", "sgd"):
        for route in routes:
            ref = copy.deepcopy(base)
            ref_opt = opt_of(kind, ref.parameters())
            net = copy.deepcopy(base)
            if route.startswith("optimizer"):
                model = net
                opt = hvd.DistributedOptimizer(opt_of(kind, net.parameters()), named_parameters=net.named_parameters())
            else:
                sync = "backward" if route == "model" else "explicit"
                model = hvd.DistributedModel(net, sync=sync, fusion_bytes=64, name=f"u.{kind}.{route}")
                opt = opt_of(kind, net.parameters())
            for step in range(5):
                ref_opt.zero_grad()
                (sum(local_loss(ref, step, k) for k in range(n)) / n).backward()
                ref_opt.step()
                opt.zero_grad()
                if route == "optimizer-no-sync-pass" and step == 4:
                    opt.step()  # a step with no backward at all: nothing moves, as in one process
                    continue
                local_loss(model, step, r).backward()
                if route == "model-explicit":
                    model.sync_gradients()
                if route == "sync_and_step":
                    model.sync_and_step(opt)
                else:
                    if route != "model-explicit":  # a use of every .grad between backward and step()
                        torch.nn.utils.clip_grad_norm_(net.parameters(), 1e9)
                    if not _b_used(step):
                        assert net.b.weight.grad is None, f"{route}: b got a gradient in step {step}"
                    opt.step()
                if not _b_used(step):
                    assert net.b.weight.grad is None, f"{kind} {route}: b.weight.grad in step {step}"
                for (name, p), q in zip(net.named_parameters(), ref.parameters()):
                    torch.testing.assert_close(
                        p, q, rtol=1e-9, atol=1e-12, msg=lambda m, name=name: f"{kind} {route} step {step} {name}: {m}"
                    )
    # PowerSGD adds each rank's error to its buckets, so an unused parameter's
    # result is not zeros: it is still left None (found by summing the flags).
    net = copy.deepcopy(base)
    powersgd = hvd.Compression.powersgd(rank=1, start_iter=0, min_compression_rate=0)  # step 0 leaves b an error
    model = hvd.DistributedModel(net, compression=powersgd, name="u.powersgd")
    for step in range(4):
        for p in net.parameters():
            p.grad = None
        local_loss(model, step, r).backward()
        if not _b_used(step):
            assert net.b.weight.grad is None and net.b.bias.grad is None, f"powersgd: b got a gradient in step {step}"
    hvd.shutdown()
