"""Rank side of tests/test_knobs.py: each HVDTORCH_* knob reaches the part
of the engine (or of the Python side) that uses it, in the unit its meaning
(hvd.knobs()) states: a value set in the environment is read back where it
is used, converted into that place's unit.

PROBES: knob -> (the value the test sets, what reads it back on a rank, the
value expected there). NOT_PROBED: every other knob, with the test that
covers it or why nothing reads it back; the test checks that the two cover
hvd.knobs() exactly, so a new knob must be put in one of them."""

import os
import time

import torch

import hvdtorch as hvd
from hvdtorch import _C, runtime

# Names of the probes a rank runs (probe_<name> below).
PROBES = {
    # seconds: the deadline torch.distributed's groups get (the engine's is the same number)
    "HVDTORCH_TIMEOUT": ("37", "group_timeout_s", 37.0),
    # milliseconds: the control thread's cycle (its own getter reads it in ms)
    "HVDTORCH_CYCLE_TIME": ("3", "cycle_time_ms", 3.0),
    # bytes
    "HVDTORCH_FUSION_THRESHOLD": ("123456", "fusion_threshold", 123456),
    # 0: every cycle through rank 0, none settled by the bitwise-AND exchange
    "HVDTORCH_DECENTRALIZED": ("0", "decentralized_cycles", 0),
    # 0: no shared-memory link between the two ranks of one host
    "HVDTORCH_SHM": ("0", "shm_links", 0),
    # the timeline file, written once the job runs an op
    "HVDTORCH_TIMELINE": ("{tmp}/timeline.json", "timeline_written", True),
    # the autotune knobs, as the Python side reads them (hvdtorch/autotune.py)
    "HVDTORCH_AUTOTUNE_WARMUP_STEPS": ("3", "autotune_warmup_steps", 3),
    "HVDTORCH_AUTOTUNE_STEPS_PER_TRIAL": ("7", "autotune_steps_per_trial", 7),
    "HVDTORCH_AUTOTUNE_ROUNDS": ("4", "autotune_rounds", 4),
    "HVDTORCH_AUTOTUNE_LOG": ("{tmp}/autotune.csv", "autotune_log", "{tmp}/autotune.csv"),
    "HVDTORCH_SIM_DEVICE": ("0", "sim_device_mode", False),
    # Read back from the engine's parts (engine.settings_in_use(): each from the part that runs with it)
    "HVDTORCH_CACHE_CAPACITY": ("77", "cache_capacity", 77),
    # bytes, in every reducer that runs a ring (ring, native's fallback, node's cross-host phase) and central's
    "HVDTORCH_RING_SEGMENT_BYTES": ("65536", "segment_bytes_in_use", [65536]),
    "HVDTORCH_RING_WINDOW": ("3", "ring_windows_in_use", [3]),
    "HVDTORCH_STAGING_SEGMENT_BYTES": ("3145728", "staging_segment_bytes", 3145728),
    "HVDTORCH_CENTRAL_SHARDS": ("2", "central_shards", 2),
    # bytes the output pool keeps (csrc/torch/output_pool.h)
    "HVDTORCH_OUTPUT_POOL_BYTES": ("4194304", "output_pool_limit", 4194304),
    # 0: init measures nothing (the cost model has no sample at 16 and 64 KiB, which init measures otherwise)
    "HVDTORCH_CALIBRATE": ("0", "calibrated_at_init", False),
    # the simulated device's own options (made on first use, whether or not tensors go through it)
    "HVDTORCH_SIM_SEED": ("12345", "sim_seed", 12345),
    "HVDTORCH_SIM_MAX_DELAY_US": ("37", "sim_max_delay_us", 37),
    "HVDTORCH_SIM_HOST_COPY_US": ("11", "sim_host_copy_us", 11),
    "HVDTORCH_SIM_KERNEL_US": ("13", "sim_kernel_us", 13),
}

NOT_PROBED = {
    "HVDTORCH_STALL_CHECK_TIME": "tests/test_errors.py: the stall warning after 1 s, the timeout after 6 s",
    "HVDTORCH_REDUCER": "the default reducer of every all-reduce: tests/test_reducers.py",
    "HVDTORCH_DEVICE_RING": "tests/test_sim_device_mode.py::test_the_device_ring_turned_off",
    "HVDTORCH_DEVICE_RING_SLOT_BYTES": "test_knobs.py::test_the_device_ring_slots_follow_the_knobs",
    "HVDTORCH_DEVICE_RING_SLOTS": "test_knobs.py::test_the_device_ring_slots_follow_the_knobs",
    "HVDTORCH_DEVICE_CALIBRATION_BYTES": "tests/test_sim_device_mode.py::test_auto_calibrates_the_device_routes",
    "HVDTORCH_THREAD_AFFINITY": "tests/test_runtime.py and csrc/tests/test_thread_placement.cc",
    "HVDTORCH_HOSTNAME": "the harness emulates hosts with it: tests/test_reducers.py and others",
    "HVDTORCH_AUTOTUNE": "tests/test_autotune.py",
    "HVDTORCH_SIM_INTERPROCESS": "the device ring's tests on the simulated device",
    "HVDTORCH_ELASTIC_DIR": "tests/test_elastic.py",
}


def probe_group_timeout_s():
    return runtime.state().group_timeout.total_seconds()


def probe_cycle_time_ms():
    return runtime.state().engine.cycle_time_ms()


def probe_output_pool_limit():
    return _C.output_pool_stats()["limit_bytes"]


def probe_fusion_threshold():
    return runtime.state().engine.fusion_threshold()


def probe_decentralized_cycles():
    for _ in range(5):  # the same op again and again: cached, settled without rank 0 where allowed
        hvd.allreduce(torch.ones(2), name="knobs.cached")
    return runtime.state().engine.negotiation_stats()["decentralized"]


def probe_shm_links():
    kinds = runtime.state().engine.link_kinds()
    return sum(1 for peer_kinds in kinds.values() for k in peer_kinds if "shm" in str(k).lower())


def probe_timeline_written():
    hvd.allreduce(torch.ones(2), name="knobs.timeline")
    hvd.stop_timeline()  # closes the file
    if hvd.rank() != 0:
        return True  # rank 0 writes it
    path = os.environ["HVDTORCH_TIMELINE"]
    deadline = time.monotonic() + 10
    while not (os.path.exists(path) and os.path.getsize(path) > 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.path.exists(path) and os.path.getsize(path) > 0


def _resolved(key):
    return _C.resolve_options(dict(runtime.state().options))[key]


def probe_autotune_warmup_steps():
    return _resolved("autotune_warmup_steps")


def probe_autotune_steps_per_trial():
    return _resolved("autotune_steps_per_trial")


def probe_autotune_rounds():
    return _resolved("autotune_rounds")


def probe_autotune_log():
    return _resolved("autotune_log")


def probe_sim_device_mode():
    return bool(_C.sim_device_mode())


def _in_use():
    return runtime.state().engine.settings_in_use()


def probe_cache_capacity():
    return _in_use()["cache_capacity"]


def probe_segment_bytes_in_use():
    """Every reducer's ring or server segment (distinct values): one value
    when the knob reached them all."""
    got = _in_use()
    assert "ring.segment_bytes" in got and "central.segment_bytes" in got, got
    return sorted({v for k, v in got.items() if k.endswith("segment_bytes") and k != "staging_segment_bytes"})


def probe_ring_windows_in_use():
    got = _in_use()
    assert "ring.window" in got, got
    return sorted({v for k, v in got.items() if k.endswith("window")})


def probe_staging_segment_bytes():
    return _in_use()["staging_segment_bytes"]


def probe_central_shards():
    return _in_use()["central.shards"]


def probe_calibrated_at_init():
    """Whether init() timed the reducers: samples in the cost model's 16 and
    64 KiB bands, which only calibration fills in this test (its other
    probes send a few bytes)."""
    bands = [row for row in runtime.state().engine.reducer_choices() if row["bytes"] in (16 << 10, 64 << 10)]
    assert len(bands) == 2, bands
    return any(n > 0 for row in bands for n in row["samples"].values())


def probe_sim_seed():
    return _C.sim_device_options()["seed"]


def probe_sim_max_delay_us():
    return _C.sim_device_options()["max_delay_us"]


def probe_sim_host_copy_us():
    return _C.sim_device_options()["host_copy_us"]


def probe_sim_kernel_us():
    return _C.sim_device_options()["kernel_us"]


def values_arrive(tmp: str) -> None:
    """Every probe of PROBES on this rank, with the test's environment."""
    hvd.init()
    wrong = []
    for knob, (_, probe, want) in PROBES.items():
        if isinstance(want, str):
            want = want.format(tmp=tmp)
        got = globals()[f"probe_{probe}"]()
        if got != want:
            wrong.append(f"{knob}={os.environ.get(knob)!r}: {probe} reads {got!r}, expected {want!r}")
    assert not wrong, f"rank {hvd.rank()}:\n  " + "\n  ".join(wrong)
    hvd.shutdown()


def late_rank_waits_for_the_cycle(cycle_ms: str) -> None:
    """The unit of HVDTORCH_CYCLE_TIME in the engine's behaviour: a rank with
    an op waiting runs a negotiation cycle every cycle_time, so rank 1,
    submitting the same op some time after rank 0, waits for rank 0's next
    cycle: on average half a cycle, far above a millisecond for a cycle of
    `cycle_ms` ms (read as microseconds, or as nothing, it would be about a
    millisecond)."""
    hvd.init()
    cycle = float(cycle_ms) / 1000.0
    waits = []
    for i in range(6):
        hvd.allreduce(torch.ones(1), name=f"knobs.align.{i}")
        if hvd.rank() == 1:
            time.sleep(1.5 * cycle)
        t0 = time.monotonic()
        hvd.allreduce(torch.ones(1), name=f"knobs.late.{i}")
        waits.append(time.monotonic() - t0)
    if hvd.rank() == 1:
        mean = sum(waits) / len(waits)
        print(f"rank 1 waited {[round(w * 1000, 1) for w in waits]} ms for its ops (cycle {cycle_ms} ms)", flush=True)
        assert mean > cycle / 10, f"rank 1 waited {mean * 1000:.2f} ms on average: the cycle is not {cycle_ms} ms"
        assert max(waits) < 10 * cycle + 2.0, (
            f"rank 1 waited {max(waits):.2f} s: the cycle is longer than {cycle_ms} ms"
        )
    hvd.shutdown()


def device_ring_inbox(slot_bytes: str, slots: str) -> None:
    """On the simulated device with interprocess memory (each allocation a
    /dev/shm file of its own, its size page-rounded, one page more for the
    open count): after an all-reduce through the device ring, this rank's
    device memory holds the ring's inbox, `slots` slots of `slot_bytes`
    bytes and 256 bytes of flags (algorithms/device_ring.cc)."""
    assert _C.sim_device_mode()
    hvd.init()
    before = _C.device_ring_runs()
    got = hvd.allreduce(torch.full((3000,), float(hvd.rank() + 1)), op=hvd.Sum, name="knobs.ring", reducer="ring")
    assert torch.equal(got, torch.full((3000,), float(sum(range(1, hvd.size() + 1)))))
    assert _C.device_ring_runs() > before, "the all-reduce did not take the device ring"
    page = os.sysconf("SC_PAGESIZE")
    inbox = int(slots) * int(slot_bytes) + 256
    want = (inbox + page - 1) // page * page + page
    prefix = f"hvdtorch-sim-{os.getpid()}-m"
    sizes = sorted(os.path.getsize(os.path.join("/dev/shm", f)) for f in os.listdir("/dev/shm") if f.startswith(prefix))
    assert want in sizes, (
        f"rank {hvd.rank()}: no device memory of {want} bytes (the inbox of {slots} slots of {slot_bytes} bytes); "
        f"this rank's allocations: {sizes}"
    )
    hvd.shutdown()


def calibration_ran(expected: str) -> None:
    """probe_calibrated_at_init in both directions: the table sets
    HVDTORCH_CALIBRATE=0 and expects no samples; here the default must leave
    some, or that probe could not tell the knob from a calibration that
    never measures."""
    hvd.init()
    assert probe_calibrated_at_init() == (expected == "1"), runtime.state().engine.reducer_choices()
    hvd.shutdown()


def bad_values_refused_at_init() -> None:
    """A bad knob fails init() on every rank, naming the variable, its value
    and what it takes, before any collective; an option that is no knob names
    the closest one; a corrected init() then works."""
    import warnings

    for options, words in (
        ({"reducer": "foo"}, ["HVDTORCH_REDUCER='foo'", "expected one of auto, ring"]),
        ({"timeout": "0"}, ["HVDTORCH_TIMEOUT='0'", "expected a positive number"]),
        ({"fusion_threshold": "lots"}, ["HVDTORCH_FUSION_THRESHOLD='lots'", "expected a non-negative number"]),
        ({"shm": "maybe"}, ["HVDTORCH_SHM='maybe'", "expected a boolean (0 or 1)"]),
        ({"timout": "3"}, ["init(timout=...)", "did you mean timeout= (HVDTORCH_TIMEOUT)"]),
    ):
        try:
            hvd.init(**options)
        except ValueError as e:
            text = str(e)
            assert text.startswith("hvdtorch: ") and all(w in text for w in words), (options, text)
        else:
            raise AssertionError(f"init({options}) was accepted")
        assert not hvd.is_initialized()
    # A variable that is no knob: warned about once, naming the closest knob; it changes nothing.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hvd.init()
        hvd.shutdown()
        hvd.init()
    said = [str(w.message) for w in caught if "HVDTORCH_TIMEOUTS" in str(w.message)]
    assert len(said) == 1 and "did you mean HVDTORCH_TIMEOUT?" in said[0], [str(w.message) for w in caught]
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == hvd.size()
    hvd.shutdown()
