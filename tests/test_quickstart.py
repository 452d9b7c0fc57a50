"""examples/quickstart.py (the README's example) runs as its docstring says, under torchrun and
mpirun with 2 ranks and as one process, and the 2-rank runs train as the one process does on the
same global batch: the same losses, accuracies and checkpoint, up to float rounding."""

import json
import os
import subprocess
import sys
import time

import pytest

from tests.harness import ROOT, free_port, launcher_free_env

SCRIPT = os.path.join(ROOT, "examples", "quickstart.py")
# Fewer samples than the script's defaults, to keep the three jobs short; the same code runs.
ARGS = ["--epochs", "2", "--train-size", "1024", "--val-size", "256"]
DEADLINE_S = 150  # all three jobs together; each is a few seconds of work on 2 idle cores
LAUNCHERS = {
    "python": lambda: [sys.executable, SCRIPT],
    "torchrun": lambda: [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        SCRIPT,
    ],
    "mpirun": lambda: ["mpirun", "--oversubscribe", "-np", "2", sys.executable, SCRIPT],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each launcher's job, all three at once (they are mostly start-up), with one deadline; a job
    that fails or passes the deadline fails the test with every job's output."""
    out = tmp_path_factory.mktemp("quickstart")
    env = launcher_free_env()
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    jobs = {}
    for name, command in LAUNCHERS.items():
        args = [*ARGS, "--out", str(out / f"{name}.json"), "--checkpoint", str(out / f"{name}.pt")]
        jobs[name] = subprocess.Popen(
            command() + args,
            cwd=out,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    deadline = time.monotonic() + DEADLINE_S
    outputs, failed = {}, []
    for name, proc in jobs.items():
        try:
            outputs[name] = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            outputs[name] = proc.communicate()[0] + f"\n(killed after the {DEADLINE_S} s deadline)"
        if proc.returncode != 0:
            failed.append(name)
    report = "\n".join(f"--- {name} (exit {jobs[name].returncode}) ---\n{outputs[name][-4000:]}" for name in jobs)
    assert not failed, f"failed: {failed}\n{report}"
    import torch

    results = {}
    for name in jobs:
        with open(out / f"{name}.json") as f:
            results[name] = json.load(f)
        results[name]["checkpoint"] = torch.load(out / f"{name}.pt", weights_only=True)
        results[name]["output"] = outputs[name]
    return results


def test_one_process_learns_and_logs_once(runs):
    one = runs["python"]
    assert one["size"] == 1 and len(one["losses"]) == 2
    assert one["losses"][-1] < 0.5 * one["losses"][0] and one["accuracies"][-1] > 0.8, one  # chance: 0.25
    assert one["checkpoint"]["epoch"] == 2


@pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])
def test_two_ranks_train_as_one_process(runs, launcher):
    import torch

    one, two = runs["python"], runs[launcher]
    assert two["size"] == 2
    # Rank 0 alone logs: one line per epoch, not one per rank.
    assert two["output"].count("epoch 2: loss") == 1, two["output"]
    # The gradients differ only by rounding (two half-batch means averaged against one mean).
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-4), (one["losses"], two["losses"])
    # An accuracy moves by 1/256 per sample; rounding may move a sample across the boundary.
    assert two["accuracies"] == pytest.approx(one["accuracies"], abs=2.5 / 256), (one, two)
    assert two["checksum"] == pytest.approx(one["checksum"], rel=1e-3)  # a sum of signed parameters
    want, got = one["checkpoint"], two["checkpoint"]
    assert got["epoch"] == want["epoch"] and got["model"].keys() == want["model"].keys()
    for key, w in want["model"].items():
        torch.testing.assert_close(
            got["model"][key], w, rtol=1e-4, atol=1e-5, msg=lambda m: f"{launcher}: {key} against 1 process: {m}"
        )
