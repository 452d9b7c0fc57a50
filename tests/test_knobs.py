"""Each HVDTORCH_* knob reaches the place that uses it, in the unit its
meaning states (tests/workers/knobs.py: the table of what reads each knob
back); the cycle time in the engine's behaviour too; the device ring's slot
size and count in the memory the ring takes."""

import pytest

import hvdtorch as hvd
from tests.harness import run_ranks
from tests.workers.knobs import NOT_PROBED, PROBES


def test_every_knob_is_probed_or_says_why_not():
    names = [name for name, _, _ in hvd.knobs()]
    assert sorted(PROBES) + sorted(NOT_PROBED) and not set(PROBES) & set(NOT_PROBED)
    assert set(PROBES) | set(NOT_PROBED) == set(names), (
        f"not in tests/workers/knobs.py: {sorted(set(names) - set(PROBES) - set(NOT_PROBED))}; "
        f"no such knob: {sorted(set(PROBES) | set(NOT_PROBED) - set(names))}"
    )


def test_each_knob_arrives_in_its_unit(tmp_path):
    env = {knob: value.format(tmp=tmp_path) for knob, (value, _, _) in PROBES.items()}
    run_ranks("tests.workers.knobs:values_arrive", 2, args=[str(tmp_path)], env=env, timeout=90)


@pytest.mark.parametrize("calibrate", ["1", "0"])
def test_init_calibrates_unless_told_not_to(calibrate):
    run_ranks(
        "tests.workers.knobs:calibration_ran", 2, args=[calibrate], env={"HVDTORCH_CALIBRATE": calibrate}, timeout=90
    )


def test_the_cycle_time_is_in_milliseconds():
    run_ranks(
        "tests.workers.knobs:late_rank_waits_for_the_cycle",
        2,
        args=["200"],
        env={"HVDTORCH_CYCLE_TIME": "200"},
        timeout=90,
    )


@pytest.mark.parametrize("slot_bytes,slots", [("50000", "3"), ("20580", "1")])
def test_the_device_ring_slots_follow_the_knobs(slot_bytes, slots):
    env = {
        "HVDTORCH_SIM_DEVICE": "1",
        "HVDTORCH_DEVICE_CALIBRATION_BYTES": "0",
        "HVDTORCH_SIM_INTERPROCESS": "1",
        "HVDTORCH_DEVICE_RING_SLOT_BYTES": slot_bytes,
        "HVDTORCH_DEVICE_RING_SLOTS": slots,
    }
    run_ranks("tests.workers.knobs:device_ring_inbox", 2, args=[slot_bytes, slots], env=env, timeout=90)


def test_bad_values_fail_init_naming_the_knob():
    run_ranks(
        "tests.workers.knobs:bad_values_refused_at_init",
        2,
        env={"HVDTORCH_TIMEOUTS": "5", "HVDTORCH_REDUCER": "ring"},
        timeout=90,
    )


def test_check_refuses_a_bad_reducer_and_aligns_the_table():
    import os
    import subprocess
    import sys

    from tests.harness import ROOT, launcher_free_env

    env = launcher_free_env()
    env.update(PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""), HVDTORCH_REDUCER="foo")
    p = subprocess.run(
        [sys.executable, "-m", "hvdtorch.check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert "HVDTORCH_REDUCER='foo'" in p.stdout and "PROBLEMS" in p.stdout, p.stdout
    env["HVDTORCH_REDUCER"] = "ring"
    p = subprocess.run(
        [sys.executable, "-m", "hvdtorch.check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stdout + p.stderr
    rows = p.stdout.split("\nknobs\n", 1)[1].split("\n\n", 1)[0].splitlines()
    starts = {len(row) - len(row[2:].split(None, 1)[1]) for row in rows if row.startswith("  HVDTORCH_")}
    assert len(starts) == 1, f"the knob table's value column is not aligned: {rows}"
