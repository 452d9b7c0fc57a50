"""Rank side of tests/test_elastic.py: commits interrupted by SIGKILL."""

import os
import signal
import sys

import torch

import hvdtorch as hvd
from hvdtorch.elastic import persist


def _state(commit_dir):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return hvd.elastic.TorchState(model, opt, commit_dir=commit_dir, epoch=0)


def commit_then_die_in_the_next(commit_dir: str, where: str):
    """Commits once (epoch 1, weights all 1), changes everything, and is
    SIGKILLed inside the second commit: `where` = "write" (half of the new
    file written) or "rename" (new file complete, not yet renamed)."""
    hvd.init()
    state = _state(commit_dir)
    with torch.no_grad():
        for p in state.model.parameters():
            p.fill_(1.0)
    state.epoch = 1
    state.commit()
    print("COMMITTED 1", flush=True)

    with torch.no_grad():
        for p in state.model.parameters():
            p.fill_(2.0)
    state.epoch = 2
    if where == "write":
        real_save = persist.torch.save

        def save_half_then_die(obj, f):
            real_save(obj, f)
            f.flush()
            f.truncate(f.tell() // 2)
            os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)

        persist.torch.save = save_half_then_die
    elif where == "rename":

        def die(*_):
            os.kill(os.getpid(), signal.SIGKILL)

        persist.os.replace = die
    else:
        raise ValueError(where)
    state.commit()
    print("SECOND COMMIT RETURNED", flush=True)  # never reached
    sys.exit(3)


def resume_and_commit(commit_dir: str):
    """A fresh process: the last intact commit comes back; the next commit
    sweeps the dead writer's temporary file."""
    hvd.init()
    state = _state(commit_dir)
    assert state.load_last_commit(), "no commit found"
    assert state.epoch == 1, f"epoch {state.epoch}, wanted the first commit's 1"
    assert state.commit_count == 1
    for p in state.model.parameters():
        assert bool((p == 1.0).all()), "parameters are not the first commit's"
    state.epoch = 3
    state.commit()
    leftovers = [f for f in os.listdir(commit_dir) if f.endswith(".tmp")]
    assert not leftovers, f"temporary files left: {leftovers}"
    print("RESUMED-OK", flush=True)
    hvd.shutdown()


def _values(state):
    params = [p.detach().clone() for p in state.model.parameters()]
    momenta = [state.optimizer.state[p]["momentum_buffer"].clone() for p in state.model.parameters()]
    return params, momenta


def _same(got, want, what):
    for a, b in zip(got[0] + got[1], want[0] + want[1]):
        assert torch.equal(a, b), f"rank {hvd.rank()}: {what}: {a.tolist()} != {b.tolist()}"


def _train_step(state):
    state.optimizer.zero_grad()
    state.model(torch.ones(2, 4)).pow(2).sum().backward()
    state.optimizer.step()


def check_restore(commit_dir: str):
    """A commit kept in memory is a copy: training on after it and restore()
    bring back the committed parameters, momentum and extras; a fresh state
    loads the same commit from disk."""
    hvd.init()
    state = _state(commit_dir)
    _train_step(state)  # momentum buffers exist from here on
    state.epoch = 4
    state.commit()
    committed = _values(state)
    for _ in range(2):
        _train_step(state)
    state.epoch = 5
    changed = _values(state)
    assert not torch.equal(changed[0][0], committed[0][0]), "training did not change the weights"
    state.restore()
    _same(_values(state), committed, "after restore() from memory")
    assert state.epoch == 4, state.epoch
    # The same commit from disk, into a state built afresh.
    fresh = _state(commit_dir)
    _train_step(fresh)
    assert fresh.load_last_commit(), "no commit found on disk"
    _same(_values(fresh), committed, "after load_last_commit() from disk")
    assert fresh.epoch == 4 and fresh.commit_count == 1, (fresh.epoch, fresh.commit_count)
    hvd.barrier()
    hvd.shutdown()


def check_extras_are_copies(commit_dir: str):
    """A commit keeps copies of its extras' state: an EMA (torch's
    AveragedModel, updated in place after each step), a scheduler and a
    GradScaler changed after commit() are all rolled back by restore(), in
    place (the objects the loop holds), and a sampler's processed indices too."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.5))
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=1)
    sampler = hvd.elastic.ElasticSampler(list(range(8)), shuffle=False)
    state = hvd.elastic.TorchState(
        model, opt, commit_dir=commit_dir, ema=ema, schedule=schedule, scaler=scaler, sampler=sampler
    )
    _train_step(state)
    ema.update_parameters(model)
    scaler.scale(torch.ones(()))  # the scaler's state exists from its first scale()
    state.commit()
    ema_at_commit = [p.detach().clone() for p in ema.parameters()]
    lr_at_commit, scale_at_commit = opt.param_groups[0]["lr"], scaler.get_scale()
    for _ in range(2):
        _train_step(state)
        ema.update_parameters(model)  # in place: the commit must not share these tensors
        schedule.step()
        scaler.update(new_scale=scaler.get_scale() * 2)
    sampler.record_batch(0, 2)
    assert not torch.equal(next(ema.parameters()), ema_at_commit[0]), "the EMA did not move"
    state.restore()
    for got, want in zip(ema.parameters(), ema_at_commit):
        assert torch.equal(got, want), f"rank {hvd.rank()}: the EMA was not rolled back: {got} vs {want}"
    assert state.ema is ema and state.schedule is schedule and state.scaler is scaler, "extras were replaced"
    assert opt.param_groups[0]["lr"] == lr_at_commit, (opt.param_groups[0]["lr"], lr_at_commit)
    assert scaler.get_scale() == scale_at_commit, (scaler.get_scale(), scale_at_commit)
    assert sampler.state_dict()["processed_indices"] == [], sampler.state_dict()
    hvd.barrier()
    hvd.shutdown()


def check_powersgd_state(commit_dir: str):
    """TorchState carries Compression.powersgd's state: a DistributedModel's (handed over as the
    DistributedModel or as the module it wraps) and a DistributedOptimizer's. restore() brings the
    committed state back, a fresh state loads it from disk, and sync() gives every rank rank 0's pass
    count and Q factors, and per parameter the mean of the errors of the ranks that hold one."""
    from tests.workers.powersgd import OPTIONS, _steps, _wrap, make_net

    hvd.init()
    for kind in ("model", "module", "optimizer"):
        net = make_net()
        compressor = hvd.Compression.powersgd(**OPTIONS)
        model, opt = _wrap(net, "optimizer" if kind == "optimizer" else "model", compressor)
        tracked = net if kind == "module" else model
        state = hvd.elastic.TorchState(tracked, opt, commit_dir=os.path.join(commit_dir, kind))
        _steps(model, opt, range(3))
        state.commit()
        committed = compressor.state_dict()
        assert committed["iteration"] == 3 and committed["errors"], (kind, committed["iteration"])
        _steps(model, opt, range(3, 5))
        assert compressor.iteration == 5
        state.restore()
        _same_powersgd(compressor.state_dict(), committed, f"{kind}: after restore()")

        fresh_net = make_net(seed=1)
        fresh = hvd.Compression.powersgd(**OPTIONS)
        fresh_model, fresh_opt = _wrap(fresh_net, "optimizer" if kind == "optimizer" else "model", fresh)
        fresh_state = hvd.elastic.TorchState(
            fresh_net if kind == "module" else fresh_model, fresh_opt, commit_dir=os.path.join(commit_dir, kind)
        )
        if hvd.rank() == 0:  # as in hvd.elastic.run; the commit holds the errors of each host's writer
            assert fresh_state.load_last_commit(), "no commit found on disk"
            _same_powersgd(fresh.state_dict(), committed, f"{kind}: after load_last_commit()")

        # sync(): rank 1 stands for a rank that joined: no PowerSGD state; with 3+ ranks the others hold theirs.
        if hvd.rank() == 1:
            compressor.load_state_dict({"iteration": 0, "errors": {}, "qs": {}})
        everyone = hvd.allgather_object(compressor.state_dict())
        state.sync()
        got = compressor.state_dict()
        root = everyone[0]
        assert got["iteration"] == root["iteration"] == 3, (kind, got["iteration"])
        assert set(got["qs"]) == set(root["qs"]) and set(got["errors"]) == set(root["qs"]), kind
        for k, q in root["qs"].items():
            assert torch.equal(got["qs"][k], q), f"rank {hvd.rank()}: {kind}: Q of parameter {k} is not rank 0's"
            holders = [s["errors"][k] for s in everyone if k in s["errors"]]
            assert len(holders) == hvd.size() - 1, (kind, k, len(holders))
            torch.testing.assert_close(got["errors"][k], sum(holders) / len(holders), rtol=1e-12, atol=0)
        # Training goes on in step on every rank.
        _steps(model, opt, range(5, 7))
        weights = hvd.allgather_object([p.detach() for p in net.parameters()])
        for other in weights[1:]:
            for a, b in zip(weights[0], other):
                assert torch.equal(a, b), f"{kind}: the ranks' weights differ after sync()"
    hvd.barrier()
    hvd.shutdown()


def _same_powersgd(got, want, what):
    assert got["iteration"] == want["iteration"], f"rank {hvd.rank()}: {what}: iteration {got['iteration']}"
    for part in ("errors", "qs"):
        assert set(got[part]) == set(want[part]), f"rank {hvd.rank()}: {what}: {part} of other parameters"
        for k in want[part]:
            assert torch.equal(got[part][k], want[part][k]), f"rank {hvd.rank()}: {what}: {part}[{k}] differs"
