"""join(): ranks with fewer batches join early; the others' ops go on with
them standing in (zeros for all-reduce, no rows for allgather), and uneven
data trains to the end without a hang, equal to a reference computed here."""

import copy

import pytest
import torch

import hvdtorch as hvd


def _steps(rank: int) -> int:
    return rank + 1  # rank r has r + 1 batches: every rank runs out at a different step


def check_collectives_with_joined_ranks():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for i in range(_steps(r)):
        active = [k for k in range(n) if _steps(k) > i]
        # Unnamed on purpose: after join(), every rank numbers them afresh.
        got = hvd.allreduce(torch.full((5,), float(r + 1)), op=hvd.Sum)
        assert torch.equal(got, torch.full((5,), float(sum(k + 1 for k in active)))), (i, got)
        avg = hvd.allreduce(torch.full((3,), float(r + 1)), op=hvd.Average, name=f"avg.{i}")
        # Average divides by every rank, joined or not (as Horovod does).
        torch.testing.assert_close(avg, torch.full((3,), sum(k + 1 for k in active) / n))
        ints = hvd.allreduce(torch.full((2,), 7 * (r + 1), dtype=torch.int64), op=hvd.Average, name=f"iavg.{i}")
        assert torch.equal(ints, torch.full((2,), 7 * sum(k + 1 for k in active) // n, dtype=torch.int64)), ints
        rows = hvd.allgather(torch.full((r + 1, 2), float(r)), name=f"gather.{i}")
        want = torch.cat([torch.full((k + 1, 2), float(k)) for k in active])
        assert torch.equal(rows, want), (i, rows)
        root = active[-1]
        b = hvd.broadcast(torch.full((4,), float(r)), root_rank=root, name=f"bcast.{i}")
        assert torch.equal(b, torch.full((4,), float(root))), b
        hvd.barrier()
        if len(active) == 1 and n > 1:
            # Alone with every other rank joined: ops a joined rank cannot
            # stand in for fail clearly, and the engine goes on.
            joined = ", ".join(map(str, range(n - 1)))
            with pytest.raises(hvd.HvdError, match=rf"cannot run while ranks \[{joined}\] have joined"):
                hvd.allreduce(torch.ones(2), op=hvd.Min, name=f"min.{i}")
            with pytest.raises(hvd.HvdError, match=r"root rank \[0\] has joined"):
                hvd.broadcast(torch.ones(2), root_rank=0, name=f"bcast0.{i}")
            with pytest.raises(hvd.HvdError, match="cannot run while ranks"):
                hvd.reducescatter(torch.ones(2 * n), op=hvd.Sum, name=f"rs.{i}")
    last = hvd.join()
    assert last == n - 1, last
    # Everyone is back in step, unnamed ops included.
    got = hvd.allreduce(torch.full((2,), float(r)), op=hvd.Sum)
    assert torch.equal(got, torch.full((2,), float(sum(range(n))))), got
    # A second round of joins works the same way: rank 0 (unless alone) joins at once.
    if n == 1 or r > 0:
        got = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="round2")
        assert torch.equal(got, torch.full((1,), float(max(n - 1, 1)))), got
    assert hvd.join() == (0 if n == 1 else n - 1)
    hvd.shutdown()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)


def _reference(n: int, lr: float):
    """One process: at step i, the gradients of the ranks with data at i, summed, over n."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for i in range(max(_steps(k) for k in range(n))):
        opt.zero_grad()
        total = [torch.zeros_like(p) for p in model.parameters()]
        for k in range(n):
            if _steps(k) > i:
                shadow = copy.deepcopy(model)
                x, y = _batch(k, i)
                torch.nn.functional.mse_loss(shadow(x), y).backward()
                for t, p in zip(total, shadow.parameters()):
                    t += p.grad
        for p, t in zip(model.parameters(), total):
            p.grad = t / n
        opt.step()
    return model


def train_uneven(kind: str):
    """Rank r has r + 1 batches; join() at the end; broadcast from the last
    rank to join; every rank then holds the reference's weights."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    lr = 0.1
    model = _model()
    if kind == "model":
        net = hvd.DistributedModel(model)
        opt = torch.optim.SGD(net.parameters(), lr=lr)
    else:
        net = model
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=lr), named_parameters=model.named_parameters()
        )
    for i in range(_steps(r)):
        opt.zero_grad()
        x, y = _batch(r, i)
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    last = hvd.join()
    assert last == n - 1, last
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    want = _reference(n, lr)
    for (name, p), q in zip(model.named_parameters(), want.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6, msg=lambda m: f"{kind} {name}: {m}")
    hvd.shutdown()
