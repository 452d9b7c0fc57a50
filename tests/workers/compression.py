"""Rank side of tests/test_compression.py: fp16 compression of allreduce and
grouped_allreduce, on the job and inside a process set. Integers and float16
pass through unchanged (exact sums); float32/float64 come back in their own
dtype within float16's precision; gradients flow through compression. The
gradient paths (DistributedModel, DistributedOptimizer, the sharded optimizer)
send float32 buckets as float16, exactly, and bfloat16 ones as they are."""

import torch

import hvdtorch as hvd
from hvdtorch.collectives.compression import Compressor


def _check(process_set, members):
    r = hvd.rank()
    fp16 = hvd.Compression.fp16
    # 3001 + rank is not a float16 value: any rounding shows in the sum.
    for dtype in (torch.int64, torch.int32, torch.int16):
        x = torch.full((4,), 3001 + r, dtype=dtype)
        got = hvd.allreduce(x, op=hvd.Sum, compression=fp16, process_set=process_set, name=f"int.{dtype}")
        want = torch.full((4,), sum(3001 + k for k in members), dtype=dtype)
        assert got.dtype == dtype and torch.equal(got, want), f"{dtype}: {got.tolist()} want {want.tolist()}"
    outs = hvd.grouped_allreduce(
        [torch.full((3,), 3001 + r, dtype=torch.int64), torch.full((2,), 0.5 + r, dtype=torch.float64)],
        op=hvd.Sum,
        compression=fp16,
        process_set=process_set,
    )
    assert torch.equal(outs[0], torch.full((3,), sum(3001 + k for k in members), dtype=torch.int64)), outs[0]
    assert outs[1].dtype == torch.float64
    torch.testing.assert_close(outs[1], torch.full((2,), sum(0.5 + k for k in members), dtype=torch.float64))
    # Floating point: the caller's dtype back, values within float16's precision; the gradient
    # of an Average is the Average of the upstream gradients.
    x = torch.linspace(-2, 2, 7, dtype=torch.float64).mul(r + 1).requires_grad_()
    y = hvd.allreduce(x, compression=fp16, process_set=process_set, name="float")
    assert y.dtype == torch.float64
    want = torch.linspace(-2, 2, 7, dtype=torch.float64) * sum(k + 1 for k in members) / len(members)
    torch.testing.assert_close(y.detach(), want, atol=2e-3, rtol=1e-3)
    (y * (r + 1)).sum().backward()
    torch.testing.assert_close(
        x.grad, torch.full((7,), sum(k + 1 for k in members) / len(members), dtype=torch.float64), atol=2e-3, rtol=1e-3
    )


class _TwoDtypes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w32 = torch.nn.Parameter(torch.zeros(32))
        self.w16 = torch.nn.Parameter(torch.zeros(8, dtype=torch.bfloat16))

    def forward(self, r):
        # d/dw32: integers 1 mod 4 in 257..509, times 2**-11: float16 holds each value and every sum
        # of up to 3 ranks exactly (11 significant bits); bfloat16 (8 bits) rounds each one down by
        # 2**-11, on every rank alike, so the errors add up instead of cancelling. d/dw16: 2**17,
        # above float16's largest value (65504), a power of two bfloat16 holds.
        g32 = (257 + 4 * torch.arange(32) + 64 * r).float() * 2.0**-11
        return (self.w32 * g32).sum() + (self.w16.float() * 2.0**17).sum()


def _gradient_paths():
    fp16, sgd = hvd.Compression.fp16, torch.optim.SGD
    for what in ("DistributedModel", "DistributedOptimizer", "shard=1", "shard=2"):
        net = _TwoDtypes()
        if what == "DistributedModel":
            model = hvd.DistributedModel(net, op=hvd.Sum, compression=fp16, name=f"fp16wire.{what}")
            yield what, net, model, sgd(net.parameters(), lr=1.0)
            continue
        shard = {"shard=1": 1, "shard=2": 2}.get(what, 0)
        opt = hvd.DistributedOptimizer(
            sgd(net.parameters(), lr=1.0),
            named_parameters=[(f"fp16wire.{what}.{n}", p) for n, p in net.named_parameters()],
            op=hvd.Sum,
            compression=fp16,
            shard=shard,
        )
        yield what, net, net, opt


def check_gradients_on_the_wire():
    """One SGD step (lr 1, op Sum) from zero leaves minus the sum of the
    ranks' gradients: exact for the float32 weights only if their wire is
    float16 (not bfloat16), finite for the bfloat16 ones only if they are
    not converted to float16. (A float32 wire is exact too: the sharded
    optimizer's buckets, which are the wire, are checked to be float16.)"""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    want32 = -sum((257 + 4 * torch.arange(32) + 64 * k).float() for k in range(n)) * 2.0**-11
    want16 = torch.full((8,), -(2.0**17) * n, dtype=torch.bfloat16)
    for what, net, model, opt in _gradient_paths():
        opt.zero_grad()
        model(r).backward()
        opt.step()
        with torch.no_grad():
            assert torch.equal(net.w16, want16), f"{what}: bfloat16 weights {net.w16.tolist()}, want {want16.tolist()}"
            wrong = (net.w32 != want32).nonzero().flatten().tolist()
            assert not wrong, (
                f"{what}: {len(wrong)} float32 weights are not the float16 sums, e.g. {wrong[:3]}: "
                f"{net.w32[wrong[:3]].tolist()} want {want32[wrong[:3]].tolist()}"
            )
        if what.startswith("shard="):
            wire = sorted(str(f.dtype) for f in opt._grads._flats)
            assert wire == ["torch.bfloat16", "torch.float16"], f"{what}: the buckets travel as {wire}"
    hvd.shutdown()


def check_fp16_compression():
    hvd.init()
    n = hvd.size()
    _check(None, list(range(n)))
    if n > 2:
        ps = hvd.add_process_set([0, n - 1])
        if ps.included():
            _check(ps, ps.ranks)
        hvd.barrier()
    hvd.shutdown()


class _Halving(Compressor):
    """A compressor of the user's own (Horovod's Compressor interface)."""

    @staticmethod
    def compress(tensor):
        return tensor / 2, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor * 2


def check_own_compressor_refused_by_gradient_buckets():
    """DistributedModel and DistributedOptimizer (sharded too) refuse a compressor of the user's own,
    naming where and what to do, instead of leaving it unapplied; hvd.allreduce and op=hvd.Adasum
    apply it."""
    hvd.init()
    net = torch.nn.Linear(4, 2)
    fronts = {
        "DistributedModel": lambda: hvd.DistributedModel(net, compression=_Halving),
        "DistributedOptimizer": lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters(), compression=_Halving
        ),
        "DistributedOptimizer shard=1": lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(net.parameters(), lr=0.1),
            named_parameters=net.named_parameters(),
            compression=_Halving,
            shard=1,
        ),
    }
    for what, make in fronts.items():
        where = what.split()[0]
        try:
            make()
        except ValueError as e:
            assert f"hvdtorch: {where}: compression=" in str(e) and "hvd.allreduce(" in str(e), (what, e)
        else:
            raise AssertionError(f"{what} accepted a compressor of the user's own")
    got = hvd.allreduce(torch.ones(3), compression=_Halving, name="own.compressor")
    torch.testing.assert_close(got, torch.ones(3))
    hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1),
        named_parameters=net.named_parameters(),
        compression=_Halving,
        op=hvd.Adasum,
    )
    hvd.shutdown()


class _Counting(Compressor):
    """A compressor of the user's own that counts its calls (and changes nothing)."""

    calls = 0

    @staticmethod
    def compress(tensor):
        _Counting.calls += 1
        return tensor.clone(), None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


def check_own_compressor_with_every_op():
    """A compressor of the user's own is never silently left unapplied, whatever the op: every gradient
    front refuses it (ValueError naming the front) for op=hvd.Average and op=hvd.Sum alike, sharded or
    not; op=hvd.Adasum, which accepts it, calls it in step()."""
    hvd.init()
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)

    def sgd():
        return torch.optim.SGD(net.parameters(), lr=0.1)

    for op, op_name in ((hvd.Average, "Average"), (hvd.Sum, "Sum")):
        fronts = {
            "DistributedModel": lambda op=op: hvd.DistributedModel(net, compression=_Counting, op=op),
            "DistributedOptimizer": lambda op=op: hvd.DistributedOptimizer(
                sgd(), named_parameters=net.named_parameters(), compression=_Counting, op=op
            ),
        }
        for shard in (1, 2):
            fronts[f"DistributedOptimizer shard={shard}"] = lambda op=op, shard=shard: hvd.DistributedOptimizer(
                sgd(), named_parameters=net.named_parameters(), compression=_Counting, op=op, shard=shard
            )
        for what, make in fronts.items():
            where = what.split()[0]
            try:
                made = make()
            except ValueError as e:
                assert f"hvdtorch: {where}: compression=" in str(e) and "of your own" in str(e), (op_name, what, e)
            else:
                del made
                raise AssertionError(f"{what} with op=hvd.{op_name} accepted a compressor of the user's own")
    opt = hvd.DistributedOptimizer(sgd(), named_parameters=net.named_parameters(), compression=_Counting, op=hvd.Adasum)
    before = _Counting.calls
    opt.zero_grad()
    net(torch.full((3, 4), float(hvd.rank() + 1))).sum().backward()
    opt.step()
    assert _Counting.calls > before, "op=hvd.Adasum accepted the compressor but never called it"
    hvd.shutdown()
