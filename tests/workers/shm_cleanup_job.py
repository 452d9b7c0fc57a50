"""A 2-rank job on one host that fails in one of several ways, for
tests/test_shm_cleanup.py (run by torchrun or mpirun, not by run_ranks).

Every rank prints "SHM_TOKEN=<token>" as init() builds the engine: every
shared-memory name of the job starts with "/hvdtorch-<token>", so the test
looks for this job's entries only.

Scenarios:
  raise_before_step    each rank wraps a model in DistributedModel; rank 1
                       raises in user code before its first step, rank 0
                       steps (and gets HvdError from rank 1's shutdown).
  terminated_in_init   rank 1 dies (os._exit, no cleanup) before building its
                       engine; rank 0 sits in init() waiting for it and is
                       terminated by the launcher (SIGTERM).
  killed_in_init       rank 0 is SIGKILLed while it builds its engine (rank 1
                       never builds its own); the launcher then terminates
                       rank 1.
  killed_mid_step      rank 1 is SIGKILLed inside the backward pass of its
                       first step, before rank 0 has mapped its buckets.
"""

import os
import signal
import subprocess
import sys
import time

import torch

import hvdtorch as hvd
import hvdtorch._C as _C


def _wrap_engine(scenario: str) -> None:
    real = _C.Engine

    def engine(opts, rank, host_of_rank, control, data, shm_token, *rest):
        print(f"SHM_TOKEN={shm_token}", flush=True)
        if scenario == "terminated_in_init" and rank == 1:
            time.sleep(1.0)
            os._exit(1)
        if scenario == "killed_in_init":
            if rank == 0:
                # A separate process kills this one, so the kill does not
                # depend on this interpreter getting to run a thread.
                subprocess.Popen(["sh", "-c", f"sleep 1; kill -9 {os.getpid()}"])
            else:
                # Never builds its engine: rank 0 cannot leave init() alive.
                # The launcher terminates this rank once rank 0 is gone.
                time.sleep(60.0)
        return real(opts, rank, host_of_rank, control, data, shm_token, *rest)

    _C.Engine = engine


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


# As in a training script: the model is a global, alive until the interpreter exits.
model = None


def main(scenario: str) -> None:
    global model
    _wrap_engine(scenario)
    hvd.init()
    r = hvd.rank()
    print(f"rank {r}: init returned", flush=True)
    model = hvd.DistributedModel(_model())
    if scenario == "raise_before_step" and r == 1:
        raise RuntimeError("rank 1: user code failed before the first step")
    for step in range(5):
        if scenario == "killed_mid_step" and r == 1 and step == 0:
            model.module[0].weight.register_hook(lambda g: os.kill(os.getpid(), signal.SIGKILL))
        model(torch.ones(4, 64)).sum().backward()
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
