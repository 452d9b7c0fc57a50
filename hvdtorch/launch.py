"""Which launcher started this process, and how the ranks find each other.

hvdtorch reuses torch.distributed's rendezvous (TCPStore, FileStore) instead of
inventing one. Supported launchers, detected from their environment:

- torchrun / torch.distributed.run: RANK, WORLD_SIZE, LOCAL_RANK,
  LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT.
- Open MPI (mpirun): OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}.
- MPICH / Intel MPI (Hydra): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID.
- Slurm (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID.
- none of these: a single process (size 1).

Under an MPI launcher or srun on one host no extra environment is needed: the
ranks meet through a FileStore in the temp directory, keyed by the job id.
Across hosts they need MASTER_ADDR and MASTER_PORT (a TCPStore on rank 0).
"""

import os
import re
import tempfile
from dataclasses import dataclass
from typing import List, Mapping, Optional


@dataclass
class LaunchInfo:
    launcher: str  # "torchrun", "openmpi", "mpich", "slurm", "single"
    rank: int
    size: int
    local_rank: Optional[int]  # as the launcher reports it (None: unknown)
    local_size: Optional[int]
    job_key: str  # unique per job on one host; names the FileStore
    master_addr: Optional[str]
    master_port: Optional[int]

    @property
    def single_host_by_launcher(self) -> bool:
        return self.local_size is not None and self.local_size == self.size


def _int(env: Mapping[str, str], key: str) -> Optional[int]:
    value = env.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"hvdtorch: environment variable {key}={value!r} is not an integer") from None


def detect(env: Mapping[str, str] = os.environ) -> LaunchInfo:
    addr = env.get("MASTER_ADDR") or None
    port = _int(env, "MASTER_PORT")
    ppid = str(os.getppid())
    if "OMPI_COMM_WORLD_RANK" in env:
        job = env.get("OMPI_MCA_ess_base_jobid") or env.get("PMIX_NAMESPACE") or ppid
        return LaunchInfo(
            "openmpi",
            _int(env, "OMPI_COMM_WORLD_RANK"),
            _int(env, "OMPI_COMM_WORLD_SIZE"),
            _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
            _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"),
            f"ompi-{job}-{ppid}",
            addr,
            port,
        )
    if "PMI_RANK" in env and "PMI_SIZE" in env:
        job = env.get("PMI_KVSNAME") or env.get("PMIX_NAMESPACE") or ppid
        return LaunchInfo(
            "mpich",
            _int(env, "PMI_RANK"),
            _int(env, "PMI_SIZE"),
            _int(env, "MPI_LOCALRANKID"),
            _int(env, "MPI_LOCALNRANKS"),
            f"pmi-{job}-{ppid}",
            addr,
            port,
        )
    if "RANK" in env and "WORLD_SIZE" in env:
        run_id = env.get("TORCHELASTIC_RUN_ID", "none")
        return LaunchInfo(
            "torchrun",
            _int(env, "RANK"),
            _int(env, "WORLD_SIZE"),
            _int(env, "LOCAL_RANK"),
            _int(env, "LOCAL_WORLD_SIZE"),
            f"torchrun-{run_id}-{addr}-{port}",
            addr,
            port,
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        job = f"{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_STEP_ID', '0')}"
        # Slurm only tells the local task count reliably on a single node.
        local_size = _int(env, "SLURM_NTASKS") if env.get("SLURM_NNODES") == "1" else None
        return LaunchInfo(
            "slurm",
            _int(env, "SLURM_PROCID"),
            _int(env, "SLURM_NTASKS"),
            _int(env, "SLURM_LOCALID"),
            local_size,
            f"slurm-{job}",
            addr,
            port,
        )
    return LaunchInfo("single", 0, 1, 0, 1, f"single-{os.getpid()}", addr, port)


def file_store_path(info: LaunchInfo) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in info.job_key)
    return os.path.join(tempfile.gettempdir(), f"hvdtorch-{safe}.store")


# file_store_path() of an MPI job: the last field of its key is the ranks' parent (the launcher's) pid.
_MPI_STORE_FILE = re.compile(r"^hvdtorch-(?:ompi|pmi)-.*-(\d+)\.store$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_file_stores(directory: Optional[str] = None) -> List[str]:
    """Removes the FileStore files of MPI jobs whose launcher has exited; returns their paths.

    Rank 0 removes its job's file at shutdown(). A job whose ranks were
    killed (SIGKILL, or the launcher's SIGTERM after a rank failed) leaves it
    behind; every init() on the host calls this, so the next job removes it.
    The file of a job whose launcher still runs is never touched."""
    directory = directory or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        match = _MPI_STORE_FILE.match(name)
        if match and not _alive(int(match.group(1))):
            path = os.path.join(directory, name)
            try:
                os.remove(path)
                removed.append(path)
            except OSError:  # removed by another rank meanwhile, or not ours to remove
                pass
    return removed


def hostname(env: Mapping[str, str] = os.environ) -> str:
    """This rank's host identity: HVDTORCH_HOSTNAME if set, else the real one.

    Ranks with the same host name share memory and count as one host for
    local_rank/local_size and the node reducer; setting it per launcher agent
    emulates several hosts on one machine.
    """
    import socket

    return env.get("HVDTORCH_HOSTNAME") or socket.gethostname()
