"""A failed job leaves nothing in /dev/shm: 2 ranks under torchrun and under
mpirun, one of them raising before its first step, terminated by the
launcher inside init(), or SIGKILLed inside init() or mid-step. Each test
looks only at its own job's names (the job prints its shared-memory token),
so jobs running beside it do not matter.

What SIGKILL leaves (the killed rank's own names) is removed by the next job
on the host, which the SIGKILL tests run: a plain single-process init(). So is
the FileStore file of an MPI job whose ranks were killed before rank 0's
shutdown() could remove it: after the next job no such file of a launcher that
has exited is left in the temp directory."""

import os
import re
import signal
import subprocess
import sys
import tempfile

import pytest

from tests.harness import ROOT
from tests.netns import clean_env

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
JOB = "tests.workers.shm_cleanup_job"


def _env():
    env = clean_env()
    env.update(
        {
            "PYTHONPATH": ROOT,
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            # Longer than the launchers take to stop a failed job: the ranks
            # must be stopped by the launcher, not by their own deadline.
            "HVDTORCH_TIMEOUT": "60",
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        }
    )
    return env


def _command(launcher, scenario):
    if launcher == "torchrun":
        return [TORCHRUN, "--standalone", "--nproc_per_node=2", "--monitor-interval=0.2", "-m", JOB, scenario]
    return ["mpirun", "--oversubscribe", "-np", "2", sys.executable, "-m", JOB, scenario]


def _run(cmd, timeout=120):
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(
            f"{cmd} did not finish within {timeout} s (killed)\n{out.decode(errors='replace')}"
        ) from None
    return proc.returncode, out.decode(errors="replace")


def _failed_job(launcher, scenario):
    """Runs the job, which must fail; returns (its token, its output)."""
    code, out = _run(_command(launcher, scenario))
    assert code != 0, f"the job was meant to fail\n{out[-6000:]}"
    tokens = set(re.findall(r"SHM_TOKEN=(\S+)", out))
    assert len(tokens) == 1, f"expected one shared-memory token, got {tokens}\n{out[-6000:]}"
    return tokens.pop(), out


def _entries(token):
    return sorted(e for e in os.listdir("/dev/shm") if e.startswith(f"hvdtorch-{token}"))


def _next_job():
    code, out = _run([sys.executable, "-c", "import hvdtorch as hvd; hvd.init(); hvd.shutdown()"], timeout=60)
    assert code == 0, out


def _stores_of_exited_launchers():
    """FileStore files (hvdtorch/launch.py file_store_path) of MPI jobs whose launcher is gone."""
    stale = []
    for name in os.listdir(tempfile.gettempdir()):
        match = re.match(r"^hvdtorch-(?:ompi|pmi)-.*-(\d+)\.store$", name)
        if match:
            try:
                os.kill(int(match.group(1)), 0)
            except ProcessLookupError:
                stale.append(name)
    return stale


LAUNCHERS = ["torchrun", "mpirun"]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_rank_raising_before_its_first_step_leaves_nothing(launcher):
    token, out = _failed_job(launcher, "raise_before_step")
    assert "user code failed before the first step" in out, out[-6000:]
    assert _entries(token) == [], out[-6000:]
    _next_job()
    assert _stores_of_exited_launchers() == []


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_rank_terminated_inside_init_leaves_nothing(launcher):
    token, out = _failed_job(launcher, "terminated_in_init")
    assert "rank 0: init returned" not in out, out[-6000:]
    assert _entries(token) == [], out[-6000:]
    _next_job()
    assert _stores_of_exited_launchers() == []


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_rank_killed_inside_init_leaves_nothing_after_the_next_job(launcher):
    token, out = _failed_job(launcher, "killed_in_init")
    assert "rank 0: init returned" not in out, out[-6000:]
    _next_job()
    assert _entries(token) == [], out[-6000:]
    assert _stores_of_exited_launchers() == []


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_rank_killed_mid_step_leaves_nothing_after_the_next_job(launcher):
    token, out = _failed_job(launcher, "killed_mid_step")
    assert out.count("init returned") == 2, out[-6000:]
    _next_job()
    assert _entries(token) == [], out[-6000:]
    assert _stores_of_exited_launchers() == []
