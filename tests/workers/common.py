"""Helpers shared by the rank-side workers."""

import os

import torch

import hvdtorch as hvd
from hvdtorch import _C
from hvdtorch.collectives import process_set_table


def device_of(device: str) -> torch.device:
    """The device a check runs on, by its argument: "cuda" is cuda:0 (the
    test machine has one GPU, which every rank shares, made this process's
    current device); anything else as torch names it ("cpu")."""
    if device == "cuda":
        torch.cuda.set_device(0)
        return torch.device("cuda:0")
    return torch.device(device)


def registered_reducers(own_op: bool = False):
    """The reducers of the registry (algorithms/reducer_registry.h), in its
    order: those that reduce the standard ops, and with ``own_op`` also
    those that define an op of their own (adasum). Tests name reducers
    through this, so a reducer added to the registry is tested too."""
    return [r["name"] for r in _C.reducer_registry() if own_op or r["own_op"] is None]


def available_reducers(engine):
    """registered_reducers() that ``engine``'s ranks can run (node needs shared memory)."""
    return [name for name in registered_reducers() if name in engine.cost_model()]


def expect(exc_type, words, call, r):
    """Runs `call`, which must raise `exc_type` with each of `words` in its
    message; prints the message (tagged with rank `r`) and returns it."""
    try:
        call()
    except exc_type as e:
        msg = str(e)
        for w in words:
            assert w in msg, f"expected {w!r} in: {msg}"
        print(f"rank {r} raised {exc_type.__name__}: {msg}", flush=True)
        return msg
    raise AssertionError(f"no {exc_type.__name__} for {words}")


def job_process_set():
    """The process set the job's checks run in: tests/harness.py's
    run_ranks(process_set=[...]) (HVDTORCH_TEST_PROCESS_SET), added now if
    it is not yet (a collective: call it on every rank, after hvd.init(),
    in the same order as any other set added); else the global set."""
    spec = os.environ.get("HVDTORCH_TEST_PROCESS_SET")
    if not spec:
        return hvd.global_process_set
    ranks = [int(g) for g in spec.split(",")]
    if ranks == list(range(hvd.size())):
        return hvd.global_process_set
    return process_set_table.process_set_with(ranks)
