"""Elastic training on torchrun's agent: resume from the last commit after a
lost worker (identical parameters), after a lost host (fewer workers), and
commits that survive a writer killed in the middle.

The job is examples/elastic_train.py (2 ranks per agent); it checks itself
that every sample of every epoch was trained on exactly once.
"""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from hvdtorch.elastic.sampler import ElasticSampler
from tests.harness import ROOT, elastic_worker_pid, free_port, run_ranks
from tests.netns import clean_env

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
EXAMPLE = "examples/elastic_train.py"
TIMEOUT = 10  # HVDTORCH_TIMEOUT of the jobs


# torchrun shares its rendezvous TCPStore with the workers and keeps it across
# restarts, so a restarted worker's Gloo may read the address a dead worker
# published in the previous round (connection refused at init, which costs a
# restart). The agents take their own store per round with this:
AGENT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def _env():
    env = clean_env()
    env.update({"HVDTORCH_TIMEOUT": str(TIMEOUT), "PYTHONPATH": ROOT, **AGENT_ENV})
    return env


def _single_host_job(tmp_path, tag, *extra):
    out = tmp_path / f"{tag}.pt"
    log = open(tmp_path / f"{tag}.log", "w")
    cmd = [
        TORCHRUN,
        "--nproc_per_node=2",
        "--max-restarts=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "--monitor-interval=0.2",
        EXAMPLE,
        "--commit-dir",
        str(tmp_path / f"{tag}-commits"),
        "--out",
        str(out),
        *extra,
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, out, tmp_path / f"{tag}.log"


def _wait(proc, log, timeout):
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"job did not finish within {timeout} s (killed)\n{log.read_text()[-6000:]}") from None
    assert proc.returncode == 0, log.read_text()[-6000:]
    return log.read_text()


def _params(path):
    return torch.load(path, weights_only=True)


def test_worker_killed_mid_training_resumes_to_the_same_parameters(tmp_path):
    """kill -9 of a worker under --max-restarts=2: the agent restarts both,
    they resume from the last commit, and the final parameters are bitwise
    those of a run that was never interrupted (same commits, 2 ranks, so every
    sum is a + b whatever the reducer)."""
    ref, ref_out, ref_log = _single_host_job(tmp_path, "reference")
    ref_text = _wait(ref, ref_log, 300)
    assert "restart 1" not in ref_text

    job, out, log = _single_host_job(tmp_path, "killed", "--step-delay", "0.05")
    try:
        deadline = time.monotonic() + 240
        while "step 8 " not in log.read_text():
            assert job.poll() is None and time.monotonic() < deadline, log.read_text()[-6000:]
            time.sleep(0.05)
        pid = elastic_worker_pid(str(tmp_path / "killed-commits"), rank=1)
        assert pid, "worker of rank 1 not found"
        os.kill(pid, signal.SIGKILL)
        text = _wait(job, log, 300)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert "restart 1" in text, text[-4000:]
    assert "resumed from commit" in text, text[-4000:]
    assert text.count("trained on exactly once") == 3, text[-4000:]
    a, b = _params(ref_out), _params(out)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs from the uninterrupted run"


def test_a_host_leaves_and_training_goes_on_with_fewer_workers(netns_hosts, tmp_path):
    """--nnodes=1:2 with the c10d rendezvous, 2 hosts x 2 ranks; host 1 is
    killed whole (agent and workers). Host 0's agent restarts its workers, the
    rendezvous closes with the one node left, and training resumes from the
    last commit on 2 ranks, each epoch still covering every sample once."""
    hosts = netns_hosts(2)
    commits = tmp_path / "commits"
    conf = "join_timeout=120,last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"
    job = hosts.torchrun(
        EXAMPLE,
        "--commit-dir",
        str(commits),
        "--step-delay",
        "0.1",
        "--samples",
        "96",
        nproc=2,
        elastic="1:2",
        rdzv_conf=conf,
        env={"HVDTORCH_TIMEOUT": TIMEOUT, **AGENT_ENV},
        torchrun_args=["--max-restarts=3", "--monitor-interval=0.2"],
    )
    job.wait_for("start: 4 ranks", timeout=240)
    job.wait_for("step 5 ", timeout=240)
    hosts.kill_host(1)
    deadline = time.monotonic() + 300
    agent0 = job.procs[0]
    try:
        agent0.wait(timeout=max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"host 0 did not finish within 300 s\n{job.output()}") from None
    text = job.outputs()[0]
    assert agent0.returncode == 0, job.output()
    assert "start: 2 ranks" in text and "resuming on 2 ranks" in text, text[-4000:]
    assert "resumed from commit" in text, text[-4000:]
    assert text.count("trained on exactly once") == 3, text[-4000:]
    assert "done: 3 epochs" in text, text[-4000:]


@pytest.mark.parametrize("where", ["write", "rename"])
def test_worker_killed_during_commit_leaves_the_previous_commit(tmp_path, where):
    commits = str(tmp_path / "commits")
    results = run_ranks(
        "tests.workers.elastic:commit_then_die_in_the_next", 1, args=[commits, where], expect_success=False, timeout=120
    )
    assert results[0].returncode == -signal.SIGKILL, results[0].output
    assert "COMMITTED 1" in results[0].output
    names = os.listdir(commits)
    assert "commit.pt" in names and any(n.endswith(".tmp") for n in names), names
    run_ranks("tests.workers.elastic:resume_and_commit", 1, args=[commits], timeout=120)


class _Data:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def _shards(sampler_state, world):
    out = []
    for rank in range(world):
        s = ElasticSampler(_Data(24), shuffle=True, seed=3)
        s.reset = _dealer(s, world, rank)
        s.load_state_dict(sampler_state)
        out.append(list(s))
    return out


def _dealer(s, world, rank):
    import hvdtorch.elastic.sampler as mod

    def reset():
        real = mod._world
        mod._world = lambda: (world, rank)
        try:
            ElasticSampler.reset(s)
        finally:
            mod._world = real

    return reset


def test_sampler_resumes_with_the_tail_of_each_shard_and_reshards_the_rest():
    full = _shards({"epoch": 2, "processed_indices": []}, 2)
    assert sorted(full[0] + full[1]) == list(range(24))
    # Two steps of batch 3 on each of 2 ranks processed: each shard goes on with its own tail.
    done = set(full[0][:6] + full[1][:6])
    resumed = _shards({"epoch": 2, "processed_indices": sorted(done)}, 2)
    assert resumed == [full[0][6:], full[1][6:]]
    # On 3 ranks the rest is dealt anew: nothing repeated, nothing skipped.
    three = _shards({"epoch": 2, "processed_indices": sorted(done)}, 3)
    assert sorted(sum(three, [])) == sorted(set(range(24)) - done)
    # Another epoch is another permutation.
    assert _shards({"epoch": 3, "processed_indices": []}, 2) != full


def _dealt(n, world, processed=()):
    out = []
    for rank in range(world):
        s = ElasticSampler(_Data(n), shuffle=False)
        s.reset = _dealer(s, world, rank)
        s.load_state_dict({"epoch": 0, "processed_indices": sorted(processed)})
        out.append(list(s))
    return out


def test_sampler_deals_every_sample_when_the_ranks_do_not_divide_it():
    # 10 samples on 3 ranks: 4 each, the last step padded with the first samples.
    shards = _dealt(10, 3)
    assert [len(s) for s in shards] == [4, 4, 4]
    assert shards == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    # After 5 processed samples, 5 remain on 3 ranks: 2 each, none lost.
    rest = _dealt(10, 3, processed=[0, 1, 2, 3, 4])
    assert [len(s) for s in rest] == [2, 2, 2]
    assert set(sum(rest, [])) == {5, 6, 7, 8, 9}
    # 7 samples on 4 ranks, and one sample on 2 ranks.
    assert set(sum(_dealt(7, 4), [])) == set(range(7)) and {len(s) for s in _dealt(7, 4)} == {2}
    assert _dealt(1, 2) == [[0], [0]]


def test_plain_extras_restored_as_copies_every_time():
    # A plain extra (a list) changed in place after a restore() must not change the saved state:
    # every restore() brings back the values as saved, not what the last restore handed out.
    from hvdtorch.elastic.state import ObjectState, TorchState

    for state in (ObjectState(history=[1], epoch=0), TorchState(history=[1], epoch=0)):
        state.history.append(2)
        state.restore()
        assert state.history == [1], (type(state).__name__, state.history)
        state.history.append(3)
        state.restore()
        assert state.history == [1], (type(state).__name__, "second restore()", state.history)
        state.history.append(4)
        state.save()
        state.history.append(5)
        state.restore()
        assert state.history == [1, 4], (type(state).__name__, "after save()", state.history)


def test_torch_state_restores_from_memory_and_from_disk(tmp_path):
    run_ranks("tests.workers.elastic:check_restore", 2, args=[str(tmp_path / "commits")], timeout=90)


def test_torch_state_commits_copies_of_its_extras(tmp_path):
    run_ranks("tests.workers.elastic:check_extras_are_copies", 2, args=[str(tmp_path / "commits")], timeout=90)


def test_torch_state_carries_the_powersgd_state(tmp_path):
    run_ranks("tests.workers.elastic:check_powersgd_state", 3, args=[str(tmp_path / "commits")], timeout=150)
