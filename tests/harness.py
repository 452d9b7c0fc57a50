"""Runs a function as N ranks in N processes, the way torchrun would.

    results = run_ranks("tests.workers.collectives:check_all", nranks=3)

Each rank gets RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR/
MASTER_PORT (a free port), a short HVDTORCH_TIMEOUT, and optionally its own
HVDTORCH_HOSTNAME to emulate several hosts. The whole job has a deadline: if
it passes, every rank is killed and the test fails with each rank's output,
so a hang is a clear failure, never a stuck CI.

Edge configurations for every suite: hosts of different sizes
(hosts=["a", "a", "b"]: two ranks on one host, one on the other), and a
process set the checks run in (process_set=[1, 2]: a set without rank 0;
the rank-side checks take it from tests.workers.common.job_process_set()).

The simulated device's seed (HVDTORCH_SIM_SEED, which each rank mixes with
its rank) is the caller's or the environment's if set, else drawn at random
for each job, so that every run of the suite tries other stream delays; a
failure names it, and setting it reruns the job with the same delays.

The ranks are forked from a server that has imported torch and hvdtorch
once (tests/fork_server.py: each is what `python -m tests.rank_main` would
be, less the 2.5 s of imports), unless their environment differs from the
server's in what is read at import time (then, or with
HVDTORCH_TEST_FRESH_RANKS=1, each starts as a fresh interpreter).
"""

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_fork_server = None


def _server_for(env: Dict[str, str]):
    """The session's fork server if a rank with `env` may be forked from it, else None."""
    global _fork_server
    if os.environ.get("HVDTORCH_TEST_FRESH_RANKS", "") not in ("", "0"):
        return None
    if _fork_server is None:
        import atexit

        from tests.fork_server import ForkServer

        base = dict(os.environ)
        base.update(
            {
                "OMP_NUM_THREADS": "1",
                "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                "PYTHONUNBUFFERED": "1",
            }
        )
        _fork_server = ForkServer(base, ROOT)
        atexit.register(_fork_server.close)
    return _fork_server if _fork_server.can_fork(env) else None


@dataclass
class RankResult:
    rank: int
    returncode: Optional[int]
    output: str


def launcher_free_env() -> Dict[str, str]:
    """This environment without any launcher's variables (Open MPI's, PMI,
    Slurm's, torchrun's), for starting mpirun or torchrun from a test as a
    user's shell would; Open MPI allowed to run as root."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OMPI_", "PMI", "SLURM_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_"))
    }
    env.update(
        {
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMP_NUM_THREADS": "1",
            "HVDTORCH_TIMEOUT": "30",
        }
    )
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RanksFailed(AssertionError):
    pass


def _format(results: Sequence[RankResult]) -> str:
    return "\n".join(f"--- rank {r.rank} (exit {r.returncode}) ---\n{r.output[-4000:]}" for r in results)


def run_ranks(
    target: str,
    nranks: int,
    *,
    hosts: Optional[Sequence[str]] = None,
    env: Optional[Dict] = None,
    rank_env: Optional[Dict[int, Dict]] = None,
    timeout: float = 90.0,
    args: Sequence[str] = (),
    expect_success: bool = True,
    kill_rank: Optional[int] = None,
    kill_after: Optional[str] = None,
    kill_signal: int = signal.SIGKILL,
    process_set: Optional[Sequence[int]] = None,
) -> List[RankResult]:
    """Starts `target` ("module:function") on `nranks` processes and waits.

    hosts[i] becomes rank i's HVDTORCH_HOSTNAME; ranks with equal names form
    one emulated host, and LOCAL_RANK/LOCAL_WORLD_SIZE follow. `env` goes
    to every rank, and rank_env[i] (over it) to rank i alone. With
    `kill_rank`, that rank is sent SIGKILL once its output contains
    `kill_after` (`kill_signal`: SIGSTOP freezes it instead; it is killed
    when the others are done).

    Hosts may differ in size (["a", "a", "b"]). `process_set` (global
    ranks, e.g. [1, 2]: a set without rank 0) is the set the job's checks
    run in: every rank gets it as HVDTORCH_TEST_PROCESS_SET, and a worker
    that supports it calls tests.workers.common.job_process_set() on every
    rank (which adds it; the ranks outside it take no part in the check).
    """
    port = free_port()
    hosts = list(hosts) if hosts else ["localhost"] * nranks
    if len(hosts) != nranks:
        raise ValueError(f"run_ranks: {len(hosts)} hosts for {nranks} ranks")
    if process_set is not None:
        ranks = sorted({int(g) for g in process_set})
        if not ranks or ranks[0] < 0 or ranks[-1] >= nranks:
            raise ValueError(f"run_ranks: process_set={list(process_set)} is not a set of ranks of {nranks}")
        env = dict(env or {}, HVDTORCH_TEST_PROCESS_SET=",".join(map(str, ranks)))
    sim_seed = (
        (env or {}).get("HVDTORCH_SIM_SEED") or os.environ.get("HVDTORCH_SIM_SEED") or random.randrange(1, 1 << 31)
    )
    procs = []
    for rank in range(nranks):
        same = [i for i, h in enumerate(hosts) if h == hosts[rank]]
        e = dict(os.environ)
        e.update(
            {
                "RANK": str(rank),
                "WORLD_SIZE": str(nranks),
                "LOCAL_RANK": str(same.index(rank)),
                "LOCAL_WORLD_SIZE": str(len(same)),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "HVDTORCH_HOSTNAME": hosts[rank],
                "HVDTORCH_TIMEOUT": e.get("HVDTORCH_TEST_TIMEOUT", "20"),
                "HVDTORCH_SIM_SEED": str(sim_seed),
                "OMP_NUM_THREADS": "1",
                "PYTHONPATH": ROOT + os.pathsep + e.get("PYTHONPATH", ""),
                "PYTHONUNBUFFERED": "1",
            }
        )
        for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
            e.pop(k, None)
        for extra in (env, (rank_env or {}).get(rank)):
            if extra:
                e.update({k: str(v) for k, v in extra.items()})
        server = _server_for(e)
        if server is not None:
            procs.append(server.start([target, *args], e, ROOT))
            continue
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.rank_main", target, *args],
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                start_new_session=True,
            )
        )

    outputs = [[] for _ in procs]
    import threading

    def pump(i, p):
        for line in iter(p.stdout.readline, b""):
            outputs[i].append(line.decode(errors="replace"))

    pumps = [threading.Thread(target=pump, args=(i, p), daemon=True) for i, p in enumerate(procs)]
    for t in pumps:
        t.start()

    deadline = time.monotonic() + timeout
    killed = frozen_killed = False
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        if kill_rank is not None and not killed and kill_after in "".join(outputs[kill_rank]):
            procs[kill_rank].send_signal(kill_signal)
            killed = True
        if (
            killed
            and kill_signal == signal.SIGSTOP
            and not frozen_killed
            and all(p.poll() is not None for i, p in enumerate(procs) if i != kill_rank)
        ):
            _kill_group(procs[kill_rank])
            frozen_killed = True
        time.sleep(0.05)
    hung = [i for i, p in enumerate(procs) if p.poll() is None]
    for i in hung:
        _kill_group(procs[i])
    for p in procs:
        p.wait()
    for t in pumps:
        t.join(timeout=5)
    results = [RankResult(i, p.returncode, "".join(outputs[i])) for i, p in enumerate(procs)]
    rerun = f"(HVDTORCH_SIM_SEED={sim_seed} reruns it with the same simulated-device delays)"
    if hung:
        raise RanksFailed(
            f"ranks {hung} of {target} did not finish within {timeout} s (killed) {rerun}\n" + _format(results)
        )
    if expect_success and any(r.returncode != 0 for r in results):
        raise RanksFailed(
            f"{target} failed on ranks {[r.rank for r in results if r.returncode != 0]} {rerun}\n" + _format(results)
        )
    return results


def _kill_group(p) -> None:
    """SIGKILLs a rank's process group; one that has ended meanwhile (a forked
    rank is reaped by the fork server, which reports it a moment later) is no error."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def elastic_worker_pid(marker: str, rank: int, restart: int = 0) -> Optional[int]:
    """Pid of a worker of a torchrun job, found by ``marker`` in its command line,
    with RANK=rank and TORCHELASTIC_RESTART_COUNT=restart (the agent itself, run as
    ``torchrun`` or ``python -m torch.distributed.run``, never matches); None if none."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if (
            marker.encode() in cmdline
            and b"torchrun" not in cmdline
            and b"torch.distributed.run" not in cmdline
            and env.get(b"RANK") == str(rank).encode()
            and env.get(b"TORCHELASTIC_RESTART_COUNT") == str(restart).encode()
        ):
            return int(pid)
    return None
