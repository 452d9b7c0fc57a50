"""The modules' dotted names from before the subpackages (collectives/,
training/, zero/, integrations/), kept importable.

Contract: ``import hvdtorch.<old>`` and ``from hvdtorch.<old> import x``
give the very module object of the new path -- not a copy, not a re-export
-- so monkeypatching, isinstance checks and module-level state behave as
before. Horovod's module names that moved (``compression``, ``optimizer``,
``sync_batch_norm``) are served here too; ``mpi_ops``, ``functions`` and
``elastic`` did not move.

install(), at the end of hvdtorch/__init__.py, enters the old name of every
moved module already loaded into sys.modules, as the old modules stood there
after ``import hvdtorch``. That is what keeps ``hvd.broadcast``,
``hvd.alltoall`` and ``hvd.reducescatter`` the functions: an import that
loads a submodule sets it as an attribute of its package, which would replace
the function of the same name, while one found in sys.modules sets nothing.
The rest (the Lightning integration, which needs the optional ``lightning``)
a finder on sys.meta_path resolves on first import, never ahead of it. The
package's __getattr__ answers ``hvd.<old>`` with attribute().
tests/test_package_layout.py checks every name below.
"""

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Optional

# Old dotted name -> new one. Every module that was at hvdtorch's top level before the move.
ALIASES = {
    # Horovod's module names (horovod.torch.compression, .optimizer, .sync_batch_norm).
    "hvdtorch.compression": "hvdtorch.collectives.compression",
    "hvdtorch.optimizer": "hvdtorch.training.optimizer",
    "hvdtorch.sync_batch_norm": "hvdtorch.training.sync_batch_norm",
    # The collectives and what they share.
    "hvdtorch.ops": "hvdtorch.collectives.ops",
    "hvdtorch.alltoall": "hvdtorch.collectives.alltoall",
    "hvdtorch.reducescatter": "hvdtorch.collectives.reducescatter",
    "hvdtorch.broadcast": "hvdtorch.collectives.broadcast",
    "hvdtorch.sparse": "hvdtorch.collectives.sparse",
    "hvdtorch.handles": "hvdtorch.collectives.handles",
    "hvdtorch.process_sets": "hvdtorch.collectives.process_sets",
    "hvdtorch.process_set_table": "hvdtorch.collectives.process_set_table",
    # The training wrappers.
    "hvdtorch.distributed_model": "hvdtorch.training.distributed_model",
    "hvdtorch.gradient_sync": "hvdtorch.training.gradient_sync",
    "hvdtorch.adasum_optimizer": "hvdtorch.training.adasum_optimizer",
    "hvdtorch.buckets": "hvdtorch.training.buckets",
    "hvdtorch.parameter_names": "hvdtorch.training.parameter_names",
    "hvdtorch.step_marks": "hvdtorch.training.step_marks",
    # ZeRO sharding, once spelled shard_* and sharded_*.
    "hvdtorch.shard_layout": "hvdtorch.zero.layout",
    "hvdtorch.shard_state": "hvdtorch.zero.state",
    "hvdtorch.shard_join": "hvdtorch.zero.join",
    "hvdtorch.sharded_gradients": "hvdtorch.zero.gradients",
    "hvdtorch.sharded_optimizer": "hvdtorch.zero.optimizer",
    "hvdtorch.sharded_checkpoint": "hvdtorch.zero.checkpoint",
    # Integrations.
    "hvdtorch.lightning": "hvdtorch.integrations.lightning",
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old name by importing the new one and handing back that module."""

    def __init__(self, new_name: str):
        self._new_name = new_name
        self._own_spec = None

    def create_module(self, spec):
        module = importlib.import_module(self._new_name)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The module ran under its new name already. Between create_module and here the
        # import system set its __spec__ to the alias's (CPython does so unconditionally);
        # give it back its own, so that it still names its real file and name (reload, pickle).
        module.__spec__ = self._own_spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds the old names, and only them; every other import passes it by."""

    def find_spec(self, fullname, path=None, target=None):
        new_name = ALIASES.get(fullname)
        if new_name is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new_name))


def install() -> None:
    """Idempotent: one finder however often hvdtorch is imported or reloaded."""
    for old_name, new_name in ALIASES.items():
        if new_name in sys.modules:
            sys.modules.setdefault(old_name, sys.modules[new_name])
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder())


def attribute(name: str) -> Optional[ModuleType]:
    """``hvdtorch.<name>`` for an old name whose new module is loaded, else None.

    Loaded only: importing hvdtorch loads every moved module except the Lightning
    integration, so ``hvd.ops`` works as before the move, while ``hvd.lightning``
    stays what it was -- there after ``import hvdtorch.lightning``, an AttributeError
    before."""
    new_name = ALIASES.get(f"hvdtorch.{name}")
    return sys.modules.get(new_name) if new_name else None
