"""Stepping the optimizer bucket by bucket (training/bucketed_step.py) under
DistributedModel.sync_and_step() and DistributedOptimizer.step(): the same
parameters as the single-process reference, one optimizer step per piece,
each piece stepped right after its buckets were waited for."""

import copy

import torch
import torch.nn.functional as F

import hvdtorch as hvd
from tests.workers.common import device_of

STEPS = 3
PER_RANK = 2
WIDTH = 512  # a 512 x 512 fp32 weight is 1 MiB: one piece per layer


class Wide(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(3)])
        self.head = torch.nn.Linear(WIDTH, 4)

    def forward(self, x):
        return self.head(torch.tanh(self.layers(x)))


def batch(step, n):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(PER_RANK * n, WIDTH, generator=g), torch.randint(0, 4, (PER_RANK * n,), generator=g)


def make_opt(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    # eps well above the gradients' rounding: Adam divides by sqrt(v) + eps, which for near-zero gradients
    # turns a different summation order (mean of shard means against the global mean) into visible noise.
    return torch.optim.Adam(params, lr=0.01, eps=1e-3)


def on_device(x, y, model):
    dev = next(model.parameters()).device
    return x.to(dev), y.to(dev)


def reference(base, kind, n):
    model = copy.deepcopy(base)
    opt = make_opt(kind, model.parameters())
    for s in range(STEPS):
        x, y = on_device(*batch(s, n), model)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def train(model, opt, step, r, n, before_last_step=None):
    """STEPS steps on rank r's shard of each global batch: zero_grad(),
    backward, ``before_last_step()`` once before the last step, ``step()``."""
    for s in range(STEPS):
        x, y = on_device(*batch(s, n), model)
        opt.zero_grad()
        mine = slice(r * PER_RANK, (r + 1) * PER_RANK)
        F.cross_entropy(model(x[mine]), y[mine]).backward()
        if s == STEPS - 1 and before_last_step is not None:
            before_last_step()
        step()


class Recorder:
    """Forwards to the reducer and notes every finish_bucket() call."""

    def __init__(self, reducer, events):
        self._reducer = reducer
        self._events = events

    def finish_bucket(self, index):
        self._events.append(("finish", index))
        return self._reducer.finish_bucket(index)

    def __getattr__(self, name):
        return getattr(self._reducer, name)


def assert_close(model, ref, what):
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(
            p.detach(), q.detach(), atol=2e-5, rtol=1e-4, msg=lambda m, name=name: f"{what}: {name}: {m}"
        )


def assert_interleaved(events, what):
    """Every step comes right after the finish_bucket() calls of its piece,
    and more than one step ran: the first pieces were stepped before the
    last bucket was waited for."""
    steps = [k for k, e in enumerate(events) if e[0] == "step"]
    assert len(steps) > 1, f"{what}: one optimizer step per step() ({events}); expected one per piece"
    assert events[0][0] == "finish", f"{what}: stepped before waiting for any bucket: {events}"
    last_finish = max(k for k, e in enumerate(events) if e[0] == "finish")
    assert steps[0] < last_finish, f"{what}: the first piece was stepped after the last bucket: {events}"


def check_stepping_in_pieces(device: str = "cpu"):
    hvd.init()
    dev = device_of(device)
    r, n = hvd.rank(), hvd.size()
    for kind in ("sgd", "adam"):
        torch.manual_seed(0)
        base = Wide().to(dev)
        ref = reference(base, kind, n)

        # DistributedModel, sync="explicit": sync_and_step() steps piece by piece.
        model = hvd.DistributedModel(copy.deepcopy(base), sync="explicit", fusion_bytes=(1 << 20) + 4096)
        opt = make_opt(kind, model.parameters())
        events = []
        opt.register_step_post_hook(lambda *_: events.append(("step",)))

        def record(model=model, events=events):
            model._reducer = Recorder(model._reducer, events)
            events.clear()

        train(model, opt, lambda model=model, opt=opt: model.sync_and_step(opt), r, n, record)
        # A layer's weight and bias share a bucket: the head alone, then each 1 MiB layer with its bias (by
        # size alone the first bucket would also hold layers.2's bias, and each bucket the next layer's).
        layer = WIDTH * WIDTH * 4 + WIDTH * 4
        assert model.bucket_bytes() == [(WIDTH + 1) * 4 * 4, layer, layer, layer], model.bucket_bytes()
        assert_interleaved(events, f"rank {r}: DistributedModel.sync_and_step, {kind}")
        assert_close(model.module, ref, f"rank {r}: DistributedModel.sync_and_step, {kind}")

        # DistributedOptimizer: step() does the same by itself.
        plain = copy.deepcopy(base)
        dopt = hvd.DistributedOptimizer(
            make_opt(kind, plain.parameters()), named_parameters=plain.named_parameters(), fusion_bytes=(1 << 20) + 4096
        )
        events = []
        dopt.register_step_post_hook(lambda *_: events.append(("step",)))

        def record_optimizer(sync=dopt._hvd_sync, events=events):
            sync._reducer = Recorder(sync._reducer, events)
            events.clear()

        train(plain, dopt, dopt.step, r, n, record_optimizer)
        assert_interleaved(events, f"rank {r}: DistributedOptimizer.step, {kind}")
        assert dopt._hvd_sync._reducer.bucket_bytes() == model.bucket_bytes(), "named parameters: layers kept whole"
        assert_close(plain, ref, f"rank {r}: DistributedOptimizer.step, {kind}")
    hvd.shutdown()


class OwnStep(torch.optim.SGD):
    """An optimizer with a step of its own: it may look at every parameter
    at once, so it must be stepped whole."""

    calls = 0

    def step(self, closure=None):
        self.calls += 1
        return super().step(closure)


def check_whole_steps_where_pieces_do_not_apply():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    base = Wide()
    ref = reference(base, "sgd", n)
    cases = [
        ("own step, sync='explicit'", "explicit", OwnStep),
        ("sync='backward'", "backward", torch.optim.SGD),
    ]
    for what, sync, cls in cases:
        model = hvd.DistributedModel(copy.deepcopy(base), sync=sync, fusion_bytes=(1 << 20) + 4096)
        opt = cls(model.parameters(), lr=0.1, momentum=0.9)
        calls = []
        if cls is OwnStep:  # torch runs step hooks once per step() of the class chain: count the calls themselves
            calls = None
        else:
            opt.register_step_post_hook(lambda *_: calls.append(1))
        train(model, opt, lambda model=model, opt=opt: model.sync_and_step(opt), r, n)
        count = opt.calls if calls is None else len(calls)
        assert count == STEPS, f"rank {r}: {what}: {count} optimizer steps in {STEPS} steps"
        assert_close(model.module, ref, f"rank {r}: {what}")
    # A bucket index out of range is refused, naming the count.
    try:
        model._reducer.finish_bucket(99)
    except ValueError as e:
        assert "finishBucket(99)" in str(e) and "buckets" in str(e), str(e)
    else:
        raise AssertionError("finish_bucket(99) was accepted")
    hvd.shutdown()


def check_pieces_with_fp16_and_accumulation(device: str = "cpu"):
    """Pieces under the fp16 wire codec (each bucket is decoded into .grad
    when it is finished) and with backward_passes_per_step=2 (pieces only at
    the reducing pass; the gradients of both passes are summed)."""
    hvd.init()
    dev = device_of(device)
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    base = Wide().to(dev)
    ref = reference(base, "sgd", n)

    model = hvd.DistributedModel(
        copy.deepcopy(base), sync="explicit", fusion_bytes=(1 << 20) + 4096, compression=hvd.Compression.fp16
    )
    opt = make_opt("sgd", model.parameters())
    steps = []
    opt.register_step_post_hook(lambda *_: steps.append(1))
    train(model, opt, lambda: model.sync_and_step(opt), r, n)
    assert len(steps) > STEPS, f"rank {r}: fp16: {len(steps)} optimizer steps in {STEPS} steps: not in pieces"
    for (name, p), q in zip(model.module.named_parameters(), ref.parameters()):
        torch.testing.assert_close(
            p.detach(), q.detach(), atol=2e-3, rtol=1e-2, msg=lambda m, name=name: f"fp16 {name}: {m}"
        )

    # Two backward passes per step, each on half of the rank's shard: their gradients add up (Sum over passes,
    # Average over ranks), so a loss scaled by 1/2 per pass gives the reference's gradient.
    plain = copy.deepcopy(base)
    dopt = hvd.DistributedOptimizer(
        make_opt("sgd", plain.parameters()),
        named_parameters=plain.named_parameters(),
        fusion_bytes=(1 << 20) + 4096,
        backward_passes_per_step=2,
    )
    steps.clear()
    dopt.register_step_post_hook(lambda *_: steps.append(1))
    for s in range(STEPS):
        x, y = on_device(*batch(s, n), plain)
        xs, ys = x[r * PER_RANK : (r + 1) * PER_RANK], y[r * PER_RANK : (r + 1) * PER_RANK]
        dopt.zero_grad()
        for half in range(2):
            part = slice(half * PER_RANK // 2, (half + 1) * PER_RANK // 2)
            (F.cross_entropy(plain(xs[part]), ys[part]) / 2).backward()
        dopt.step()
    assert len(steps) > STEPS, f"rank {r}: two passes: {len(steps)} optimizer steps in {STEPS} steps: not in pieces"
    assert_close(plain, ref, f"rank {r}: DistributedOptimizer, backward_passes_per_step=2")
    hvd.shutdown()
