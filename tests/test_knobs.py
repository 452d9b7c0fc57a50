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
