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
