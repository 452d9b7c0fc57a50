"""A DDP user's patterns on 2 ranks: each trains as under
DistributedDataParallel, or is refused with a message naming the fix
(tests/workers/from_ddp.py; docs/guide.md, "Coming from DDP")."""

import os
import subprocess
import sys

import pytest

from tests.harness import ROOT, run_ranks


@pytest.mark.parametrize(
    "check",
    [
        "equals_ddp_with_batchnorm",
        "buffer_sync_off_and_no_sync",
        "ddp_arguments",
        "convert_sync_batchnorm",
        "clipping_between_backward_and_step",
        "scheduler_built_before_sharding",
        "sharded_optimizer_before_the_model",
    ],
)
def test_ddp_pattern(check):
    run_ranks(f"tests.workers.from_ddp:{check}", 2, timeout=120)


def test_mpirun_exports_torch_variables():
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OMPI_", "PMI", "SLURM_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_"))
    }
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""),
    )
    cmd = ["mpirun", "--oversubscribe", "-np", "2", sys.executable, "-m", "tests.workers.from_ddp"]
    out = subprocess.run(cmd + ["torch_env_after_init"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("torch env ok") == 2, out.stdout + out.stderr
