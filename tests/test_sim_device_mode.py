"""The multi-process tests of the collectives, every reducer, the ops with
allocated outputs, join, sparse gradients, SyncBatchNorm, process sets, elastic state,
DistributedModel training and the sharded optimizer, with every tensor on the simulated device
(HVDTORCH_SIM_DEVICE=1): each op goes through the engine's device paths
(ready and completion events, staging through pinned memory) with the device
streams' random delays, and must give the CPU results exactly."""

import re

import pytest

from tests.harness import RanksFailed, run_ranks
from tests.workers.device_ring_faults import run_with_the_last_rank_killed

# Device calibration off: `auto` takes its rule's route, the same in every run.
# The calibration, which picks routes by measured time, has tests of its own.
SIM = {"HVDTORCH_SIM_DEVICE": "1", "HVDTORCH_DEVICE_CALIBRATION_BYTES": "0"}
SEGMENTS = {"HVDTORCH_STAGING_SEGMENT_BYTES": "4096"}

CASES = [
    # (worker check, its args, ranks, emulated hosts, extra environment)
    ("tests.workers.collectives:check_all", [], 2, None, {}),
    # Staged all-reduces by segments of 4 KiB: many collectives per unit, through the node reducer too.
    ("tests.workers.collectives:check_reducers", [], 3, None, {"HVDTORCH_SHM": "1", **SEGMENTS}),
    ("tests.workers.reducers:every_reducer", ["aab"], 3, list("aab"), SEGMENTS),
    ("tests.workers.alltoall:values", ["alltoall"], 3, None, {}),
    ("tests.workers.reducescatter:values", ["reducescatter"], 3, None, {}),
    ("tests.workers.join:check_collectives_with_joined_ranks", [], 3, None, {}),
    ("tests.workers.sparse:check_sparse_allreduce", [], 2, None, {}),
    ("tests.workers.sync_batch_norm:check_training_with_optimizer", [], 2, None, {}),
    ("tests.workers.process_sets:check_process_sets", [], 4, None, {}),
    ("tests.workers.zero:check_training", ["quick"], 2, None, {}),
    ("tests.workers.zero:check_join", [], 3, None, {}),
    ("tests.workers.zero3:check_training", ["quick"], 2, None, {}),
    # The GPU tests' own checks, on CPU tensors (they run on CUDA tensors in make gpu-check).
    ("tests.workers.gpu:check_collectives", ["cpu"], 1, None, {}),
    ("tests.workers.gpu:check_collectives", ["cpu"], 2, None, {}),
    # With the device ring there (and no calibration, so `auto` takes its rule): Adasum must still be staged.
    ("tests.workers.gpu:check_collectives", ["cpu"], 2, None, {"HVDTORCH_SIM_INTERPROCESS": "1"}),
    ("tests.workers.gpu:check_distributed_model", ["cpu"], 2, None, {}),
    ("tests.workers.gpu:check_sharded_optimizer", ["cpu"], 2, None, {}),
    ("tests.workers.training:check_distributed_model", ["quick"], 2, None, {}),
    # Interprocess devices: the `ring` cases take the device ring (`auto` the device group, Gloo here).
    ("tests.workers.training:check_distributed_model", ["quick"], 2, None, {"HVDTORCH_SIM_INTERPROCESS": "1"}),
]


def _id(case):
    module, function = case[0].split(":")
    interprocess = "-interprocess" if case[4].get("HVDTORCH_SIM_INTERPROCESS") else ""
    one_rank = "-1rank" if case[2] == 1 else ""
    return f"{module.rsplit('.', 1)[1]}.{function}{interprocess}{one_rank}"


@pytest.mark.parametrize("target,args,nranks,hosts,env", CASES, ids=[_id(c) for c in CASES])
def test_through_the_simulated_device(target, args, nranks, hosts, env):
    run_ranks(
        "tests.workers.sim_device:through_device",
        nranks,
        hosts=hosts,
        args=[target, *args],
        timeout=240,
        env={**SIM, **env},
    )


@pytest.mark.parametrize("nranks,slots", [(2, 4), (3, 1), (4, 2)], ids=["2", "3", "4"])
def test_the_device_ring(nranks, slots):
    # Small slots: many segments per chunk, each slot reused many times; few
    # of them, so a sender that did not wait for the slot's "acked" flag
    # would overwrite a segment its neighbour has not read.
    env = {
        **SIM,
        "HVDTORCH_SIM_INTERPROCESS": "1",
        "HVDTORCH_DEVICE_RING_SLOT_BYTES": "256",
        "HVDTORCH_DEVICE_RING_SLOTS": str(slots),
        "HVDTORCH_SIM_MAX_DELAY_US": "400",
    }
    run_ranks("tests.workers.sim_device:device_path", nranks, args=["ring"], timeout=240, env=env)


def test_the_device_ring_back_to_back():
    # Twelve all-reduces run back to back (submitted at once, fusion off)
    # while rank 1's device is 15 times slower than its peers': rank 0 ends
    # each all-reduce and starts writing the next into rank 1's slots while
    # rank 1 may still be reading the last segments of the one before, so
    # the result is right only if the slots are reused after rank 1's
    # stream wrote its "acked" flags (the segment numbers and the flags go
    # on from one all-reduce to the next). With equal devices that
    # interleaving almost never happens.
    env = {
        **SIM,
        "HVDTORCH_SIM_INTERPROCESS": "1",
        "HVDTORCH_DEVICE_RING_SLOT_BYTES": "256",
        "HVDTORCH_DEVICE_RING_SLOTS": "1",
        "HVDTORCH_SIM_MAX_DELAY_US": "400",
        "HVDTORCH_FUSION_THRESHOLD": "0",
    }
    slow = {1: {"HVDTORCH_SIM_MAX_DELAY_US": "6000"}}
    run_ranks("tests.workers.sim_device:back_to_back", 3, args=["12", "300"], timeout=240, env=env, rank_env=slow)


def test_a_rank_dying_in_the_device_ring_releases_its_peers():
    # Small slots and slow streams: the survivors' streams are likely waiting
    # on a flag of the dead rank's when it goes.
    env = {
        **SIM,
        "HVDTORCH_SIM_INTERPROCESS": "1",
        "HVDTORCH_DEVICE_RING_SLOT_BYTES": "4096",
        "HVDTORCH_SIM_MAX_DELAY_US": "2000",
    }
    run_with_the_last_rank_killed("cpu", env)
    # The killed rank's simulated device memory (shared-memory files, where a
    # GPU's memory goes with its process) is the test's to remove.
    _remove_dead_sim_segments()


def _remove_dead_sim_segments():
    import os

    for name in os.listdir("/dev/shm"):
        if not name.startswith("hvdtorch-sim-"):
            continue
        pid = int(name.split("-")[2])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os.unlink(os.path.join("/dev/shm", name))
        except PermissionError:
            pass


def test_each_rank_seeds_its_device_apart():
    run_ranks("tests.workers.sim_device:seeds_apart", 3, timeout=120, env=SIM)


def test_the_harness_draws_the_seed_and_names_it(monkeypatch):
    # Unset, HVDTORCH_SIM_SEED is drawn for each job (every run tries other
    # delays), and a failure names it so that the run can be repeated.
    monkeypatch.delenv("HVDTORCH_SIM_SEED", raising=False)
    seeds = []
    for _ in range(2):
        with pytest.raises(RanksFailed) as failed:
            run_ranks("tests.workers.sim_device:fails_naming_its_seed", 2, timeout=60)
        started = re.findall(r"started with HVDTORCH_SIM_SEED=(\d+)", str(failed.value))
        assert len(started) == 2 and started[0] == started[1], f"the ranks of one job got seeds {started}"
        assert f"HVDTORCH_SIM_SEED={started[0]} reruns it" in str(failed.value), str(failed.value)[:300]
        seeds.append(started[0])
    assert seeds[0] != seeds[1], f"two jobs got the same seed {seeds[0]}"
    # Set, it is every job's.
    monkeypatch.setenv("HVDTORCH_SIM_SEED", "77")
    with pytest.raises(RanksFailed) as failed:
        run_ranks("tests.workers.sim_device:fails_naming_its_seed", 1, timeout=60)
    assert "started with HVDTORCH_SIM_SEED=77" in str(failed.value)


@pytest.mark.parametrize("hosts,interprocess", [("aab", "1"), ("ab", "0")], ids=["aab-mapped-and-staged", "ab-staged"])
def test_the_device_ring_across_hosts(hosts, interprocess):
    # Links between emulated hosts stage through pinned host slots; "aab"
    # mixes them with a mapped link, "ab" has no interprocess memory at all.
    env = {
        **SIM,
        "HVDTORCH_SIM_INTERPROCESS": interprocess,
        "HVDTORCH_DEVICE_RING_SLOT_BYTES": "256",
        "HVDTORCH_SIM_MAX_DELAY_US": "400",
    }
    run_ranks(
        "tests.workers.sim_device:device_path", len(hosts), hosts=list(hosts), args=["ring"], timeout=240, env=env
    )


def test_auto_prefers_the_device_group_to_the_device_ring():
    env = {**SIM, "HVDTORCH_SIM_INTERPROCESS": "1"}
    run_ranks("tests.workers.sim_device:auto_prefers_the_device_group", 2, timeout=120, env=env)


@pytest.mark.parametrize(
    "costs,expect",
    [({"HVDTORCH_SIM_HOST_COPY_US": "5000"}, "ring"), ({"HVDTORCH_SIM_KERNEL_US": "10000"}, "not-ring")],
    ids=["slow-host-copies", "slow-kernels"],
)
def test_auto_calibrates_the_device_routes(costs, expect, tmp_path):
    env = {
        "HVDTORCH_TIMELINE": str(tmp_path / "trace-{rank}.json"),
        **SIM,
        "HVDTORCH_SIM_INTERPROCESS": "1",
        "HVDTORCH_SIM_MAX_DELAY_US": "0",
        "HVDTORCH_DEVICE_CALIBRATION_BYTES": "65536",
        **costs,
    }
    run_ranks("tests.workers.sim_device:auto_calibrated", 2, args=[expect], timeout=120, env=env)


def test_auto_stages_through_the_host_reducer_measured_fastest(tmp_path):
    env = {
        "HVDTORCH_TIMELINE": str(tmp_path / "trace-{rank}.json"),
        **SIM,
        "HVDTORCH_DEVICE_RING": "0",
        "HVDTORCH_SIM_MAX_DELAY_US": "0",
        "HVDTORCH_DEVICE_CALIBRATION_BYTES": "16384",
    }
    run_ranks("tests.workers.sim_device:auto_stages_through_the_fastest_host_reducer", 2, timeout=120, env=env)


def test_the_device_ring_turned_off():
    env = {**SIM, "HVDTORCH_SIM_INTERPROCESS": "1", "HVDTORCH_DEVICE_RING": "0"}
    run_ranks("tests.workers.sim_device:device_ring_turned_off", 2, timeout=120, env=env)


def test_the_device_group_across_hosts():
    # reducer="native" on device tensors: the device group (Gloo standing in for NCCL), across two hosts.
    env = {**SIM, "HVDTORCH_SIM_MAX_DELAY_US": "400"}
    run_ranks("tests.workers.sim_device:device_path", 3, hosts=list("aab"), args=["native"], timeout=240, env=env)


def test_every_reducer_with_interprocess_devices():
    # check_reducers runs every reducer per call: `ring` on the device ring, the others staged.
    env = {**SIM, "HVDTORCH_SIM_INTERPROCESS": "1", "HVDTORCH_SHM": "1"}
    run_ranks(
        "tests.workers.sim_device:through_device",
        3,
        args=["tests.workers.collectives:check_reducers"],
        timeout=240,
        env=env,
    )


def test_elastic_state_restores_through_the_simulated_device(tmp_path):
    # Commit, restore and sync of TorchState (broadcasts of model and optimizer state) on device memory.
    run_ranks(
        "tests.workers.sim_device:through_device",
        2,
        args=["tests.workers.elastic:check_restore", str(tmp_path / "commits")],
        timeout=120,
        env=SIM,
    )
