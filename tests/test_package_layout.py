"""The package's layout (hvdtorch/__init__.py draws it): Horovod's module
names and the Lightning strategy's path are importable and are the very
module object of their real path (hvdtorch/_aliases.py), no other internal
path is aliased, every public ``hvd.<name>`` is there, and the top level
stays small."""

import importlib
import os
import subprocess
import sys

import pytest

from tests.harness import ROOT

# The module names a user may import: horovod.torch's (compression, elastic, functions, mpi_ops, optimizer,
# sync_batch_norm), the Lightning strategy's documented hvdtorch.lightning, and the tools run with -m.
USER_MODULES = [
    "check", "compression", "elastic", "functions", "lightning", "mpi_ops", "optimizer", "sync_batch_norm",
    "timeline",
]  # fmt: skip
# Internal paths from before the subpackages: no longer aliased.
RETIRED = ["ops", "sharded_optimizer", "distributed_model", "shard_layout", "process_sets"]

# What ``import hvdtorch as hvd`` offered before the move (the names bound in its __init__.py).
PUBLIC_NAMES = [
    "Adasum", "Average", "Compression", "DistributedModel", "DistributedOptimizer", "HorovodInternalError",
    "HostsUpdatedInterrupt", "HvdError", "InvalidArgumentError", "Max", "Min", "ProcessSet", "Product",
    "ShardedOptimizer", "Sum", "SyncBatchNorm", "__version__", "add_process_set", "allgather", "allgather_async",
    "allgather_object", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "alltoall",
    "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "ccl_built", "cross_rank",
    "cross_size", "cuda_built", "ddl_built", "elastic", "functions", "global_process_set", "gloo_built",
    "gloo_enabled", "grouped_allgather", "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async",
    "init", "is_homogeneous", "is_initialized", "join", "knobs", "local_rank", "local_size", "mpi_built",
    "mpi_enabled", "mpi_ops", "mpi_threads_supported", "nccl_built", "poll", "rank", "reducescatter",
    "reducescatter_async", "remove_process_set", "rocm_built", "shutdown", "size", "sparse_allreduce_async",
    "start_timeline", "stop_timeline", "synchronize",
]  # fmt: skip

MAX_TOP_LEVEL_MODULES = 12


def _aliases():
    from hvdtorch import _aliases

    return _aliases.ALIASES


def test_the_top_level_holds_at_most_twelve_modules():
    package = os.path.join(ROOT, "hvdtorch")
    modules = sorted(f for f in os.listdir(package) if f.endswith(".py"))
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, modules


def test_every_subpackage_is_a_regular_package():
    # setup.py's find_packages() installs only folders with an __init__.py.
    package = os.path.join(ROOT, "hvdtorch")
    for name in os.listdir(package):
        folder = os.path.join(package, name)
        if os.path.isdir(folder) and name != "__pycache__":
            assert os.path.isfile(os.path.join(folder, "__init__.py")), f"hvdtorch/{name}/ has no __init__.py"


def test_the_alias_table_covers_exactly_the_user_modules_that_moved():
    package = os.path.join(ROOT, "hvdtorch")
    still_there = {
        m
        for m in USER_MODULES
        if os.path.isfile(os.path.join(package, m + ".py")) or os.path.isdir(os.path.join(package, m))
    }
    assert set(_aliases()) == {f"hvdtorch.{m}" for m in USER_MODULES} - {f"hvdtorch.{m}" for m in still_there}
    for new in _aliases().values():
        path = os.path.join(ROOT, *new.split(".")) + ".py"
        assert os.path.isfile(path), f"{new}: no {os.path.relpath(path, ROOT)}"


@pytest.mark.parametrize("name", USER_MODULES)
def test_a_user_module_name_is_the_real_module(name):
    if name == "lightning":
        pytest.importorskip("lightning")  # the integration's optional dependency
    module = importlib.import_module(f"hvdtorch.{name}")
    real = _aliases().get(f"hvdtorch.{name}")
    if real is None:  # lives there
        assert module.__name__ == f"hvdtorch.{name}"
        return
    assert module is importlib.import_module(real)
    assert sys.modules[f"hvdtorch.{name}"] is module
    # The module keeps its own identity: its name, spec and file are the real path's.
    assert module.__name__ == real and module.__spec__.name == real
    assert module.__file__.endswith(os.path.join(*real.split(".")[1:]) + ".py")


@pytest.mark.parametrize("name", RETIRED)
def test_an_internal_path_is_not_aliased(name):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"hvdtorch.{name}")


def test_from_an_alias_import_gives_the_same_objects():
    import hvdtorch as hvd
    from hvdtorch.optimizer import DistributedOptimizer
    from hvdtorch.training import optimizer as training_optimizer

    assert DistributedOptimizer is training_optimizer.DistributedOptimizer is hvd.DistributedOptimizer


def test_every_public_name_is_still_there():
    import hvdtorch as hvd

    missing = [n for n in PUBLIC_NAMES if not hasattr(hvd, n)]
    assert not missing, missing


def test_hvd_dot_an_alias_is_the_module():
    import hvdtorch as hvd

    for alias, real in _aliases().items():
        name = alias.split(".", 1)[1]
        if name == "lightning":
            continue  # an attribute only once imported (a test below)
        assert getattr(hvd, name) is importlib.import_module(real), alias
    assert not hasattr(hvd, "no_such_module") and not hasattr(hvd, "sharded_optimizer")


def test_importing_hvdtorch_does_not_import_lightning():
    # The Lightning integration needs an optional dependency: an alias is resolved on first import only.
    code = (
        "import sys, hvdtorch as hvd\n"
        "assert 'hvdtorch.integrations.lightning' not in sys.modules\n"
        "assert not hasattr(hvd, 'lightning')\n"
        "print('ok')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


def test_import_hvdtorch_dot_lightning_registers_the_strategy():
    pytest.importorskip("lightning")
    code = (
        "import hvdtorch.lightning, hvdtorch.integrations.lightning as new\n"
        "assert hvdtorch.lightning is new\n"
        "from lightning.pytorch.strategies import StrategyRegistry\n"
        "assert 'hvdtorch' in StrategyRegistry\n"
        "print('ok')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr
