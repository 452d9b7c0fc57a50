"""DistributedOptimizer(op=hvd.Adasum) against a reference computed here, in
one process: n replicas of the model, each with its own wrapped optimizer
(its own momentum or Adam state), step from the same parameters on their own
rank's data; the deltas (new - start) are combined by the pairwise Adasum rule
(tests/workers/adasum.py) per tensor and added to the start parameters.
Also the contract's errors and a convergence check."""

import torch
import torch.nn.functional as F

import hvdtorch as hvd
from tests.workers.adasum import reference as adasum_reference


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


def _distributed_run(rank, opt_name, passes, steps, process_set=None):
    model = _model()
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
            x, y = _batch(rank, step, rep)
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
