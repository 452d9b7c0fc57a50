"""Horovod's behaviours beyond the collectives' values: argument errors
catchable as RuntimeError (as Horovod raises them) while staying ValueErrors,
optimizer state broadcast with frozen parameters, DistributedOptimizer's
_parameter_names, and the warning of step() after synchronize()."""

import os
import warnings

import torch
import torch.nn.functional as F

import hvdtorch as hvd


def _bad_calls(r, n, last):
    """(what, call, words the message must hold) for arguments Horovod rejects."""
    dense = torch.ones(2 * n, 3)
    sparse = torch.sparse_coo_tensor([[0]], [1.0], (3,))
    calls = [
        ("reducescatter op=Adasum", lambda: hvd.reducescatter(dense, op=hvd.Adasum), ["reducescatter", "Adasum"]),
        ("allreduce Adasum int64", lambda: hvd.allreduce(torch.ones(3, dtype=torch.int64), op=hvd.Adasum), ["int64"]),
        ("allreduce unknown op", lambda: hvd.allreduce(dense, op=42), ["reduce op 42"]),
        ("broadcast root out of range", lambda: hvd.broadcast(dense, root_rank=n + 3), ["root_rank", str(n + 3)]),
        ("alltoall float splits", lambda: hvd.alltoall(dense, splits=torch.ones(n)), ["splits", "integers"]),
        ("allreduce sparse", lambda: hvd.allreduce(sparse), ["sparse"]),
        ("allreduce of a list", lambda: hvd.allreduce([1.0, 2.0]), ["torch.Tensor", "list"]),
        ("sparse_allreduce dense", lambda: hvd.sparse_allreduce_async(dense, "s", hvd.Sum), ["sparse COO"]),
        ("op and average", lambda: hvd.allreduce(dense, op=hvd.Sum, average=True), ["average"]),
        ("unknown handle", lambda: hvd.synchronize(987654321), ["987654321"]),
    ]
    if last is not None and not last.included():
        calls.append(("op on a set without this rank", lambda: hvd.allreduce(dense, process_set=last), ["include"]))
    x = torch.ones(2 * n, 3, requires_grad=True)
    calls.append(
        ("reducescatter gradient of Min", lambda: hvd.reducescatter(x, op=hvd.Min).sum().backward(), ["gradient"])
    )
    return calls


def check_argument_errors():
    world = int(os.environ["WORLD_SIZE"])
    last = hvd.ProcessSet([world - 1]) if world > 1 else None  # the last rank alone
    hvd.init(process_sets=[last] if last else [])
    r, n = hvd.rank(), hvd.size()
    for what, call, words in _bad_calls(r, n, last):
        try:
            call()
        except RuntimeError as e:  # how a script written for Horovod catches it
            assert isinstance(e, ValueError), f"{what}: {type(e).__mro__} is not a ValueError"
            assert isinstance(e, hvd.InvalidArgumentError), f"{what}: {type(e)}"
            assert not isinstance(e, hvd.HorovodInternalError), f"{what}: an argument error is not internal"
            for w in words:
                assert w in str(e), f"{what}: {w!r} not in {e}"
            print(f"rank {r} {what}: {type(e).__name__}: {e}", flush=True)
        else:
            raise AssertionError(f"{what}: no error")
    # Nothing was left behind: the ranks still agree on an unnamed op.
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))
    hvd.shutdown()


def _model_with_frozen(rank):
    torch.manual_seed(rank)  # different on every rank, so a broadcast shows
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    model[0].weight.requires_grad_(False)  # frozen: no gradient, no state
    model.frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    return model


def _state_tensors(opt):
    state = opt.state_dict()
    out = {}
    for pid, s in sorted(state["state"].items()):
        for k, v in sorted(s.items()):
            out[f"{pid}.{k}"] = torch.as_tensor(v, dtype=torch.float64).reshape(-1)
    for i, g in enumerate(state["param_groups"]):
        out[f"group{i}.lr"] = torch.tensor([float(g["lr"])], dtype=torch.float64)
    return out


def check_frozen_state_broadcast():
    """Every rank ends with the root's optimizer state (and learning rate),
    fresh or after steps, plain or wrapped, SGD with momentum and Adam."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    root = n - 1
    makers = {
        "sgd_momentum": lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9),
        "adam": lambda ps, lr: torch.optim.Adam(ps, lr=lr),
    }
    for kind, make in makers.items():
        for wrapped in (False, True):
            model = _model_with_frozen(r)
            opt = make(model.parameters(), 0.01 * (r + 1))
            hvd.broadcast_parameters(model.state_dict(), root_rank=root)
            hvd.broadcast_optimizer_state(opt, root_rank=root)  # fresh: no state yet
            assert opt.param_groups[0]["lr"] == 0.01 * n, (kind, opt.param_groups[0]["lr"])
            if wrapped:
                opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
            # Plain: a different number of local steps per rank. Wrapped: two
            # steps on averaged gradients, then state and rate made rank-specific.
            for step in range(2 if wrapped else 2 + r):
                g = torch.Generator().manual_seed(10 * r + step)
                opt.zero_grad()
                F.mse_loss(model(torch.randn(5, 4, generator=g)), torch.zeros(5, 2)).backward()
                opt.step()
            if wrapped:
                opt.param_groups[0]["lr"] = 0.1 * (r + 1)
                for state in opt.state.values():
                    for v in state.values():
                        v.add_(r)
            hvd.broadcast_optimizer_state(opt, root_rank=root)
            mine = _state_tensors(opt)
            assert mine, kind
            assert not any(k.startswith("0.") for k in mine), f"{kind}: the frozen weight has state: {sorted(mine)}"
            for key, value in mine.items():
                gathered = hvd.allgather(value.unsqueeze(0), name=f"{kind}.{wrapped}.{key}")
                assert torch.equal(gathered[r], gathered[root]), (kind, wrapped, key, gathered)
            # Training goes on from the broadcast state.
            opt.zero_grad()
            F.mse_loss(model(torch.ones(2, 4)), torch.zeros(2, 2)).backward()
            opt.step()
    hvd.shutdown()


def check_parameter_names():
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    for op in (hvd.Average, hvd.Adasum):
        # Two parameter groups and no named_parameters.
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD([{"params": model[0].parameters()}, {"params": model[1].parameters(), "lr": 0.5}], lr=0.1),
            op=op,
        )
        names = opt._parameter_names
        params = list(model.parameters())
        assert len(names) == len(params) and all(p in names for p in params), names
        ordered = [names[p] for p in params]
        assert len(set(ordered)) == len(ordered), f"not unique: {ordered}"
        everyone = hvd.allgather_object(ordered)
        assert all(o == ordered for o in everyone), everyone
        # With named_parameters: the caller's names.
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(), op=op
        )
        assert {opt._parameter_names[p]: p for p in params} == dict(model.named_parameters())
    hvd.shutdown()


def check_step_warning():
    hvd.init()
    model = torch.nn.Linear(3, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    model(torch.ones(2, 3)).sum().backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    texts = [str(w.message) for w in caught]
    assert any("optimizer.step() called without optimizer.skip_synchronize()" in t for t in texts), texts
    assert any("reduces the gradients a second time" in t for t in texts), texts  # our explanation stays
    hvd.shutdown()
