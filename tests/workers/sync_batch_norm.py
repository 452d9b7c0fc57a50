"""SyncBatchNorm on N ranks, each with its own (differently sized) shard,
against one torch.nn.BatchNorm{1,2,3}d on the concatenated batch in this
process: outputs, input gradients, weight/bias gradients (summed over ranks),
running statistics, and eval-mode outputs, over several steps."""

import torch
import torch.nn.functional as F

import hvdtorch as hvd

STEPS = 3


def shard_sizes(n, with_empty):
    """Different batch sizes per rank; with_empty gives rank 1 no samples."""
    sizes = [2 + (r % 3) for r in range(n)]
    if with_empty and n > 1:
        sizes[1] = 0
    return sizes


def global_batch(step, sizes, tail, dtype):
    g = torch.Generator().manual_seed(1000 + step)
    total = sum(sizes)
    # Offset and scale per channel so that mean and variance matter.
    x = torch.randn((total,) + tail, generator=g, dtype=torch.float64) * 3 + 5
    upstream = torch.randn((total,) + tail, generator=g, dtype=torch.float64)
    return x.to(dtype), upstream.to(dtype)


def my_rows(t, sizes, r):
    start = sum(sizes[:r])
    return t[start : start + sizes[r]]


def compare(got, want, what, dtype):
    tol = dict(atol=1e-9, rtol=1e-9) if dtype == torch.float64 else dict(atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(got, want, **tol, msg=lambda m: f"rank {hvd.rank()}: {what}: {m}")


def check_config(reference_cls, tail, dtype, affine=True, momentum=0.1, track=True, with_empty=False):
    r, n = hvd.rank(), hvd.size()
    channels = tail[0]
    what = (
        f"{reference_cls.__name__} input (N,{','.join(map(str, tail))}) {dtype} affine={affine} "
        f"momentum={momentum} track_running_stats={track} empty shard={with_empty}"
    )
    torch.manual_seed(7)
    ref = reference_cls(channels, momentum=momentum, affine=affine, track_running_stats=track).to(dtype)
    if affine:
        with torch.no_grad():  # not the trivial 1/0 so that weight and bias matter
            ref.weight.uniform_(0.5, 2.0)
            ref.bias.uniform_(-1.0, 1.0)
    sync = hvd.SyncBatchNorm(channels, momentum=momentum, affine=affine, track_running_stats=track).to(dtype)
    sync.load_state_dict(ref.state_dict())  # same keys as torch's BatchNorm
    sizes = shard_sizes(n, with_empty)
    for step in range(STEPS):
        x, upstream = global_batch(step, sizes, tail, dtype)
        x_ref = x.clone().requires_grad_()
        ref.zero_grad()
        y_ref = ref(x_ref)
        (y_ref * upstream).sum().backward()

        x_mine = my_rows(x, sizes, r).clone().requires_grad_()
        sync.zero_grad()
        y = sync(x_mine)
        (y * my_rows(upstream, sizes, r)).sum().backward()

        compare(y.detach(), my_rows(y_ref.detach(), sizes, r), f"{what} step {step}: output", dtype)
        compare(x_mine.grad, my_rows(x_ref.grad, sizes, r), f"{what} step {step}: input gradient", dtype)
        if affine:
            # The loss is a sum over samples, so the global gradient is the sum of every rank's share.
            for name in ("weight", "bias"):
                mine = getattr(sync, name).grad
                compare(
                    hvd.allreduce(mine, op=hvd.Sum, name=f"sbn.{name}"),
                    getattr(ref, name).grad,
                    f"{what} step {step}: {name} gradient",
                    dtype,
                )
        if track:
            compare(sync.running_mean, ref.running_mean, f"{what} step {step}: running_mean", dtype)
            compare(sync.running_var, ref.running_var, f"{what} step {step}: running_var", dtype)
            assert int(sync.num_batches_tracked) == int(ref.num_batches_tracked) == step + 1, what
    # Evaluation: running statistics (local), or synchronized batch statistics without them.
    sync.eval()
    ref.eval()
    x, _ = global_batch(99, sizes, tail, dtype)
    with torch.no_grad():
        compare(sync(my_rows(x, sizes, r)), my_rows(ref(x), sizes, r), f"{what}: eval output", dtype)


def check_against_batch_norm():
    hvd.init()
    configs = [
        (torch.nn.BatchNorm1d, (3,), torch.float64, {}),
        (torch.nn.BatchNorm1d, (4, 5), torch.float64, {"momentum": None}),
        (torch.nn.BatchNorm2d, (3, 4, 2), torch.float64, {"with_empty": True}),
        (torch.nn.BatchNorm2d, (3, 4, 2), torch.float32, {}),
        (torch.nn.BatchNorm2d, (2, 3, 3), torch.float64, {"affine": False}),
        (torch.nn.BatchNorm2d, (2, 3, 3), torch.float64, {"track": False}),
        (torch.nn.BatchNorm3d, (2, 2, 3, 2), torch.float64, {"momentum": 0.3}),
    ]
    for cls, tail, dtype, kw in configs:
        check_config(cls, tail, dtype, **kw)
    hvd.shutdown()


def check_training_with_optimizer():
    """A conv net with SyncBatchNorm trained by DistributedOptimizer on N
    equal shards equals the same net with BatchNorm2d on the global batch."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    per_rank = 3

    def net(bn_cls):
        torch.manual_seed(3)
        return torch.nn.Sequential(
            torch.nn.Conv2d(2, 4, 3, padding=1),
            bn_cls(4),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.Linear(4 * 4 * 4, 3),
        )

    ref = net(torch.nn.BatchNorm2d).double()
    model = net(hvd.SyncBatchNorm).double()
    model.load_state_dict(ref.state_dict())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), named_parameters=model.named_parameters()
    )
    for step in range(4):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(per_rank * n, 2, 4, 4, generator=g, dtype=torch.float64)
        y = torch.randint(0, 3, (per_rank * n,), generator=g)
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        opt.zero_grad()
        mine = slice(r * per_rank, (r + 1) * per_rank)
        F.cross_entropy(model(x[mine]), y[mine]).backward()
        opt.step()
    for (name, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9, msg=lambda m: f"{name}: {m}")
    hvd.shutdown()


def check_bad_input():
    hvd.init()
    bn = hvd.SyncBatchNorm(3)
    try:
        bn(torch.ones(3))
    except ValueError as e:
        assert "2D" in str(e), e
    else:
        raise AssertionError("1D input accepted")
    # One value per channel over all ranks: an error on every rank, not a hang.
    x = torch.ones(1 if hvd.rank() == 0 else 0, 3)
    try:
        bn(x)
    except ValueError as e:
        assert "more than 1 value per channel" in str(e), e
    else:
        raise AssertionError("a single value per channel was accepted")
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(hvd.size())))
    # It is a torch BatchNorm: same base class and buffers.
    assert isinstance(bn, torch.nn.modules.batchnorm._BatchNorm)
    assert set(bn.state_dict()) == set(torch.nn.BatchNorm1d(3).state_dict())
    hvd.shutdown()


def check_process_set():
    """SyncBatchNorm(process_set=even) normalizes over the even ranks' batches only."""
    hvd.init()
    r = hvd.rank()
    even = hvd.add_process_set([k for k in range(hvd.size()) if k % 2 == 0])
    members = even.ranks
    sizes = [3, 2, 4, 1][: hvd.size()]
    x, upstream = global_batch(0, sizes, (3, 2), torch.float64)
    sync = hvd.SyncBatchNorm(3, process_set=even).double()
    if r not in members:
        try:
            sync(my_rows(x, sizes, r))
        except ValueError as e:
            assert "does not include this rank" in str(e), e
        else:
            raise AssertionError("a rank outside the set ran its SyncBatchNorm")
        hvd.barrier()  # a rank's shutdown stops the others' pending ops
        hvd.shutdown()
        return
    rows = torch.cat([my_rows(x, sizes, k) for k in members])
    grads = torch.cat([my_rows(upstream, sizes, k) for k in members])
    ref = torch.nn.BatchNorm1d(3).double()
    rows = rows.clone().requires_grad_()
    y_ref = ref(rows)
    (y_ref * grads).sum().backward()
    mine = my_rows(x, sizes, r).clone().requires_grad_()
    y = sync(mine)
    (y * my_rows(upstream, sizes, r)).sum().backward()
    at = sum(sizes[k] for k in members if k < r)
    compare(y.detach(), y_ref.detach()[at : at + sizes[r]], "process set: output", torch.float64)
    compare(mine.grad, rows.grad[at : at + sizes[r]], "process set: input gradient", torch.float64)
    compare(sync.running_var, ref.running_var, "process set: running_var", torch.float64)
    hvd.barrier()
    hvd.shutdown()
