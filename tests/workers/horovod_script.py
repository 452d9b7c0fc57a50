"""Runs a script written for horovod.torch unchanged, with `horovod.torch`
resolving to hvdtorch (the script's only Horovod-specific line is its import)."""

import runpy
import sys
import types

import hvdtorch


def run(path: str):
    horovod = types.ModuleType("horovod")
    horovod.torch = hvdtorch
    sys.modules["horovod"] = horovod
    sys.modules["horovod.torch"] = hvdtorch
    runpy.run_path(path, run_name="__main__")
