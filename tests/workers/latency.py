"""Small all-reduces whose hand-off phases the engine logs (csrc/core/engine/op_timing.h)."""

import time

import torch

import hvdtorch as hvd

OPS = 30
PHASES = {"binding", "control_wake", "negotiate", "executor_wake", "copy_in", "reduce", "finish", "waiter_wake"}


def phases_of_small_allreduces():
    hvd.init()
    engine = hvd.runtime.state().engine
    engine.latency_phases(clear=True)
    x = torch.ones(1024)
    took = []
    for i in range(OPS):
        x.fill_(1.0)
        t0 = time.perf_counter_ns()
        hvd.allreduce_(x, op=hvd.Sum, name="latency.4k")
        took.append(time.perf_counter_ns() - t0)
        assert x[0].item() == hvd.size(), (i, x[0].item())
    phases = engine.latency_phases(clear=True)
    assert set(phases) == PHASES, sorted(phases)
    assert all(len(v) == OPS for v in phases.values()), {k: len(v) for k, v in phases.items()}
    for i in range(OPS):
        one = {k: v[i] for k, v in phases.items()}
        # Every hand-off of an op submitted and waited for through the
        # binding is stamped, in order, within the time the caller saw.
        assert all(ns >= 0 for ns in one.values()), (i, one)
        assert sum(one.values()) <= took[i], (i, one, took[i])
    assert engine.latency_phases() == {}, "clear=True forgets the log"
    print(f"rank {hvd.rank()}: LATENCY-OK", flush=True)
    hvd.shutdown()
