"""Rank-side checks on CUDA tensors; every rank uses cuda:0 (the test machine
has one GPU, which the ranks share). NCCL refuses two ranks on one GPU, so
reducer="native" must notice the shared GPU and stage instead of calling it.

Inputs are written on a side stream behind a long kernel and submitted from
that stream: the engine must wait on the ready event it records there, or it
reads the old values. Results are read on the default stream after
synchronize(), which must order that stream after the op.

With device "cpu" the same checks run on CPU tensors (no streams), which is
how CI checks the checks themselves (tests/test_sim_device_mode.py, through
the simulated device).
"""

import contextlib
import copy

import torch
import torch.nn.functional as F

import hvdtorch as hvd
from tests.workers.common import device_of, registered_reducers

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]
SLEEP_CYCLES = 20_000_000  # ~10 ms on an H100: longer than the engine's whole negotiation cycle


def value(rank: int, shape, dtype, case: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * case + rank)
    return torch.randint(-2, 3, shape, generator=g).to(dtype)  # small integers: exact sums in every dtype


def on_stream(side):
    return torch.cuda.stream(side) if side is not None else contextlib.nullcontext()


def written_late(cpu_values: torch.Tensor, side) -> torch.Tensor:
    """A CUDA tensor holding zeros now and `cpu_values` once `side` has run a long kernel
    (on the CPU, without a side stream: the values themselves)."""
    if side is None:
        return cpu_values.clone()
    src = cpu_values.to("cuda:0")
    out = torch.zeros_like(src)
    torch.cuda.synchronize()  # both exist before the side stream uses them
    with on_stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        out.copy_(src)  # device to device: enqueued, the host does not wait
    src.record_stream(side)
    return out


def check_collectives(device: str = "cuda", reducers: str = ""):
    """``reducers``: a comma list; empty: auto and every registered reducer."""
    hvd.init()
    cuda = device_of(device).type == "cuda"
    r, n = hvd.rank(), hvd.size()
    side = torch.cuda.Stream() if cuda else None
    kind = "cuda" if cuda else "cpu"
    case = 0
    reducers = reducers or ",".join(["auto", *registered_reducers()])
    for reducer in reducers.split(","):
        for dtype in DTYPES:
            for op, name in [(hvd.Sum, "Sum"), (hvd.Max, "Max")] + (
                [(hvd.Average, "Average")] if dtype.is_floating_point else []
            ):
                case += 1
                shape = (5, 7)
                x = written_late(value(r, shape, dtype, case), side)
                with on_stream(side):
                    h = hvd.allreduce_async(x, op=op, name=f"ar.{case}", reducer=reducer)
                got = hvd.synchronize(h)
                assert got.device.type == kind
                inputs = torch.stack([value(k, shape, dtype, case).double() for k in range(n)])
                want = {"Sum": inputs.sum(0), "Max": inputs.max(0).values, "Average": inputs.mean(0)}[name]
                torch.testing.assert_close(got.cpu().double(), want, msg=f"allreduce {name} {dtype} reducer={reducer}")
    # Grouped (fused) with scales.
    xs = [written_late(value(r, (k + 2,), torch.float32, 100 + k), side) for k in range(4)]
    with on_stream(side):
        hs = hvd.grouped_allreduce_async(xs, op=hvd.Average, prescale_factor=2.0, postscale_factor=0.5, name="group")
    outs = hvd.synchronize(hs)
    for k, out in enumerate(outs):
        want = torch.stack([value(q, (k + 2,), torch.float32, 100 + k) for q in range(n)]).mean(0)
        torch.testing.assert_close(out.cpu(), want, msg=f"grouped tensor {k}")
    # Allgather with uneven first dimensions, broadcast, alltoall, reducescatter.
    for dtype in DTYPES:
        case += 1
        x = written_late(value(r, (r + 1, 3), dtype, case), side)
        with on_stream(side):
            h = hvd.allgather_async(x, name=f"ag.{case}")
        got = hvd.synchronize(h)
        want = torch.cat([value(q, (q + 1, 3), dtype, case) for q in range(n)])
        assert got.device.type == kind and torch.equal(got.cpu(), want), f"allgather {dtype}"
        x = written_late(value(r, (6,), dtype, case), side)
        with on_stream(side):
            h = hvd.broadcast_async(x, root_rank=n - 1, name=f"bc.{case}")
        assert torch.equal(hvd.synchronize(h).cpu(), value(n - 1, (6,), dtype, case)), f"broadcast {dtype}"
        x = written_late(value(r, (2 * n, 2), dtype, case), side)
        with on_stream(side):
            got = hvd.alltoall(x, name=f"a2a.{case}")
        want = torch.cat([value(q, (2 * n, 2), dtype, case)[2 * r : 2 * r + 2] for q in range(n)])
        assert got.device.type == kind and torch.equal(got.cpu(), want), f"alltoall {dtype}"
        got, received = hvd.alltoall(x, splits=[2] * n, name=f"a2a.splits.{case}")
        assert torch.equal(got.cpu(), want) and received.device.type == "cpu", f"alltoall {dtype} with splits"
        x = written_late(value(r, (2 * n + 1, 2), dtype, case), side)
        with on_stream(side):
            got = hvd.reducescatter(x, op=hvd.Sum, name=f"rs.{case}")
        full = torch.stack([value(q, (2 * n + 1, 2), dtype, case).double() for q in range(n)]).sum(0)
        rows = [(2 * n + 1) // n + (1 if q < (2 * n + 1) % n else 0) for q in range(n)]
        start = sum(rows[:r])
        assert got.device.type == kind and torch.equal(got.cpu().double(), full[start : start + rows[r]]), (
            f"reducescatter {dtype}"
        )
    check_adasum(side, kind, case)
    from hvdtorch import _C

    if n > 1 and "native" in reducers.split(","):
        ran = _C.device_native_runs()
        if cuda:
            assert ran == 0, f"rank {r}: {ran} NCCL all-reduces with every rank on cuda:0"
        elif _C.sim_device_mode():
            assert ran > 0, f"rank {r}: reducer='native' never took the device group on the simulated device"
    if (cuda or _C.sim_device_mode()) and n == 1:
        # One rank: reducer="native" (by name) runs the backend's device collective (NCCL), at the
        # GPU's speed; every other reducer reduces on the device, never staging through the host.
        if "native" in reducers.split(","):
            assert _C.device_native_runs() > 0, "reducer='native' at one rank never ran the device group"
        assert _C.device_one_rank_runs() > 0, "device tensors at one rank were staged through the host"
    if cuda and n > 1 and "ring" in reducers.split(","):
        # Ranks sharing the GPU: reducer="ring" is the device ring over CUDA IPC.
        assert _C.device_ring_runs() > 0, f"rank {r}: reducer='ring' never ran the device ring"
    if cuda and n > 1:
        # A host tensor on one rank and a device tensor on another: an error on every rank naming both.
        t = torch.ones(3, device="cuda:0") if r == 0 else torch.ones(3)
        try:
            hvd.allreduce(t, name="mixed")
            raise AssertionError("a CPU/CUDA mismatch across ranks was not refused")
        except hvd.HvdError as e:
            assert "device cuda vs cpu" in str(e) or "device cpu vs cuda" in str(e), str(e)
    hvd.shutdown()


def check_adasum(side, kind: str, case: int) -> None:
    """Adasum of a float32 tensor larger than one staging segment (8 MiB by
    default: the staged all-reduce works segment by segment, which Adasum,
    whose coefficients depend on the whole vector, must not), against the
    float64 reference of tests/workers/adasum.py."""
    from tests.workers.adasum import gradient_of, reference

    r, n = hvd.rank(), hvd.size()
    for numel in (6, 3 << 20):
        case += 1
        inputs = [gradient_of(k, (numel,), case, torch.float32) for k in range(n)]
        x = written_late(inputs[r], side)
        with on_stream(side):
            h = hvd.allreduce_async(x, op=hvd.Adasum, name=f"adasum.{numel}")
        got = hvd.synchronize(h)
        assert got.device.type == kind
        want = reference(inputs).float()
        torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4, msg=lambda m: f"Adasum of {numel}: {m}")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(F.relu(self.bn(self.conv(x))).flatten(1))


def train_against_one_process(model, opt, ref, ref_opt, dev, steps: int) -> None:
    """`steps` steps of each rank on its 4 samples of a global batch, and of
    `ref` in this process on the whole batch, its loss the mean of the
    shards' means: the same gradient as the average of the ranks' gradients
    (BatchNorm normalises per shard, as the ranks do)."""
    r, n = hvd.rank(), hvd.size()
    per = 4
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(per * n, 3, 8, 8, generator=g).to(dev)
        y = torch.randint(0, 10, (per * n,), generator=g).to(dev)
        opt.zero_grad()
        F.cross_entropy(model(x[r * per : (r + 1) * per]), y[r * per : (r + 1) * per]).backward()
        opt.step()
        ref_opt.zero_grad()
        losses = [F.cross_entropy(ref(x[k * per : (k + 1) * per]), y[k * per : (k + 1) * per]) for k in range(n)]
        (sum(losses) / n).backward()
        ref_opt.step()


def check_distributed_model(device: str = "cuda", steps: str = "4"):
    """DistributedModel on cuda:0 equals one process on the whole global batch."""
    hvd.init()
    dev = device_of(device)
    torch.manual_seed(0)
    base = Net().to(dev)
    ref = copy.deepcopy(base)
    model = hvd.DistributedModel(copy.deepcopy(base))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    train_against_one_process(model, opt, ref, ref_opt, dev, int(steps))
    for (name, a), b in zip(model.module.named_parameters(), ref.parameters()):
        assert a.device == dev
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=f"parameter {name}")
    hvd.shutdown()


def check_sharded_optimizer(device: str = "cuda", steps: str = "4"):
    """The sharded optimizer (shard=1, 2 and 3, Adam) over a DistributedModel
    on cuda:0: once step() has returned, parameters equal one process's Adam
    on the whole global batch."""
    hvd.init()
    dev = device_of(device)
    for shard in (1, 2, 3):
        torch.manual_seed(0)
        # No BatchNorm here: behind it a bias has a gradient of rounding noise only, which Adam
        # scales up to full steps, so the order of any sum (3 ranks against one process) shows.
        base = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10)
        ).to(dev)
        ref = copy.deepcopy(base)
        net = copy.deepcopy(base)
        model = hvd.DistributedModel(net)
        opt = hvd.DistributedOptimizer(
            torch.optim.Adam(net.parameters(), lr=1e-2), shard=shard, **({"model": model} if shard == 3 else {})
        )
        ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
        train_against_one_process(model, opt, ref, ref_opt, dev, int(steps))
        got = model.state_dict() if shard == 3 else dict(net.named_parameters())  # shard=3: gathered
        for name, b in ref.named_parameters():
            assert got[name].device == dev
            torch.testing.assert_close(got[name], b, atol=1e-4, rtol=1e-4, msg=lambda m: f"shard={shard} {name}: {m}")
    hvd.shutdown()
