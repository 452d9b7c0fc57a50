"""Checks that a DDP user's patterns train as under DistributedDataParallel,
or are refused with a message naming the fix (docs/guide.md, "Coming from
DDP"). Each rank seeds its own models differently, as a script that forgot
to broadcast would; DDP runs over torch.distributed's default group, which
hvd.init() made."""

import copy
import gc
import os
import sys

import torch
import torch.nn.functional as F

import hvdtorch as hvd
from tests.workers.common import expect


def _bn_net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 6, 3),
        torch.nn.BatchNorm2d(6),
        torch.nn.ReLU(),
        torch.nn.Sequential(torch.nn.Conv2d(6, 4, 3), torch.nn.BatchNorm2d(4)),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 4 * 4, 3),
    )


def _batches(rank: int, steps: int):
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own shard, shifted so BN stats differ
    return [(torch.randn(6, 3, 8, 8, generator=g) + rank, torch.randint(0, 3, (6,), generator=g)) for _ in range(steps)]


def _gathered(t: torch.Tensor, name: str) -> torch.Tensor:
    return hvd.allgather(t.detach().reshape(1, -1).double(), name=name)


def equals_ddp_with_batchnorm() -> None:
    """Unbroadcast, differently seeded BatchNorm nets: DistributedModel and
    DDP end with the same parameters and buffers on every rank, rank by rank
    (parameters and buffers broadcast at wrap, buffers before each forward)."""
    hvd.init()
    r = hvd.rank()
    ddp = torch.nn.parallel.DistributedDataParallel(_bn_net(seed=r))
    ours = hvd.DistributedModel(_bn_net(seed=r))
    for name, t in ours.module.state_dict().items():
        everyone = _gathered(t, f"wrap.{name}")
        assert torch.equal(everyone[0], everyone[-1]), f"rank {r}: {name} differs across ranks after the wrap"
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ddp, ours)]
    for x, y in _batches(r, 5):
        for model, opt in zip((ddp, ours), opts):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    want, got = ddp.module.state_dict(), ours.module.state_dict()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=lambda m: f"rank {r}: {name}: {m}")
    # As DDP's: buffers equal on every rank before a forward (the last forward updated each rank's own).
    ours(torch.zeros(2, 3, 8, 8))
    mean = _gathered(ours.module[1].running_mean, "running_mean")
    assert torch.equal(mean[0], mean[-1]), f"rank {r}: running means differ across ranks: {mean}"
    print(f"rank {r}: equal to DDP", flush=True)


def buffer_sync_off_and_no_sync() -> None:
    """broadcast_buffers=False leaves each rank's buffers its own, as DDP's;
    forwards inside no_sync() do not sync them either."""
    hvd.init()
    r = hvd.rank()
    ours = hvd.DistributedModel(_bn_net(seed=0), broadcast_buffers=False)
    for x, _ in _batches(r, 2):
        ours(x).sum().backward()
    mean = _gathered(ours.module[1].running_mean, "off")
    assert not torch.equal(mean[0], mean[1]), "broadcast_buffers=False synced the buffers"
    synced = hvd.DistributedModel(_bn_net(seed=0))
    own = _batches(r, 1)[0][0]
    common = _batches(0, 1)[0][0]
    with synced.no_sync():
        synced(own).sum().backward()  # each rank's statistics its own
        synced(common).sum().backward()  # had they been synced before this, they would now be equal
    mean = _gathered(synced.module[1].running_mean, "no_sync")
    assert not torch.equal(mean[0], mean[1]), "forwards inside no_sync() synced the buffers"


def buffer_rules_as_ddp() -> None:
    """Every combination of DDP's two buffer arguments, over a sequence of
    training, evaluation and no_sync() forwards, from buffers that differ per
    rank at the wrap: after each forward every rank's running statistics
    equal DDP's on the same rank (the init sync and DDP's
    require_forward_param_sync rule: train -> eval syncs, eval -> train and
    after no_sync() do not)."""
    import warnings

    hvd.init()
    r = hvd.rank()
    sequence = ["train", "train", "eval", "eval", "train", "no_sync", "train", "eval", "train"]
    for k, kw in enumerate(
        [{}, {"broadcast_buffers": False}, {"forward_sync_buffers": False}, {"forward_sync_buffers": True}]
    ):
        nets = []
        for _ in range(2):
            net = _bn_net(seed=0)
            with torch.no_grad():
                net[1].running_mean.fill_(float(r + 1))  # each rank its own statistics (a checkpoint on rank 0)
            nets.append(net)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # DDP's deprecation of broadcast_buffers
            ddp = torch.nn.parallel.DistributedDataParallel(nets[0], **kw)
        ours = hvd.DistributedModel(nets[1], name=f"buffer_rules.{k}", **kw)
        for i, (what, (x, _)) in enumerate(zip(sequence, _batches(r, len(sequence)))):
            for model in (ddp, ours):
                model.train(what != "eval")
                if what == "eval":
                    with torch.no_grad():
                        model(x)
                elif what == "no_sync":
                    with model.no_sync():
                        model(x).sum().backward()
                else:
                    model(x).sum().backward()
            want, got = ddp.module[1].running_mean, ours.module[1].running_mean
            assert torch.equal(got, want), f"rank {r}, {kw}, forward {i} ({what}): {got} vs DDP's {want}"
            assert ours.require_forward_param_sync == ddp.require_forward_param_sync, (kw, i, what)
        spread = _gathered(ours.module[1].running_mean, f"buffer_rules.{k}.spread")
        assert not torch.equal(spread[0], spread[1]), f"{kw}: the ranks' statistics never differed: no check"


def models_that_differ_are_named() -> None:
    """Ranks that built different models (a size read from the rank, a layer
    only some add) are refused at the wrap on every rank, naming the first
    parameter that differs and what each rank has, before any broadcast."""
    hvd.init()
    r = hvd.rank()
    width = 5 + r  # a hidden size that differs per rank
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, width))
    expect(
        ValueError,
        ["the models differ across ranks", "parameter '1.weight'", "rank 0: parameter '1.weight' [5, 4]", "[6, 4]"],
        lambda: hvd.DistributedModel(net, name="differ.shape"),
        r,
    )
    layers = [torch.nn.Linear(4, 4)] + ([torch.nn.BatchNorm1d(4)] if r == 1 else [])
    expect(
        ValueError,
        ["the models differ across ranks", "'1.weight'", "nothing (fewer tensors)"],
        lambda: hvd.DistributedModel(torch.nn.Sequential(*layers), name="differ.count"),
        r,
    )
    same = hvd.DistributedModel(torch.nn.Sequential(torch.nn.Linear(4, 4)), name="differ.none")
    assert same is not None


def names_in_messages() -> None:
    """An optimizer built over model.parameters() without named_parameters
    still names parameters by the module's names in its messages, where the
    module is known (a DistributedModel over them, or model=)."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.used(x)  # the unused layer gets no gradient on any rank

    hvd.init()
    torch.manual_seed(0)
    net = Net()
    model = hvd.DistributedModel(net, name="names.dm")
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), shard=2)
    model(torch.ones(2, 4)).sum().backward()
    expect(RuntimeError, ["unused.weight", "unused.bias"], opt.step, hvd.rank())
    assert "noname" not in opt._names[0], opt._names
    expect(
        ValueError,
        ["'used.weight'", "sharded optimizer"],
        lambda: hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), model=net),
        hvd.rank(),
    )


def replaced_grad_is_kept() -> None:
    """A .grad the user replaces between backward and step (set to None to
    skip a parameter this step, or to a tensor of its own) is what step()
    uses, as in one process: the reduction in flight never writes over it
    (DistributedOptimizer, whose reduction ends in step(); DistributedModel
    with sync="explicit", whose sync_gradients() ends it), or, where the
    reduction is still in flight when it is replaced (DistributedOptimizer
    before synchronize()), refused naming the way that works. shard=1 steps each
    bucket's shard as one tensor, so a .grad set to None there cannot skip
    its parameter: refused, naming it."""
    hvd.init()
    r = hvd.rank()

    def net():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))

    def run(route):
        m = net()
        start = [p.detach().clone() for p in m.parameters()]
        if route == "opt":
            model = m
            opt = hvd.DistributedOptimizer(
                torch.optim.SGD(m.parameters(), lr=0.5), named_parameters=m.named_parameters()
            )
        else:
            model = hvd.DistributedModel(m, sync="explicit", name=f"replaced.{route}")
            opt = torch.optim.SGD(m.parameters(), lr=0.5)
        opt.zero_grad()
        model(torch.full((2, 4), float(r + 1))).sum().backward()
        opt.step()  # a first step as usual (the optimizer's first one learns which gradients are sparse)
        start = [p.detach().clone() for p in m.parameters()]
        opt.zero_grad()
        model(torch.full((2, 4), float(r + 1))).sum().backward()
        weight, bias = m[0].weight, m[0].bias
        weight.grad = None  # skip it this step
        bias.grad = torch.ones_like(bias)  # a gradient of the user's own
        if route == "opt":  # the reduction ends in step(): the change check names both and the way that works
            expect(RuntimeError, ["'0.weight', '0.bias'", "replaced", "skip_synchronize"], opt.step, r)
            opt.synchronize()  # the refused step's reduction finishes; then the recipe the message names
            opt.zero_grad()
            model(torch.full((2, 4), float(r + 1))).sum().backward()
            opt.synchronize()
            weight.grad, bias.grad = None, torch.ones_like(bias)
            with opt.skip_synchronize():
                opt.step()
        else:
            model.sync_gradients()
            opt.step()
        assert torch.equal(weight, start[0]), f"rank {r}, {route}: a parameter whose .grad was set to None moved"
        assert weight.grad is None, f"rank {r}, {route}: .grad set to None came back: {weight.grad}"
        torch.testing.assert_close(bias.detach(), start[1] - 0.5, msg=lambda msg: f"rank {r}, {route}: bias: {msg}")
        assert not torch.equal(m[1].weight, start[2]), f"rank {r}, {route}: the untouched layer did not step"

    run("opt")
    run("dm")
    m = net()
    model = hvd.DistributedModel(m, name="replaced.shard1")
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.5), shard=1)
    model(torch.ones(2, 4)).sum().backward()
    m[0].weight.grad = None  # with the reduction still in flight: the change check names it
    expect(RuntimeError, ["'0.weight'", "replaced"], opt.step, r)
    opt.synchronize()
    m[0].weight.grad = None  # after it (Horovod's recipe): shard=1 cannot skip one parameter of a shard
    with opt.skip_synchronize():
        expect(RuntimeError, ["'0.weight'", "None", "shard=1"], opt.step, r)
    for stage, change in ((2, None), (2, "tensor")):
        m = net()
        model = hvd.DistributedModel(m, name=f"replaced.shard{stage}.{change}")
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.5), shard=stage)
        model(torch.ones(2, 4)).sum().backward()
        m[0].bias.grad = None if change is None else torch.ones_like(m[0].bias)
        expect(RuntimeError, ["'0.bias'", "replaced", f"shard={stage}"], opt.step, r)


def released_reducers_leave_no_hooks() -> None:
    """A gradient front that lets its parameters go removes every hook it put
    on them, the post-accumulate ones included: a DistributedModel handing
    its gradients to a sharded optimizer (after moving to the traced hooks
    compiled autograd uses), and a DistributedOptimizer (sparse_as_dense:
    post-accumulate hooks) taken over by a newer one. The gradients stepped
    on afterwards are reduced once: with op=hvd.Sum a second reduction
    would double them."""
    from hvdtorch.training.compiled_model import PassState, use_traced_hooks

    hvd.init()
    r, n = hvd.rank(), hvd.size()

    def post_hooks(params):
        return [set(p._post_accumulate_grad_hooks or {}) for p in params]

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    ref = copy.deepcopy(net)
    model = hvd.DistributedModel(net, op=hvd.Sum, name="released.dm")
    model._pass_state = PassState()
    model._traced_hooks = use_traced_hooks(model, model._params, model._pass_state)  # as compiled autograd does
    traced = {h.id for h in model._traced_hooks}
    assert all(traced & hooks for hooks in post_hooks(net.parameters())), "the traced hooks were not installed"
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=1.0), shard=1)
    for i, hooks in enumerate(post_hooks(net.parameters())):
        assert not traced & hooks, f"rank {r}: parameter {i} keeps the model's traced hooks after the hand-over"
    want = [torch.zeros_like(p) for p in ref.parameters()]
    for k in range(n):  # the Sum of every rank's gradient, once
        ref.zero_grad()
        ref(torch.full((2, 4), float(k + 1))).sum().backward()
        for w, q in zip(want, ref.parameters()):
            w += q.grad
    opt.zero_grad()
    model(torch.full((2, 4), float(r + 1))).sum().backward()
    opt.synchronize()
    for i, (p, w) in enumerate(zip(net.parameters(), want)):
        torch.testing.assert_close(p.grad, w, msg=lambda m: f"rank {r}: parameter {i} after the hand-over: {m}")

    # A DistributedOptimizer taken over by a newer one removes its post-accumulate hooks (sparse_as_dense).
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 3, sparse=True)
    before = post_hooks(emb.parameters())
    old = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1), sparse_as_dense=True)
    with_old = post_hooks(emb.parameters())
    assert all(len(o) > len(b) for o, b in zip(with_old, before)), "sparse_as_dense installed no hook"
    new = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1))
    for o, b, now in zip(with_old, before, post_hooks(emb.parameters())):
        assert not (o - b) & now, f"rank {r}: the older DistributedOptimizer's hooks are still there: {(o - b) & now}"
    del old, new


def ddp_arguments() -> None:
    """DDP's constructor arguments: accepted where they mean something here,
    refused naming the argument where they would mean something else."""
    import torch.distributed as dist

    hvd.init()
    net = _bn_net(0)
    model = hvd.DistributedModel(
        net,
        device_ids=None,
        output_device=None,
        dim=0,
        bucket_cap_mb=1,
        find_unused_parameters=True,
        gradient_as_bucket_view=True,
        static_graph=True,
        check_reduction=False,
        process_group=dist.group.WORLD,
    )
    wide = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])  # 1 MiB of weights each
    assert len(hvd.DistributedModel(wide, name="wide.default").bucket_bytes()) <= 2  # 25 MiB cap
    wide = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])
    assert len(hvd.DistributedModel(wide, bucket_cap_mb=1, name="wide.1mb").bucket_bytes()) >= 4
    x, y = _batches(hvd.rank(), 1)[0]
    F.cross_entropy(model(x), y).backward()
    # torch 2.13's newer arguments: accepted where they mean something here.
    from torch.distributed.device_mesh import init_device_mesh

    wide = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])
    listed = hvd.DistributedModel(
        wide,
        bucket_cap_mb_list=[1, 3],
        skip_all_reduce_unused_params=True,
        batched_grad_copy=True,
        device_mesh=init_device_mesh("cpu", (hvd.size(),)),
        name="wide.list",
    )
    caps = listed.bucket_bytes()
    assert caps[0] <= 1 << 20 < caps[1] <= 3 << 20, caps  # the first bucket's cap 1 MiB, every later one's 3
    accepted_device = hvd.DistributedModel(_bn_net(0), output_device="cpu", name="output.cpu")
    del accepted_device
    refused = [
        ("device_ids", dict(device_ids=[0])),
        ("output_device", dict(output_device="cuda:0")),
        # another device of the module's own type: the index is checked too, as DDP's device check does
        ("output_device", dict(output_device=torch.device("cpu", 1))),
        ("output_device", dict(output_device="cpu:1")),
        ("dim", dict(dim=1)),
        ("process_group", dict(process_group=dist.new_group([0]))),
        ("mixed_precision", dict(mixed_precision=object())),
        ("bucket_cap_mb", dict(bucket_cap_mb=0)),
        ("bucket_cap_mb_list", dict(bucket_cap_mb_list=[1, 0])),
        ("delay_all_reduce_named_params", dict(delay_all_reduce_named_params=[])),
        ("device_mesh", dict(device_mesh=init_device_mesh("cpu", (1, hvd.size())))),
    ]
    for arg, kwargs in refused:
        try:
            hvd.DistributedModel(_bn_net(0), **kwargs)
        except (TypeError, ValueError) as e:
            assert arg in str(e) and str(e).startswith("hvdtorch:"), f"{arg}: {e}"
        else:
            raise AssertionError(f"DistributedModel accepted {kwargs}")


def convert_sync_batchnorm() -> None:
    """hvd.SyncBatchNorm.convert_sync_batchnorm replaces every BatchNorm
    layer, nested ones too, keeping parameters and statistics, and the
    converted net normalizes over every rank's batch."""
    hvd.init()
    r = hvd.rank()
    net = _bn_net(0)
    for x, _ in _batches(r, 1):
        net(x)  # statistics of its own
    before = {k: v.clone() for k, v in net.state_dict().items()}
    converted = hvd.SyncBatchNorm.convert_sync_batchnorm(net)
    kinds = [type(m) for m in converted.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert kinds == [hvd.SyncBatchNorm, hvd.SyncBatchNorm], kinds
    for k, v in converted.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed in the conversion"
    # The union of the ranks' batches: from equal statistics, the same on every rank after a step.
    for m in converted.modules():
        if isinstance(m, hvd.SyncBatchNorm):
            m.reset_running_stats()
    x = _batches(r, 1)[0][0]
    converted(x)
    mean = _gathered(converted[1].running_mean, "sync_bn")
    torch.testing.assert_close(mean[0], mean[1])
    lone = torch.nn.BatchNorm1d(3)
    assert isinstance(hvd.SyncBatchNorm.convert_sync_batchnorm(lone), hvd.SyncBatchNorm)


def _clipped_ddp_step(ddp, opt, x, scaler=None) -> torch.Tensor:
    """The reference: DDP's step with torch's clipping between backward and
    step (under a GradScaler when given); returns the norm clipping saw."""
    opt.zero_grad()
    loss = ddp(x).pow(2).sum()
    if scaler is None:
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), 0.5)
        opt.step()
        return norm
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), 0.5)
    scaler.step(opt)
    scaler.update()
    return norm


def _assert_equal_to_ddp(net, ddp) -> None:
    for (name, p), q in zip(net.named_parameters(), ddp.module.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=lambda m: f"rank {hvd.rank()}: {name}: {m}")


def _clip_as_under_ddp(net, ddp, opt, ref_opt, g, r) -> None:
    """DDP's loop on ``net`` through ``opt``: torch's clip_grad_norm_
    between backward and step() (then GradScaler.unscale_ before it), each
    norm equal to DDP's, and the parameters after every step."""
    for step in range(4):
        scalers = (torch.amp.GradScaler("cpu", init_scale=8.0), torch.amp.GradScaler("cpu", init_scale=8.0))
        use_scaler = step >= 2
        x = torch.randn(8, 5, generator=g) * (3 + r)
        opt.zero_grad()
        loss = net(x).pow(2).sum()
        if use_scaler:
            scalers[0].scale(loss).backward()
            scalers[0].unscale_(opt)
        else:
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        if use_scaler:
            scalers[0].step(opt)
            scalers[0].update()
        else:
            opt.step()
        want = _clipped_ddp_step(ddp, ref_opt, x, scalers[1] if use_scaler else None)
        torch.testing.assert_close(norm, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"rank {r} step {step}: {m}")
        _assert_equal_to_ddp(net, ddp)


def _change_behind_the_stand_ins(net, opt, g, r, fix: str) -> None:
    """A gradient kept from an earlier step (a view of its bucket) and
    changed after backward races with the reduction: step() raises naming
    ``fix``; synchronize() then drains the pass."""
    x = torch.randn(8, 5, generator=g) * (3 + r)
    kept = net.weight.grad
    assert kept is not None and type(kept) is torch.Tensor
    net(x).pow(2).sum().backward()
    kept.mul_(0.5)
    try:
        opt.step()
    except RuntimeError as e:
        assert fix in str(e) and "weight" in str(e), str(e)
    else:
        raise AssertionError("a gradient changed behind the stand-ins was not refused")
    opt.synchronize()
    opt.zero_grad()


def clipping_between_backward_and_step() -> None:
    """DistributedOptimizer: torch's clip_grad_norm_ (and GradScaler.unscale_)
    between backward and step() see the average, as under DDP, and the
    training ends equal to DDP's; reading a .grad there waits for its
    reduction; step() inside skip_synchronize() without synchronize() steps
    on the average too; a change through an older reference is refused
    naming skip_synchronize()."""
    hvd.init()
    r = hvd.rank()
    torch.manual_seed(0)
    net = torch.nn.Linear(5, 3)
    ref = torch.nn.Linear(5, 3)
    ref.load_state_dict(net.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(ref)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.5), named_parameters=net.named_parameters())
    ref_opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(7 + r)
    _clip_as_under_ddp(net, ddp, opt, ref_opt, g, r)
    # A read waits: the norm of the pending gradient is the norm of the average.
    x = torch.randn(8, 5, generator=g) * (3 + r)
    opt.zero_grad()
    net(x).pow(2).sum().backward()
    seen = net.weight.grad.norm()
    ref_opt.zero_grad()
    ddp(x).pow(2).sum().backward()
    torch.testing.assert_close(seen, ddp.module.weight.grad.norm(), msg=lambda m: f"rank {r}: read .grad: {m}")
    with opt.skip_synchronize():
        opt.step()  # no synchronize(): the read finished the reduction
    ref_opt.step()
    _assert_equal_to_ddp(net, ddp)
    # Nothing read: step() inside skip_synchronize() steps on the average (its first read waits).
    x = torch.randn(8, 5, generator=g) * (3 + r)
    opt.zero_grad()
    net(x).pow(2).sum().backward()
    with opt.skip_synchronize():
        opt.step()
    ref_opt.zero_grad()
    ddp(x).pow(2).sum().backward()
    ref_opt.step()
    _assert_equal_to_ddp(net, ddp)
    _change_behind_the_stand_ins(net, opt, g, r, "skip_synchronize")
    # op=Sum (a second DistributedOptimizer over the same parameters, made while the first lives: it takes
    # them over, and the first raises if used): synchronize() after a read finished the reduction reduces
    # nothing again, and step() does not warn.
    import warnings

    total = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.5), named_parameters=net.named_parameters(), op=hvd.Sum
    )
    for _ in range(2):  # the first step learns which gradients are sparse, the second goes through the buckets
        x = torch.randn(8, 5, generator=g) * (3 + r)
        total.zero_grad()
        net(x).pow(2).sum().backward()
        local = torch.autograd.grad(net(x).pow(2).sum(), net.weight)[0]
        seen = net.weight.grad.clone()
        total.synchronize()
        torch.testing.assert_close(net.weight.grad, seen)
        torch.testing.assert_close(seen, hvd.allreduce(local, op=hvd.Sum, name="sum_ref"), rtol=1e-5, atol=1e-5)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            total.step()
    # Adasum's optimizer takes part in the same rule, in both directions.
    adasum = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.5), named_parameters=net.named_parameters(), op=hvd.Adasum
    )
    last = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.5), named_parameters=net.named_parameters())
    for use in (opt.step, opt.synchronize, total.step, adasum.step):
        try:
            use()
        except RuntimeError as e:
            assert "a newer hvd.DistributedOptimizer over it took its parameters over" in str(e), e
        else:
            raise AssertionError(f"rank {r}: {use.__qualname__}() of a DistributedOptimizer taken over ran")
    last.zero_grad()
    net(torch.randn(8, 5, generator=g)).pow(2).sum().backward()
    last.step()  # the newest one trains


def one_optimizer_across_sharding() -> None:
    """One optimizer reduces a parameter's gradient, across the plain and
    sharded fronts too. A sharded optimizer made over a live plain one takes
    the parameters over (the old one raises if used) and its Sum step equals
    one Sum step (two fronts would add every gradient twice); any
    DistributedOptimizer made over a live sharded one is refused, naming the
    parameter and the fix; once the old one is dropped (with the scheduler
    that held it) a new one trains."""
    hvd.init()
    r = hvd.rank()
    for shard in (1, 2):
        net = torch.nn.Linear(5, 3)
        hvd.broadcast_parameters(net.state_dict(), root_rank=0)
        x = torch.randn(4, 5, generator=torch.Generator().manual_seed(r)) * (1 + r)
        local = torch.autograd.grad(net(x).pow(2).sum(), net.weight)[0]
        expected = net.weight.detach() - 0.5 * hvd.allreduce(local, op=hvd.Sum, name=f"sum_ref{shard}")
        plain = hvd.DistributedOptimizer(
            torch.optim.SGD(net.parameters(), lr=0.5), named_parameters=net.named_parameters(), op=hvd.Sum
        )
        sharded = hvd.DistributedOptimizer(
            torch.optim.SGD(net.parameters(), lr=0.5), named_parameters=net.named_parameters(), op=hvd.Sum, shard=shard
        )
        sched = torch.optim.lr_scheduler.StepLR(sharded, 1)
        sharded.zero_grad()
        net(x).pow(2).sum().backward()
        sharded.step()
        torch.testing.assert_close(net.weight.detach(), expected, msg=lambda m: f"rank {r} shard={shard}: {m}")
        for use in (plain.step, plain.synchronize):
            expect(RuntimeError, ["took its parameters over"], use, r)
        for later in ({}, {"shard": shard}, {"op": hvd.Adasum}):
            expect(
                ValueError,
                ["'weight'", f"shard={shard}", "still alive", "Drop the old one first"],
                lambda: hvd.DistributedOptimizer(
                    torch.optim.SGD(net.parameters(), lr=0.5), named_parameters=net.named_parameters(), **later
                ),
                r,
            )
        # Dropped, but kept by a reference cycle (as a closure over it would keep it) until the next
        # collection, which automatic collection must not run first: the new optimizer does not count it.
        gc.disable()
        try:
            holder = {"opt": sharded}
            holder["self"] = holder
            del sharded, sched, holder
            again = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.5), shard=shard)
        finally:
            gc.enable()
        again.zero_grad()
        net(x).pow(2).sum().backward()
        again.step()


class _TwoBranches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 3)
        self.b = torch.nn.Linear(4, 3)

    def forward(self, x, use_b: bool):
        return self.a(x) + (self.b(x) if use_b else 0)


def unused_branch_on_one_rank() -> None:
    """DistributedOptimizer with a layer only rank 1 uses, from the first
    step (reduced at step(), the reducer built then) on, with and without
    Compression.fp16: the norm read between backward and step() and the
    parameters after each step equal DDP's (find_unused_parameters=True)."""
    import copy

    hvd.init()
    r = hvd.rank()
    for compression, tol in ((hvd.Compression.none, 1e-6), (hvd.Compression.fp16, 1e-2)):
        torch.manual_seed(0)
        net = _TwoBranches()
        ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(net), find_unused_parameters=True)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters(), compression=compression
        )
        ref_opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(3):
            x = torch.randn(5, 4, generator=torch.Generator().manual_seed(10 * step + r))
            opt.zero_grad()
            net(x, r == 1).pow(2).sum().backward()
            seen = net.b.weight.grad.norm()
            opt.step()
            ref_opt.zero_grad()
            ddp(x, r == 1).pow(2).sum().backward()
            want = ddp.module.b.weight.grad.norm()
            ref_opt.step()
            what = f"rank {r}, {compression.__name__}, step {step}"
            torch.testing.assert_close(seen, want, rtol=tol, atol=tol, msg=lambda m: f"{what}: read .grad: {m}")
            for (name, p), q in zip(net.named_parameters(), ddp.module.parameters()):
                torch.testing.assert_close(p, q, rtol=tol, atol=tol, msg=lambda m: f"{what}: {name}: {m}")
    hvd.shutdown()


def _sharded_linear_beside_ddp(shard: int):
    """A Linear with a sharded SGD, its DDP twin with a plain one, this rank's
    data generator and a first batch: (rank, net, ddp, opt, ref_opt, g, x)."""
    import copy

    hvd.init()
    r = hvd.rank()
    torch.manual_seed(0)
    net = torch.nn.Linear(5, 3)
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(net))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.5), named_parameters=net.named_parameters(), shard=shard
    )
    ref_opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(7 + r)
    return r, net, ddp, opt, ref_opt, g, torch.randn(8, 5, generator=g) * (3 + r)


def torch_clipping_with_shard1() -> None:
    """shard=1: torch's clip_grad_norm_ (and GradScaler.unscale_) between
    backward and step() see the average and the training ends equal to
    DDP's, as does optimizer.clip_grad_norm_; a change through an older
    reference is refused naming optimizer.clip_grad_norm_."""
    r, net, ddp, opt, ref_opt, g, _ = _sharded_linear_beside_ddp(1)
    _clip_as_under_ddp(net, ddp, opt, ref_opt, g, r)
    _change_behind_the_stand_ins(net, opt, g, r, "optimizer.clip_grad_norm_")
    # The drained pass was not stepped on: the next one is reduced again by clip_grad_norm_ (not taken as
    # already reduced: that synchronize() had no step() after it).
    for _ in range(2):
        x = torch.randn(8, 5, generator=g) * (3 + r)
        opt.zero_grad()
        net(x).pow(2).sum().backward()
        opt.clip_grad_norm_(0.5)
        opt.step()
        _clipped_ddp_step(ddp, ref_opt, x)
    _assert_equal_to_ddp(net, ddp)


def _expect_held(what: str, fn) -> None:
    try:
        fn()
    except RuntimeError as e:
        assert "shard=2" in str(e) and "optimizer.clip_grad_norm_" in str(e) and "weight" in str(e), str(e)
    else:
        raise AssertionError(f"shard=2: {what} between backward and step() was not refused")


def torch_clipping_with_shard2() -> None:
    """shard=2 keeps no .grad: torch's clip_grad_norm_ (and any other use of
    .grad: GradScaler, a manual norm) between backward and step() raises
    naming optimizer.clip_grad_norm_, which ends equal to DDP with clipping.
    A pass after synchronize() (refused at step(): it would not add up as
    under DDP), a no_sync() pass and zero_grad(set_to_none=False) find no
    stand-in left in their way."""
    r, net, ddp, opt, ref_opt, g, x = _sharded_linear_beside_ddp(2)
    opt.zero_grad()
    net(x).pow(2).sum().backward()
    _expect_held("torch.nn.utils.clip_grad_norm_", lambda: torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5))
    _expect_held("torch.nn.utils.clip_grad_value_", lambda: torch.nn.utils.clip_grad_value_(net.parameters(), 0.5))
    _expect_held("a norm of .grad", lambda: net.weight.grad.norm())
    opt.synchronize()
    _expect_held("clipping after synchronize()", lambda: torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5))
    # A second pass finds the stand-ins gone before it accumulates; its gradients would replace the
    # synchronized ones where DDP adds them, so step() refuses.
    net(x).pow(2).sum().backward()
    try:
        opt.step()
    except RuntimeError as e:
        assert "after synchronize()" in str(e) and "zero_grad()" in str(e), str(e)
    else:
        raise AssertionError("shard=2: a pass after synchronize() replaced its gradients silently")
    opt.zero_grad(set_to_none=False)  # drops the synchronized gradients; no stand-in in the way
    assert net.weight.grad is None or type(net.weight.grad) is torch.Tensor, type(net.weight.grad)
    with opt.no_sync():
        net(x).pow(2).sum().backward()  # accumulates locally: real gradients, left alone
    assert type(net.weight.grad) is torch.Tensor, type(net.weight.grad)
    opt.zero_grad()
    for step in range(3):
        x = torch.randn(8, 5, generator=g) * (3 + r)
        opt.zero_grad(set_to_none=step % 2 == 0)
        net(x).pow(2).sum().backward()
        opt.clip_grad_norm_(0.5)
        opt.step()
        assert net.weight.grad is None, "shard=2: a stand-in .grad outlived step()"
        _clipped_ddp_step(ddp, ref_opt, x)
    _assert_equal_to_ddp(net, ddp)


def sharded_checkpoint_the_usual_way() -> None:
    """A sharded optimizer's state_dict() without consolidate_state_dict()
    raises naming it (a rank's own state is a shard); after it, state_dict()
    is the whole state on the ranks it went to, until the next step(); it
    resumes an unsharded optimizer exactly. sharded_state_dict() is the
    per-rank form."""
    hvd.init()
    r = hvd.rank()
    torch.manual_seed(0)
    net = torch.nn.Linear(5, 3)
    twin = torch.nn.Linear(5, 3)
    twin.load_state_dict(net.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.Adam(net.parameters(), lr=0.1), shard=2)
    plain = torch.optim.Adam(twin.parameters(), lr=0.1)
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(3))  # the same batch on every rank

    def refused(what: str) -> None:
        try:
            opt.state_dict()
        except RuntimeError as e:
            assert "consolidate_state_dict" in str(e) and "sharded_state_dict" in str(e), str(e)
        else:
            raise AssertionError(f"rank {r}: state_dict() {what} was not refused")

    for _ in range(2):
        opt.zero_grad()
        net(x).pow(2).sum().backward()
        opt.step()
        plain.zero_grad()
        twin(x).pow(2).sum().backward()
        plain.step()
    refused("before consolidate_state_dict()")
    full = opt.consolidate_state_dict(to=0)
    if r == 0:
        assert opt.state_dict() is full
        fresh = torch.optim.Adam(torch.nn.Linear(5, 3).parameters(), lr=0.1)
        fresh.load_state_dict(opt.state_dict())  # an unsharded optimizer resumes from it
        for k, v in plain.state_dict()["state"].items():
            for key, want in v.items():
                torch.testing.assert_close(full["state"][k][key], want, msg=lambda m, k=k, key=key: f"{k}.{key}: {m}")
    else:
        refused("on a rank consolidate_state_dict(to=0) did not give it to")
    opt.consolidate_state_dict(to=None)
    assert opt.state_dict()["state"].keys() == plain.state_dict()["state"].keys()
    opt.zero_grad()
    net(x).pow(2).sum().backward()
    opt.step()
    refused("after a step() that made the consolidated state stale")
    shard = opt.sharded_state_dict()
    assert shard["hvdtorch_shard"]["rank"] == r, shard["hvdtorch_shard"]
    every = hvd.allgather_object(shard, name="from_ddp.shards")
    opt.load_state_dict(every)  # the list of every rank's shards loads anywhere


def elastic_state_keeps_a_scheduler_in_place() -> None:
    """hvd.elastic.TorchState with a scheduler and a GradScaler as extras:
    restore() and sync() put their state back into those same objects, so
    the schedule goes on driving the real optimizer (a deep copy of the
    scheduler would drive a copy of it, silently)."""
    hvd.init()
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=1.0)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    state = hvd.elastic.TorchState(net, opt, schedule=schedule, scaler=scaler, epoch=0)
    assert state.schedule is schedule and state.scaler is scaler
    state.commit()
    for _ in range(2):
        opt.step()
        schedule.step()
    scaler.scale(torch.ones(()))  # the scale starts to exist
    scaler.update(new_scale=2.0)
    assert opt.param_groups[0]["lr"] == 0.25
    state.restore()
    assert state.schedule is schedule and state.scaler is scaler, "restore() replaced the extras"
    assert schedule.last_epoch == 0 and opt.param_groups[0]["lr"] == 1.0, (schedule.last_epoch, opt.param_groups)
    assert scaler.get_scale() == 8.0, scaler.get_scale()
    schedule.step()
    assert opt.param_groups[0]["lr"] == 0.5, "the restored schedule does not drive the optimizer"
    if hvd.rank() == 1:
        schedule.step()  # rank 1 ahead; sync() makes it rank 0's again
    state.sync()
    assert schedule.last_epoch == 1 and state.schedule is schedule, schedule.last_epoch


def uneven_data_with_join() -> None:
    """Uneven data (rank 0 runs out first): DistributedModel with hvd.join(),
    then the model broadcast from the rank that joined last, ends with DDP's
    parameters under ddp.join() (which averages with zeros from joined ranks
    and syncs the final model from the last joiner, as here), and with equal
    buffers on every rank."""
    import copy

    hvd.init()
    r = hvd.rank()
    net = _bn_net(seed=0)
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(net))
    ours = hvd.DistributedModel(net)
    batches = _batches(r, 2 + 2 * r)
    ref_opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    with ddp.join():
        for x, y in batches:
            ref_opt.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            ref_opt.step()
    opt = torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9)
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(ours(x), y).backward()
        opt.step()
    last = hvd.join()
    assert last == 1, last
    hvd.broadcast_parameters(ours.module.state_dict(), root_rank=last)
    want = dict(ddp.module.named_parameters())
    for name, p in ours.module.named_parameters():
        torch.testing.assert_close(p, want[name], rtol=1e-5, atol=1e-6, msg=lambda m: f"rank {r}: {name}: {m}")
    for name, t in ours.module.named_buffers():
        everyone = _gathered(t, f"join.{name}")
        assert torch.equal(everyone[0], everyone[-1]), f"rank {r}: buffer {name} differs across ranks"


def adasum_state_of_another_rank() -> None:
    """op=hvd.Adasum: each rank's optimizer state is its own, so rank 0's
    state loaded on rank 1 (the usual rank-0 checkpoint) is refused naming
    the ways out; the list of every rank's states loads each its own, and
    hvd.broadcast_optimizer_state starts every rank from the root's."""
    hvd.init()
    r = hvd.rank()
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), op=hvd.Adasum)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(r))
    opt.zero_grad()
    net(x).pow(2).sum().backward()
    opt.step()
    mine = opt.state_dict()
    every = hvd.allgather_object(mine, name="from_ddp.adasum.states")
    rank0 = every[0]
    if r == 1:
        try:
            opt.load_state_dict(rank0)
        except ValueError as e:
            assert "rank 0's" in str(e) and "broadcast_optimizer_state" in str(e), str(e)
        else:
            raise AssertionError("rank 1 took rank 0's Adasum optimizer state silently")
    opt.load_state_dict(every)
    buf = opt.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(buf, mine["state"][0]["momentum_buffer"]), "the list did not give this rank its own state"
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    buf = opt.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(buf, rank0["state"][0]["momentum_buffer"]), "broadcast_optimizer_state did not give rank 0's"


def adasum_commit_of_another_host(folder: str) -> None:
    """Ranks on two hosts (each its host's writer) commit an op=hvd.Adasum
    job into one shared folder, which keeps rank 1's commit. A restarted job
    resumes from it: rank 0 loads rank 1's state on purpose (a commit is the
    job's) and sync() hands it to every rank."""
    from hvdtorch.elastic import persist

    hvd.init()
    r = hvd.rank()
    assert hvd.local_rank() == 0, "each rank its own host"
    torch.manual_seed(0)

    def job():
        net = torch.nn.Linear(4, 2)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), op=hvd.Adasum)
        return net, opt, hvd.elastic.TorchState(net, opt, commit_dir=folder, step=0)

    net, opt, state = job()
    opt.zero_grad()
    net(torch.randn(3, 4, generator=torch.Generator().manual_seed(r))).pow(2).sum().backward()
    opt.step()
    state.commit()
    if r == 1:  # the folder keeps rank 1's commit, whichever writer came last
        persist.write_atomically(state.commit_path, state._snapshot())
    saved = hvd.broadcast_object(opt.state_dict() if r == 1 else None, 1, name="from_ddp.rank1_state")
    hvd.barrier()
    net, opt, state = job()  # restarted

    @hvd.elastic.run
    def resumed(state):
        return opt.state_dict()["state"][0]["momentum_buffer"]

    buf = resumed(state)
    assert torch.equal(buf, saved["state"][0]["momentum_buffer"]), "the commit's state did not reach every rank"


def powersgd_state_of_another_rank() -> None:
    """Compression.powersgd's error feedback is each rank's own: rank 0's
    state loaded on rank 1 is refused naming the ways out, inside a
    DistributedOptimizer's state too; the list of every rank's loads each
    its own; hvd.broadcast_optimizer_state still gives every rank the root's."""
    hvd.init()
    r = hvd.rank()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Linear(6, 2))
    compression = hvd.Compression.powersgd(rank=1, start_iter=0, min_compression_rate=0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters(), compression=compression
    )
    for step in range(2):
        x = torch.randn(3, 6, generator=torch.Generator().manual_seed(10 * r + step))
        opt.zero_grad()
        net(x).pow(2).sum().backward()
        opt.step()
    mine = compression.state_dict()
    assert mine["errors"], "nothing was compressed"
    every = hvd.allgather_object(mine, name="from_ddp.powersgd.states")
    whole = hvd.allgather_object(opt.state_dict(), name="from_ddp.powersgd.opt_states")
    if r == 1:
        for what, load in (
            ("the compressor", lambda: compression.load_state_dict(every[0])),
            ("the optimizer", lambda: opt.load_state_dict(whole[0])),
        ):
            try:
                load()
            except ValueError as e:
                assert "rank 0's" in str(e) and "every rank's state" in str(e), str(e)
            else:
                raise AssertionError(f"rank 1 took rank 0's PowerSGD errors through {what} silently")
    compression.load_state_dict(every)
    for k, v in compression.state_dict()["errors"].items():
        assert torch.equal(v, mine["errors"][k]), "the list did not give this rank its own errors"
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for k, v in compression.state_dict()["errors"].items():
        assert torch.equal(v, every[0]["errors"][k]), "broadcast_optimizer_state did not give rank 0's errors"


def scheduler_built_before_sharding() -> None:
    """A learning-rate scheduler built on the optimizer before shard=1/2
    wraps it drives the sharded optimizer: parameters end as one process's
    with the same schedule (every rank feeds the same batch, so the average
    gradient is the local one)."""
    import copy

    hvd.init()
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(3))
    for shard in (1, 2):
        torch.manual_seed(0)
        net = torch.nn.Linear(6, 4)
        ref = copy.deepcopy(net)
        inner = torch.optim.SGD(net.parameters(), lr=0.4, momentum=0.5)
        schedule = torch.optim.lr_scheduler.StepLR(inner, step_size=1, gamma=0.5)
        opt = hvd.DistributedOptimizer(inner, named_parameters=net.named_parameters(), shard=shard)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.4, momentum=0.5)
        ref_schedule = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
        for _ in range(4):
            for model, o, s in ((net, opt, schedule), (ref, ref_opt, ref_schedule)):
                o.zero_grad()
                model(x).pow(2).sum().backward()
                o.step()
                s.step()
        assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"] == 0.4 / 16, opt.param_groups[0]["lr"]
        for (name, p), q in zip(net.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, msg=lambda m: f"shard={shard}, {name}: {m}")


def sharded_optimizer_before_the_model() -> None:
    """A sharded optimizer built before DistributedModel wraps the module is
    refused by the model, naming the order that works; that order trains."""
    hvd.init()
    for shard in (1, 2):
        net = torch.nn.Linear(6, 4)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters(), shard=shard
        )
        try:
            hvd.DistributedModel(net)
        except ValueError as e:
            assert "build the optimizer after it" in str(e) and "weight" in str(e), str(e)
        else:
            raise AssertionError(f"shard={shard}: DistributedModel took parameters a sharded optimizer steps")
        del opt
    net = torch.nn.Linear(6, 4)
    model = hvd.DistributedModel(net)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), shard=1)
    model(torch.randn(3, 6)).sum().backward()
    opt.step()


def torch_env_after_init() -> None:
    """Under mpirun (no torch variables set by the launcher) init() sets
    RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE; shutdown() takes
    them away again."""
    hvd.init()
    got = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    want = {
        "RANK": str(hvd.rank()),
        "WORLD_SIZE": str(hvd.size()),
        "LOCAL_RANK": str(hvd.local_rank()),
        "LOCAL_WORLD_SIZE": str(hvd.local_size()),
    }
    assert got == want, f"{got} != {want}"
    hvd.shutdown()
    left = [k for k in want if k in os.environ]
    assert not left, f"left after shutdown: {left}"
    print(f"rank {want['RANK']}: torch env ok", flush=True)


if __name__ == "__main__":
    globals()[sys.argv[1]]()
