"""Horovod's module names that live elsewhere here, kept importable:
``hvdtorch.compression``, ``hvdtorch.optimizer`` and
``hvdtorch.sync_batch_norm`` (horovod.torch's ``compression``,
``optimizer``, ``sync_batch_norm``), and ``hvdtorch.lightning``, the
Lightning strategy's documented path. ``mpi_ops``, ``functions`` and
``elastic`` are modules of their own at the top level. Other internal
paths are not aliased: import from the subpackages.

Contract: ``import hvdtorch.<alias>`` and ``from hvdtorch.<alias> import x``
give the very module object of the real path -- not a copy, not a
re-export -- so monkeypatching, isinstance checks and module-level state
behave as one module.

install(), at the end of hvdtorch/__init__.py, enters the alias of every
module already loaded into sys.modules. The rest (the Lightning
integration, which needs the optional ``lightning``) a finder on
sys.meta_path resolves on first import, never ahead of it. The package's
__getattr__ answers ``hvd.<alias>`` with attribute().
tests/test_package_layout.py checks every name below.
"""

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Optional

# Alias -> the module's real dotted name.
ALIASES = {
    # Horovod's module names (horovod.torch.compression, .optimizer, .sync_batch_norm).
    "hvdtorch.compression": "hvdtorch.collectives.compression",
    "hvdtorch.optimizer": "hvdtorch.training.optimizer",
    "hvdtorch.sync_batch_norm": "hvdtorch.training.sync_batch_norm",
    # The Lightning strategy, as README and docs/integrations.md name it.
    "hvdtorch.lightning": "hvdtorch.integrations.lightning",
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an alias by importing the real name and handing back that module."""

    def __init__(self, new_name: str):
        self._new_name = new_name
        self._own_spec = None

    def create_module(self, spec):
        module = importlib.import_module(self._new_name)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The module ran under its real name already. Between create_module and here the
        # import system set its __spec__ to the alias's (CPython does so unconditionally);
        # give it back its own, so that it still names its real file and name (reload, pickle).
        module.__spec__ = self._own_spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds the aliases, and only them; every other import passes it by."""

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
    """``hvdtorch.<name>`` for an alias whose module is loaded, else None.

    Loaded only: importing hvdtorch loads every aliased module except the Lightning
    integration, so ``hvd.optimizer`` is there at once, while ``hvd.lightning`` is
    there after ``import hvdtorch.lightning``, an AttributeError before."""
    new_name = ALIASES.get(f"hvdtorch.{name}")
    return sys.modules.get(new_name) if new_name else None
