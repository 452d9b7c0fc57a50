"""torch.compiler.disable for hvdtorch's own frames, applied once
torch._dynamo is loaded.

A few of hvdtorch's functions must run eagerly under torch.compile
(DistributedModel's forward and its bookkeeping: compiled_model.py says
why), which torch.compiler.disable says. But torch.compiler.disable
imports torch._dynamo, about 2 s on a CPU, and hvdtorch would pay it at
import on every rank of every launch. So a function is marked with
``disabled_when_compiled`` where it is defined, and the marks are applied
(the attribute replaced by torch.compiler.disable's wrapper) as soon as
torch._dynamo has been imported by anyone: torch.compile, an optimizer's
constructor (torch.optim imports it), or hvdtorch's own compiled-autograd
check. Dynamo cannot trace a frame before it is imported, so no frame of
ours is ever traced unmarked.

Contract:
  * ``disabled_when_compiled(recursive=...)`` decorates a method (marked
    through __set_name__: the class attribute is replaced) or a module-level
    function (its module attribute is replaced: callers must reach it as
    ``module.function``, not by a name imported before the mark).
  * install() (hvdtorch/__init__.py) applies the marks at once if
    torch._dynamo is already loaded, else arranges that its import applies
    them (a sys.meta_path finder that wraps the module's loader, removed
    once used).
"""

import importlib.abc
import importlib.machinery
import sys
from typing import Callable, List, Tuple

# (owner: a class or a module, attribute name, recursive) of every mark, in definition order.
_marks: List[Tuple[object, str, bool]] = []
_applied = False


def _apply() -> None:
    global _applied
    if _applied:
        return
    _applied = True
    import torch

    for owner, name, recursive in _marks:
        fn = getattr(owner, name)
        setattr(owner, name, torch.compiler.disable(fn, recursive=recursive))


class _Mark:
    """A method's mark until its class is made (__set_name__ records it)."""

    def __init__(self, fn: Callable, recursive: bool):
        self._fn, self._recursive = fn, recursive

    def __set_name__(self, owner, name: str) -> None:
        setattr(owner, name, self._fn)
        _marks.append((owner, name, self._recursive))
        if _applied:
            import torch

            setattr(owner, name, torch.compiler.disable(self._fn, recursive=self._recursive))

    def __call__(self, *args, **kwargs):  # a module-level function (no __set_name__): plain
        return self._fn(*args, **kwargs)


def disabled_when_compiled(fn=None, *, recursive: bool = True):
    """torch.compiler.disable(fn, recursive=recursive), applied once
    torch._dynamo is loaded (see the top)."""

    def mark(f):
        if "." in f.__qualname__:  # a method: marked when its class is made
            return _Mark(f, recursive)
        module = sys.modules[f.__module__]
        _marks.append((module, f.__name__, recursive))
        if _applied:
            import torch

            return torch.compiler.disable(f, recursive=recursive)
        return f

    return mark(fn) if fn is not None else mark


class _AfterDynamo(importlib.abc.MetaPathFinder):
    """Finds torch._dynamo as the other finders would, and applies the marks
    once its module has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _apply()

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    if "torch._dynamo" in sys.modules:
        _apply()
    elif not any(isinstance(f, _AfterDynamo) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterDynamo())
