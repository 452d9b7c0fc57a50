"""The package's layout (hvdtorch/__init__.py draws it) and what the move into
subpackages had to keep: every dotted name a module had before is importable
and is the very module object of its new path (hvdtorch/_aliases.py), every
``hvd.<name>`` is still there, and the top level stays small."""

import importlib
import os
import subprocess
import sys

import pytest

from tests.harness import ROOT

# Every module at hvdtorch's top level before the subpackages, as users may have imported them.
OLD_MODULES = [
    "adasum_optimizer", "alltoall", "autotune", "broadcast", "buckets", "check", "compression",
    "distributed_model", "elastic", "exceptions", "functions", "gradient_sync", "handles", "launch",
    "lightning", "mpi_ops", "ops", "optimizer", "parameter_names", "process_set_table", "process_sets",
    "reducescatter", "runtime", "shard_join", "shard_layout", "shard_state", "sharded_checkpoint",
    "sharded_gradients", "sharded_optimizer", "sparse", "step_marks", "sync_batch_norm", "timeline",
]  # fmt: skip

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


def test_the_alias_table_covers_exactly_the_moved_modules():
    package = os.path.join(ROOT, "hvdtorch")
    still_there = {
        m
        for m in OLD_MODULES
        if os.path.isfile(os.path.join(package, m + ".py")) or os.path.isdir(os.path.join(package, m))
    }
    assert set(_aliases()) == {f"hvdtorch.{m}" for m in OLD_MODULES} - {f"hvdtorch.{m}" for m in still_there}
    for new in _aliases().values():
        path = os.path.join(ROOT, *new.split(".")) + ".py"
        assert os.path.isfile(path), f"{new}: no {os.path.relpath(path, ROOT)}"


@pytest.mark.parametrize("old", OLD_MODULES)
def test_an_old_dotted_name_is_the_new_module(old):
    if old == "lightning":
        pytest.importorskip("lightning")  # the integration's optional dependency
    module = importlib.import_module(f"hvdtorch.{old}")
    new = _aliases().get(f"hvdtorch.{old}")
    if new is None:  # did not move
        assert module.__name__ == f"hvdtorch.{old}"
        return
    assert module is importlib.import_module(new)
    assert sys.modules[f"hvdtorch.{old}"] is module
    # The module keeps its own identity: its name, spec and file are the new path's.
    assert module.__name__ == new and module.__spec__.name == new
    assert module.__file__.endswith(os.path.join(*new.split(".")[1:]) + ".py")


def test_from_an_old_name_import_gives_the_same_objects():
    import hvdtorch as hvd
    from hvdtorch.collectives.ops import allreduce as new_allreduce
    from hvdtorch.ops import allreduce
    from hvdtorch.sharded_optimizer import ShardedOptimizer
    from hvdtorch.zero import optimizer as zero_optimizer

    assert allreduce is new_allreduce is hvd.allreduce
    assert ShardedOptimizer is zero_optimizer.ShardedOptimizer is hvd.ShardedOptimizer


def test_every_public_name_is_still_there():
    import hvdtorch as hvd

    missing = [n for n in PUBLIC_NAMES if not hasattr(hvd, n)]
    assert not missing, missing


def test_hvd_dot_an_old_module_is_the_new_module():
    # Before the move, importing hvdtorch left its submodules as attributes (hvd.ops, ...).
    import hvdtorch as hvd

    for old, new in _aliases().items():
        name = old.split(".", 1)[1]
        if name == "lightning":
            continue  # an attribute only once imported, as before (a test below)
        if name in PUBLIC_NAMES:
            continue  # hvd.broadcast, hvd.alltoall, hvd.reducescatter: the functions, as before
        assert getattr(hvd, name) is importlib.import_module(new), old
    assert not hasattr(hvd, "no_such_module")


def test_importing_an_old_module_keeps_the_function_of_its_name():
    # hvd.broadcast, hvd.alltoall and hvd.reducescatter are functions named like modules of old.
    code = (
        "import hvdtorch.broadcast, hvdtorch.alltoall, hvdtorch.reducescatter\n"
        "from hvdtorch.broadcast import broadcast_object\n"
        "import hvdtorch as hvd\n"
        "from hvdtorch.collectives import ops, alltoall, reducescatter\n"
        "assert hvd.broadcast is ops.broadcast and hvd.alltoall is alltoall.alltoall\n"
        "assert hvd.reducescatter is reducescatter.reducescatter\n"
        "assert broadcast_object is hvd.broadcast_object\n"
        "print('ok')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


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
