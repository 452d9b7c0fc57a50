"""DistributedOptimizer(op=hvd.Adasum) against a reference computed here, in
one process: n replicas of the model, each with its own wrapped optimizer
(its own momentum or Adam state), step from the same parameters on their own
rank's data; the deltas (new - start) are combined by the pairwise Adasum rule
(tests/workers/adasum.py) per tensor and added to the start parameters.
Also the contract's errors, a convergence check, and the path the deltas
take: the gradient core's reducer, one op per bucket, fp16 on its wire, equal
to Horovod's way of reducing them (a grouped Adasum all-reduce per dtype of
the compressed deltas), which a compressor the wire codec cannot express
still takes."""

import json
import os

import torch
import torch.nn.functional as F

import hvdtorch as hvd
from hvdtorch.compression import Compressor
from tests.workers.adasum import reference as adasum_reference
from tests.workers.common import device_of


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()


def _batch(rank: int, step: int, rep: int):
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + rep)
    return torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randn(6, 2, generator=g, dtype=torch.float64)


OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.05),
}


def _reference_run(ranks, opt_name, passes, steps):
    """Parameters after ``steps`` steps, computed in this process for the ranks of ``ranks``."""
    replicas = [_model() for _ in ranks]
    optimizers = [OPTIMIZERS[opt_name](m.parameters()) for m in replicas]
    for step in range(steps):
        starts = [p.detach().clone() for p in replicas[0].parameters()]
        deltas = []
        for rank, model, opt in zip(ranks, replicas, optimizers):
            with torch.no_grad():
                for p, s in zip(model.parameters(), starts):
                    p.copy_(s)
            opt.zero_grad()
            for rep in range(passes):
                x, y = _batch(rank, step, rep)
                F.mse_loss(model(x), y).backward()
            opt.step()
            deltas.append([p.detach() - s for p, s in zip(model.parameters(), starts)])
        new = [s + adasum_reference([d[i] for d in deltas]) for i, s in enumerate(starts)]
        for model in replicas:
            with torch.no_grad():
                for p, v in zip(model.parameters(), new):
                    p.copy_(v)
    return [p.detach() for p in replicas[0].parameters()]


def _distributed_run(rank, opt_name, passes, steps, process_set=None, device="cpu"):
    model = _model().to(device)
    opt = hvd.DistributedOptimizer(
        OPTIMIZERS[opt_name](model.parameters()),
        named_parameters=model.named_parameters(),
        op=hvd.Adasum,
        backward_passes_per_step=passes,
        process_set=process_set,
    )
    for step in range(steps):
        opt.zero_grad()
        for rep in range(passes):
            x, y = (t.to(device) for t in _batch(rank, step, rep))
            F.mse_loss(model(x), y).backward()
        opt.step()
    return model, opt


def check_equivalence(*ranks_in_set):
    """Each rank's parameters after three steps equal the reference; with
    ``ranks_in_set``, inside that process set (the others train alone)."""
    ps = hvd.ProcessSet([int(k) for k in ranks_in_set]) if ranks_in_set else None
    hvd.init(process_sets=[ps] if ps else [])
    r, n = hvd.rank(), hvd.size()
    ranks = ps.ranks if ps else list(range(n))
    if r not in ranks:
        ranks = [r]  # outside the set: the plain optimizer
    for opt_name in OPTIMIZERS:
        for passes in (1, 2):
            model, _ = _distributed_run(r, opt_name, passes, 3, ps)
            want = _reference_run(ranks, opt_name, passes, 3)
            for (name, got), w in zip(model.named_parameters(), want):
                torch.testing.assert_close(
                    got.detach(), w, atol=1e-10, rtol=1e-9, msg=lambda m: f"{opt_name} passes={passes} {name}: {m}"
                )
    hvd.barrier()
    hvd.shutdown()


def check_equivalence_on(device: str):
    """check_equivalence's training with every rank's model on `device`
    ("cuda": cuda:0, where the deltas' Adasum all-reduces take device
    tensors) against the reference on the CPU."""
    hvd.init()
    device = device_of(device)
    r, n = hvd.rank(), hvd.size()
    for opt_name in OPTIMIZERS:
        for passes in (1, 2):
            model, _ = _distributed_run(r, opt_name, passes, 3, device=device)
            want = _reference_run(list(range(n)), opt_name, passes, 3)
            for (name, got), w in zip(model.named_parameters(), want):
                assert got.device == device, name
                torch.testing.assert_close(
                    got.detach().cpu(), w, atol=1e-9, rtol=1e-8, msg=lambda m: f"{opt_name} passes={passes} {name}: {m}"
                )
    hvd.barrier()
    hvd.shutdown()


def check_contract():
    hvd.init()
    r = hvd.rank()
    model = _model()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum, backward_passes_per_step=2
    )
    names = sorted(opt._parameter_names.values())
    assert names == ["allreduce.noname.0.0", "allreduce.noname.0.1", "allreduce.noname.0.2", "allreduce.noname.0.3"]
    x, y = _batch(r, 0, 0)
    F.mse_loss(model(x), y).backward()
    F.mse_loss(model(x), y).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    try:
        F.mse_loss(model(x), y).backward()
    except AssertionError as e:
        assert "backward_passes_per_step=2" in str(e) and "allreduce.noname.0" in str(e), e
    else:
        raise AssertionError("a third backward pass with backward_passes_per_step=2 did not raise")
    for p, g in zip(model.parameters(), grads):
        assert torch.equal(p.grad, g), "the rejected pass touched .grad"
    try:
        opt.zero_grad()
    except AssertionError as e:
        assert "zero_grad" in str(e), e
    else:
        raise AssertionError("zero_grad() between backward and step() did not raise")
    try:
        with opt.skip_synchronize():
            pass
    except AssertionError as e:
        assert "skip_synchronize" in str(e), e
    else:
        raise AssertionError("skip_synchronize() did not raise")
    opt.synchronize()  # nothing to do, as in Horovod
    opt.step()
    opt.zero_grad()
    # A closure's loss is returned; step() after one pass (fewer than 2) is fine.
    loss = opt.step(lambda: F.mse_loss(model(x), y).backward() or torch.tensor(1.5))
    assert float(loss) == 1.5, loss
    # Parameters stay identical on every rank.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat.unsqueeze(0))
    assert all(torch.equal(gathered[0], row) for row in gathered), gathered
    hvd.shutdown()


def check_convergence():
    """Linear regression, every rank its own shard: Adasum training fits it."""
    hvd.init()
    r = hvd.rank()
    torch.manual_seed(0)
    w_true = torch.randn(8, 1, dtype=torch.float64)
    g = torch.Generator().manual_seed(50 + r)
    x = torch.randn(64, 8, generator=g, dtype=torch.float64)
    y = x @ w_true
    model = torch.nn.Linear(8, 1, bias=False).double()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5),
        named_parameters=model.named_parameters(),
        op=hvd.Adasum,
    )
    first = None
    for _ in range(150):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    final = hvd.allreduce(F.mse_loss(model(x), y).detach(), op=hvd.Max).item()
    assert final < 1e-4 * first, (first, final)
    err = (model.weight.detach().t() - w_true).abs().max().item()
    assert err < 1e-2, err
    print(f"rank {r} loss {first:.4g} -> {final:.3g}", flush=True)
    hvd.shutdown()


class _TwoDtypes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w64 = torch.nn.Parameter(torch.randn(6, dtype=torch.float64))
        self.a32 = torch.nn.Parameter(torch.randn(5))
        self.b32 = torch.nn.Parameter(torch.randn(3, 2))

    def forward(self, rank: int, step: int):
        g = torch.Generator().manual_seed(100 * rank + step)
        x64, x32, y32 = (torch.randn(*p.shape, generator=g, dtype=p.dtype) for p in (self.w64, self.a32, self.b32))
        return (self.w64 * x64).sin().sum() + (self.a32 * x32).pow(2).sum() + (self.b32 * y32).tanh().sum()


def _horovods_way(net, opt, compression, rank, steps):
    """The reference: the plain optimizer stepped here, its deltas compressed and reduced with one
    grouped Adasum all-reduce per dtype, as Horovod (and this optimizer before the gradient core) does."""
    params = list(net.parameters())
    for step in range(steps):
        opt.zero_grad()
        net(rank, step).backward()
        starts = [p.detach().clone() for p in params]
        opt.step()
        with torch.no_grad():
            by_dtype = {}
            for p, start in zip(params, starts):
                by_dtype.setdefault(p.dtype, []).append((p, start))
            for dtype, pairs in by_dtype.items():
                packed = [compression.compress(p.detach() - start) for p, start in pairs]
                hvd.grouped_allreduce_([c for c, _ in packed], name=f"reference.{step}.{dtype}", op=hvd.Adasum)
                for (p, start), (c, ctx) in zip(pairs, packed):
                    p.copy_(start.add_(compression.decompress(c, ctx)))


class _Bfloat16Compressor(Compressor):
    """A compressor the wire codec cannot express (the codec sends float32 as float16)."""

    @staticmethod
    def compress(tensor):
        return tensor.to(torch.bfloat16), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx)


def _train(compression, rank, steps, **kwargs):
    net = _TwoDtypes()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
        named_parameters=net.named_parameters(),
        op=hvd.Adasum,
        compression=compression,
        **kwargs,
    )
    for step in range(steps):
        opt.zero_grad()
        net(rank, step).backward()
        opt.step()
    return net, opt


def check_wire():
    """Compression.fp16: the reducer's buckets are float16 for the float32 parameters (float64 too),
    and the parameters are exactly Horovod's way's (the same float16 deltas, each combined on its
    own). A compressor the codec cannot express is applied in Python: Horovod's way itself."""
    hvd.init()
    r = hvd.rank()
    for compression in (hvd.Compression.fp16, _Bfloat16Compressor):
        net, opt = _train(compression, r, 3)
        ref = _TwoDtypes()
        _horovods_way(ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), compression, r, 3)
        if compression is hvd.Compression.fp16:
            wire = sorted(str(f.dtype) for f in opt._hvd_reducer.flats())
            assert wire == ["torch.float16", "torch.float16"], f"rank {r}: the deltas travel as {wire}"
        for (name, got), want in zip(net.named_parameters(), ref.parameters()):
            assert torch.equal(got.detach(), want.detach()), (
                f"rank {r}: {compression.__name__} {name}: {got} want {want}"
            )
    hvd.shutdown()


def check_one_op_per_bucket(directory):
    """The deltas are reduced by the gradient core's reducer: the step's ops, in the timeline, are
    one per bucket of its layout (one dtype each: two buckets here), named by the reducer. Its
    hooks count passes per parameter: a parameter unused in a pass does not count it."""
    hvd.init()
    r = hvd.rank()
    path = os.path.join(directory, "adasum-{rank}.json")
    net = _TwoDtypes()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters(), op=hvd.Adasum
    )
    buckets = len(opt._hvd_reducer.bucket_bytes())
    assert buckets == 2, f"rank {r}: {buckets} buckets for two dtypes"
    # Passes count per parameter: two passes over different parameters are one each (k = 1) ...
    net.w64.sum().backward()
    net.a32.sum().backward()
    # ... and a second gradient of one parameter is refused, naming it.
    try:
        net.w64.sum().backward()
    except AssertionError as e:
        assert "'w64'" in str(e) and "backward_passes_per_step=1" in str(e), e
    else:
        raise AssertionError(f"rank {r}: a second gradient of w64 with backward_passes_per_step=1 did not raise")
    opt.step()
    opt.zero_grad()
    net(r, 0).backward()
    hvd.start_timeline(path)
    opt.step()
    hvd.stop_timeline()
    hvd.barrier()
    with open(path.replace("{rank}", str(r))) as f:
        events = json.load(f)
    ops = {e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    ops = {o for o in ops if o.startswith(opt._hvd_name)}
    want = {f"{opt._hvd_name}.g1.b{j}" for j in range(buckets)}
    assert ops == want, f"rank {r}: the step's ops {sorted(ops)}, want {sorted(want)}"
    hvd.shutdown()
