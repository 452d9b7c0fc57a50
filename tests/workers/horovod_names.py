"""Horovod's remaining names and behaviours: exception classes, build flags,
run-time timeline, the deprecated average= argument, and DistributedOptimizer's
contract (named_parameters optional, backward_passes_per_step, misuse errors
and warnings) -- each against what horovod.torch 0.28 does."""

import copy
import json
import os
import time
import warnings

import torch
import torch.nn.functional as F

import hvdtorch as hvd

STEPS, PER_RANK = 3, 3


def expect(exc_class, call, contains=""):
    try:
        call()
    except exc_class as e:
        assert contains in str(e), f"{exc_class.__name__} without {contains!r}: {e}"
        return e
    raise AssertionError(f"no {exc_class.__name__} (expected one mentioning {contains!r})")


def check_names_and_flags():
    assert hvd.HorovodInternalError is hvd.HvdError and issubclass(hvd.HvdError, RuntimeError)
    e = hvd.HostsUpdatedInterrupt(True)
    assert isinstance(e, RuntimeError) and e.skip_sync is True
    expect(ValueError, lambda: hvd.start_timeline("/tmp/never-written.json"), "init")
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    assert (hvd.ccl_built(), hvd.ddl_built(), hvd.rocm_built()) == (False, False, False)  # cuda_built: test_build.py
    assert hvd.mpi_enabled() is False and hvd.mpi_built() is False
    assert hvd.gloo_enabled() is True and hvd.gloo_built() is True
    expect(ValueError, hvd.mpi_threads_supported, "MPI")
    # A mismatch across ranks is an internal error, caught under Horovod's name.
    if n > 1:
        e = expect(
            hvd.HorovodInternalError, lambda: hvd.allreduce(torch.ones(2 + (r == 1)), name="mismatch"), "mismatch"
        )
        assert type(e) is hvd.HvdError
    hvd.shutdown()


def check_is_homogeneous(expected):
    hvd.init()
    assert hvd.is_homogeneous() is (expected == "yes"), (
        f"rank {hvd.rank()}: local_size {hvd.local_size()} cross_size {hvd.cross_size()}: {hvd.is_homogeneous()}"
    )
    hvd.shutdown()


def lost_peer():
    hvd.init()
    r = hvd.rank()
    hvd.allreduce(torch.ones(2), name="warmup")
    if r == 1:
        print("READY-TO-DIE", flush=True)
        time.sleep(60)  # killed by the harness
        return
    time.sleep(0.5)
    try:
        for i in range(1000):
            hvd.allreduce(torch.ones(100), name=f"after.{i}")
    except hvd.HorovodInternalError as e:
        print(f"rank {r} caught HorovodInternalError: {e}", flush=True)
    else:
        raise AssertionError("no error although rank 1 died")


def check_average_argument():
    """Every op Horovod still accepts average= on: average=True is Average,
    False is Sum, with a DeprecationWarning; together with op= it is a ValueError."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    x = lambda: torch.full((3,), float(r + 1))  # noqa: E731
    total = float(sum(range(1, n + 1)))
    ops = {
        "allreduce": lambda avg, **kw: hvd.allreduce(x(), avg, **kw),
        "allreduce_": lambda avg, **kw: hvd.allreduce_(x(), avg, **kw),
        "allreduce_async": lambda avg, **kw: hvd.synchronize(hvd.allreduce_async(x(), avg, **kw)),
        "allreduce_async_": lambda avg, **kw: hvd.synchronize(hvd.allreduce_async_(x(), avg, **kw)),
        "grouped_allreduce": lambda avg, **kw: hvd.grouped_allreduce([x(), x()], avg, **kw)[1],
        "grouped_allreduce_": lambda avg, **kw: hvd.grouped_allreduce_([x(), x()], avg, **kw)[1],
        "grouped_allreduce_async": lambda avg, **kw: hvd.synchronize(hvd.grouped_allreduce_async([x()], avg, **kw))[0],
        "grouped_allreduce_async_": lambda avg, **kw: hvd.synchronize(hvd.grouped_allreduce_async_([x()], avg, **kw))[
            0
        ],
    }
    for name, call in ops.items():
        for average, want in ((True, total / n), (False, total), (None, total / n)):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = call(average)
            torch.testing.assert_close(got, torch.full((3,), want), msg=lambda m: f"{name} average={average}: {m}")
            deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
            assert len(deprecations) == (average is not None), f"{name} average={average}: {caught}"
        expect(ValueError, lambda: call(True, op=hvd.Sum), "average")
    hvd.shutdown()


def check_timeline_at_run_time(directory):
    hvd.init()
    r = hvd.rank()
    first = os.path.join(directory, "first-{rank}.json")
    second = os.path.join(directory, "second.json")
    hvd.allreduce(torch.ones(2), name="before.start")
    hvd.start_timeline(first)
    hvd.allreduce(torch.ones(2), name="while.first")
    hvd.start_timeline(second, mark_cycles=True)  # switches files
    hvd.allreduce(torch.ones(2), name="while.second")
    hvd.stop_timeline()
    hvd.allreduce(torch.ones(2), name="after.stop")
    hvd.stop_timeline()  # nothing to stop: no-op
    expect(ValueError, lambda: hvd.start_timeline(os.path.join(directory, "missing-dir", "t-{rank}.json")), "timeline")
    hvd.barrier()
    names = lambda events: {e["args"]["name"] for e in events if e.get("ph") == "M"}  # noqa: E731
    with open(first.replace("{rank}", str(r))) as f:
        one = json.load(f)
    assert "while.first" in names(one) and not names(one) & {"before.start", "while.second", "after.stop"}, one
    if r == 0:  # without {rank} only rank 0 writes
        with open(second) as f:
            two = json.load(f)
        assert "while.second" in names(two) and "after.stop" not in names(two), two
        assert any(e["name"] == "CYCLE_START" for e in two), "mark_cycles=True marked no cycle"
        assert not any(e["name"] == "CYCLE_START" for e in one), "cycles marked without mark_cycles"
        assert any(e.get("ph") == "B" and e["name"].startswith("ALLREDUCE") for e in two)
    hvd.shutdown()


# ---- DistributedOptimizer ------------------------------------------------------


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def batch(i, n):
    g = torch.Generator().manual_seed(500 + i)
    return torch.randn(PER_RANK * n, 4, generator=g), torch.randint(0, 3, (PER_RANK * n,), generator=g)


def shard_loss(model, i, r, n):
    x, y = batch(i, n)
    return F.cross_entropy(model(x[r * PER_RANK : (r + 1) * PER_RANK]), y[r * PER_RANK : (r + 1) * PER_RANK])


def reference(base, n, passes_per_step, steps=STEPS, lr=0.1):
    """One process: each step's gradient is the sum over its passes of the mean over ranks."""
    model = copy.deepcopy(base)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for s in range(steps):
        opt.zero_grad()
        for p in range(passes_per_step):
            (sum(shard_loss(model, s * passes_per_step + p, k, n) for k in range(n)) / n).backward()
        opt.step()
    return model


def close(a, b, what):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(
            p.detach(), q.detach(), atol=1e-5, rtol=1e-4, msg=lambda m: f"rank {hvd.rank()}: {what}: {name}: {m}"
        )


def check_optimizer_training():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    base = Net()
    # Without named_parameters, with gradient_predivide_factor, with backward_passes_per_step.
    for what, passes, kw in (
        ("no named_parameters", 1, {}),
        ("gradient_predivide_factor=2", 1, {"gradient_predivide_factor": 2.0}),
        ("backward_passes_per_step=2", 2, {"backward_passes_per_step": 2}),
        ("backward_passes_per_step=3", 3, {"backward_passes_per_step": 3, "groups": 2}),
    ):
        model = copy.deepcopy(base)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), **kw)
        for s in range(STEPS):
            opt.zero_grad()
            for p in range(passes):
                shard_loss(model, s * passes + p, r, n).backward()
            opt.step()
        close(model, reference(base, n, passes), what)
    # step() after fewer passes than backward_passes_per_step reduces what is there
    # (Horovod's behaviour), and the count starts again after it.
    model = copy.deepcopy(base)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
        backward_passes_per_step=3,
    )
    for s in range(STEPS):
        opt.zero_grad()
        for p in range(2):
            shard_loss(model, s * 2 + p, r, n).backward()
        opt.step()
    close(model, reference(base, n, 2), "step() after 2 of 3 passes")
    # set_backward_passes_per_step changes the count.
    opt.set_backward_passes_per_step(1)
    opt.zero_grad()
    shard_loss(model, 0, r, n).backward()
    opt.step()
    expect_same_on_every_rank(model, "after set_backward_passes_per_step(1)")
    hvd.shutdown()


def expect_same_on_every_rank(model, what):
    for name, p in model.named_parameters():
        mean = hvd.allreduce(p.detach(), op=hvd.Average, name=f"same.{name}")
        torch.testing.assert_close(
            p.detach(),
            mean,
            atol=1e-6,
            rtol=1e-6,
            msg=lambda m: f"rank {hvd.rank()}: {what}: {name} differs across ranks: {m}",
        )


def check_optimizer_misuse():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(1)
    model = Net()
    # Argument checks (Horovod raises ValueError for each).
    sgd = lambda: torch.optim.SGD(model.parameters(), lr=0.1)  # noqa: E731
    expect(
        ValueError, lambda: hvd.DistributedOptimizer(sgd(), named_parameters=[p for p in model.parameters()]), "tuples"
    )
    expect(
        ValueError,
        lambda: hvd.DistributedOptimizer(sgd(), named_parameters=[("w", p) for p in model.parameters()]),
        "unique",
    )
    expect(
        ValueError,
        lambda: hvd.DistributedOptimizer(sgd(), named_parameters=list(model.named_parameters())[:2]),
        "not in it",
    )
    expect(ValueError, lambda: hvd.DistributedOptimizer(sgd(), groups=0), "groups")
    expect(ValueError, lambda: hvd.DistributedOptimizer(sgd(), groups=[[1.0]]), "torch.Tensor")
    expect(
        ValueError,
        lambda: hvd.DistributedOptimizer(sgd(), groups=[[model.fc1.weight], [model.fc1.weight]]),
        "more than once",
    )
    expect(
        ValueError,
        lambda: hvd.DistributedOptimizer(sgd(), op=hvd.Sum, gradient_predivide_factor=2.0),
        "gradient_predivide_factor",
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hvd.DistributedOptimizer(torch.optim.SGD(Net().parameters(), lr=0.1), num_groups=2)
    assert any(issubclass(w.category, DeprecationWarning) and "num_groups" in str(w.message) for w in caught)

    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        backward_passes_per_step=2,
    )
    shard_loss(model, 0, r, n).backward()
    if n > 1:
        # zero_grad() between backward and step(): AssertionError (the gradients are in flight).
        expect(AssertionError, opt.zero_grad, "zero_grad")
    shard_loss(model, 1, r, n).backward()
    # torch.autograd.grad accumulates nothing, so it is no backward pass.
    torch.autograd.grad(shard_loss(model, 9, r, n), list(model.parameters()))
    if n > 1:
        # A third pass with backward_passes_per_step=2: AssertionError during backward.
        expect(AssertionError, lambda: shard_loss(model, 2, r, n).backward(), "backward_passes_per_step=2")
    opt.step()  # the two passes are reduced; the failed third one contributed nothing
    expect_same_on_every_rank(model, "step() after a rejected extra pass")
    opt.zero_grad()

    # synchronize() then step() without skip_synchronize(): a UserWarning (and the
    # gradients are reduced again, as Horovod does); inside skip_synchronize(): none.
    opt.set_backward_passes_per_step(1)
    shard_loss(model, 3, r, n).backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    assert [w for w in caught if issubclass(w.category, UserWarning) and "skip_synchronize" in str(w.message)], caught
    opt.zero_grad()
    shard_loss(model, 4, r, n).backward()
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with opt.skip_synchronize():
            opt.step()
        opt.zero_grad()
        # step() again without a backward pass: Horovod reduces the (absent) gradients again, silently.
        opt.step()
    expect_same_on_every_rank(model, "clipping inside skip_synchronize()")

    # step() inside skip_synchronize() without synchronize(): Horovod steps on
    # gradients still in flight; here the inner step's first read of .grad
    # finishes the reduction (training/pending_gradients.py), so the ranks
    # step alike and nothing stays pending.
    opt.zero_grad()
    shard_loss(model, 5, r, n).backward()
    with opt.skip_synchronize():
        opt.step()
    expect_same_on_every_rank(model, "step() inside skip_synchronize() without synchronize()")
    opt.zero_grad()
    # Without a step between, a second pass raises in backward, as in Horovod.
    shard_loss(model, 6, r, n).backward()
    if n > 1:
        expect(AssertionError, opt.zero_grad, "zero_grad")
        expect(AssertionError, lambda: shard_loss(model, 6, r, n).backward(), "backward_passes_per_step=1")
    opt.synchronize()
    opt.zero_grad()
    # load_state_dict forgets the passes counted so far.
    shard_loss(model, 7, r, n).backward()
    opt.load_state_dict(opt.state_dict())
    opt.zero_grad()
    shard_loss(model, 8, r, n).backward()
    opt.step()
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(n)))
    hvd.shutdown()
