"""Runs another worker's check with every CPU tensor handed to the engine as
simulated-device memory (HVDTORCH_SIM_DEVICE=1, set by the test), then checks
that the device paths were taken and staged through pinned memory only."""

import importlib

import hvdtorch as hvd
from hvdtorch import _C


def through_device(target: str, *args: str) -> None:
    assert _C.sim_device_mode(), "HVDTORCH_SIM_DEVICE=1 did not reach the extension"
    module, function = target.split(":")
    getattr(importlib.import_module(module), function)(*args)
    unpinned = _C.sim_unpinned_engine_copies()
    assert unpinned == 0, f"rank {hvd.rank()}: {unpinned} engine copies went through unregistered host memory"
