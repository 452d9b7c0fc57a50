"""Launcher detection, topology (with emulated hosts), init/shutdown, autograd.

Several real hosts (network namespaces, one torchrun agent each) are in test_hosts.py."""

import os
import subprocess
import sys

import pytest

from hvdtorch import launch
from tests.harness import ROOT, launcher_free_env, run_ranks


def test_detect_torchrun():
    info = launch.detect(
        {
            "RANK": "2",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1",
            "MASTER_ADDR": "h0",
            "MASTER_PORT": "29500",
        }
    )
    assert (info.launcher, info.rank, info.size, info.local_rank, info.local_size) == ("torchrun", 2, 4, 0, 2)
    assert (info.master_addr, info.master_port) == ("h0", 29500)


def test_detect_openmpi_single_host_needs_no_master():
    info = launch.detect(
        {
            "OMPI_COMM_WORLD_RANK": "1",
            "OMPI_COMM_WORLD_SIZE": "3",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
            "OMPI_MCA_ess_base_jobid": "77",
        }
    )
    assert (info.launcher, info.rank, info.size) == ("openmpi", 1, 3)
    assert info.single_host_by_launcher and "77" in info.job_key
    assert launch.file_store_path(info).endswith(".store")


def test_detect_mpich_and_slurm_and_single():
    m = launch.detect({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1"})
    assert (m.launcher, m.rank, m.size, m.local_rank) == ("mpich", 3, 4, 1)
    s = launch.detect({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NNODES": "2"})
    assert (s.launcher, s.rank, s.size, s.local_rank, s.local_size) == ("slurm", 5, 8, 1, None)
    assert launch.detect({}).launcher == "single"


def test_detect_rejects_garbage():
    with pytest.raises(ValueError, match="RANK"):
        launch.detect({"RANK": "x", "WORLD_SIZE": "2"})


def test_hostname_override():
    assert launch.hostname({"HVDTORCH_HOSTNAME": "node7"}) == "node7"


@pytest.mark.parametrize(
    "hosts,expected",
    [
        (["a", "a", "a", "a"], "0:0:4:0:1,1:1:4:0:1,2:2:4:0:1,3:3:4:0:1"),
        (["a", "a", "b", "b"], "0:0:2:0:2,1:1:2:0:2,2:0:2:1:2,3:1:2:1:2"),
        (["a", "b", "c", "d"], "0:0:1:0:4,1:0:1:1:4,2:0:1:2:4,3:0:1:3:4"),
    ],
)
def test_topology_follows_emulated_hosts(hosts, expected):
    run_ranks("tests.workers.runtime:topology", 4, hosts=hosts, args=[expected], timeout=90)


def test_reinit_and_idempotent_shutdown():
    run_ranks("tests.workers.runtime:reinit_and_idempotent_shutdown", 2, timeout=90)


def test_adopts_existing_default_group():
    run_ranks("tests.workers.runtime:adopt_existing_group", 2, timeout=90)


@pytest.mark.parametrize("nranks", [2, 3])
def test_autograd(nranks):
    run_ranks("tests.workers.runtime:autograd", nranks, timeout=90)


def test_torchrun_runs_the_checked_example():
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = subprocess.run(
        [torchrun, "--nproc_per_node=3", "examples/collectives.py"],
        cwd=ROOT,
        env=launcher_free_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 ranks, launcher torchrun" in out.stdout and "all results correct" in out.stdout


def test_mpirun_runs_the_checked_example_without_extra_environment():
    before = {f for f in os.listdir("/tmp") if f.startswith("hvdtorch-ompi")}
    out = subprocess.run(
        ["mpirun", "--oversubscribe", "-np", "3", sys.executable, "examples/collectives.py"],
        cwd=ROOT,
        env=launcher_free_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 ranks, launcher openmpi" in out.stdout and "all results correct" in out.stdout
    leftovers = [f for f in os.listdir("/tmp") if f.startswith("hvdtorch-ompi") and f not in before]
    assert not leftovers, f"rendezvous files left behind: {leftovers}"


def test_timeline_is_a_chrome_trace_with_every_phase(tmp_path):
    import json

    path = tmp_path / "timeline-{rank}.json"
    run_ranks("tests.workers.runtime:timeline", 2, args=[str(path)], env={"HVDTORCH_TIMELINE": str(path)}, timeout=90)
    for rank in (0, 1):
        events = json.loads((tmp_path / f"timeline-{rank}.json").read_text())
        names = {e["args"]["name"]: e["pid"] for e in events if e["ph"] == "M"}
        assert {"tl.single", "tl.grouped", "tl.gather", "tl.fused.0"} <= set(names), names
        phases = {(e["pid"], e["name"], e["ph"]) for e in events if e["ph"] in "BE"}
        for op in ("tl.single", "tl.grouped", "tl.fused.3"):
            for ph in ("NEGOTIATE", "QUEUE"):
                assert (names[op], ph, "B") in phases and (names[op], ph, "E") in phases, (op, ph)
            assert any(n.startswith("ALLREDUCE:") and pid == names[op] for pid, n, _ in phases), op
        assert (names["tl.gather"], "ALLGATHER", "E") in phases
        # Begin/end pairs balance per op and phase.
        for pid, n, _ in phases:
            b = sum(1 for e in events if e.get("pid") == pid and e["name"] == n and e["ph"] == "B")
            e_ = sum(1 for e in events if e.get("pid") == pid and e["name"] == n and e["ph"] == "E")
            assert b == e_, (pid, n, b, e_)


def test_file_stores_of_exited_launchers_are_removed(tmp_path):
    from hvdtorch import launch

    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid, live_pid = int(exited.stdout), os.getpid()
    names = {
        "dead": f"hvdtorch-ompi-1234-{dead_pid}.store",
        "dead_mpich": f"hvdtorch-pmi-kvs_5-{dead_pid}.store",
        "live": f"hvdtorch-ompi-1234-{live_pid}.store",
        "torchrun": f"hvdtorch-torchrun-none-127.0.0.1-{dead_pid}.store",  # not a FileStore of an MPI job
        "other": f"unrelated-{dead_pid}.store",
    }
    for name in names.values():
        (tmp_path / name).write_text("")
    removed = launch.remove_stale_file_stores(str(tmp_path))
    assert sorted(os.path.basename(p) for p in removed) == sorted([names["dead"], names["dead_mpich"]])
    assert sorted(os.listdir(tmp_path)) == sorted([names["live"], names["torchrun"], names["other"]])


@pytest.mark.parametrize("setting", ["auto", "off", "reversed"])
def test_engine_threads_are_placed_as_thread_affinity_says(setting):
    if setting == "reversed":  # an explicit list: local rank 0 on the last CPU, local rank 1 on the first
        cpus = sorted(os.sched_getaffinity(0))
        setting = f"{cpus[-1]},{cpus[0]}"
    run_ranks(
        "tests.workers.runtime:engine_threads_placed",
        2,
        env={"HVDTORCH_THREAD_AFFINITY": setting},
        args=[setting],
        timeout=90,
    )


def test_a_bad_thread_affinity_is_refused_by_every_rank_and_init_can_be_retried():
    # Too few CPUs for two local ranks: every rank refuses it in init(),
    # none waits for the others, and a second init() works.
    run_ranks(
        "tests.workers.runtime:refuses_thread_affinity",
        2,
        env={"HVDTORCH_THREAD_AFFINITY": "0"},
        args=["0"],
        timeout=90,
    )
