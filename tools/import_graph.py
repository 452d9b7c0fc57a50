#!/usr/bin/env python3
"""The import graph of the hvdtorch package, and the rule it must follow.

    python tools/import_graph.py            # every module with the package modules it imports, then problems
    python tools/import_graph.py --check    # exit 1 on an import cycle or an upward import

Imports anywhere in a file count, inside function bodies too (an import moved
into a function to dodge a cycle is still the cycle). The compiled extension
``hvdtorch._C`` is a leaf and is left out.

The package is layered bottom-up (LAYERS); a module may import modules of its
own layer or below, never above, and no cycle may form inside a layer.
Modules not listed are features (layer FEATURES), the package itself is on top.
tests/test_import_layers.py runs --check.
"""

import ast
import os
import sys
from typing import Dict, List, Set

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "hvdtorch")

# Bottom-up. 0: leaves that know no hvdtorch state; 1: process state and hooks; 2: what a process set is;
# 3: the handle table and what every op shares; 4-5: the ops (collectives/); FEATURES: what is built on
# the ops (collectives/process_set_table, training/, zero/, elastic/, integrations/).
LAYERS = {
    "hvdtorch._aliases": 0,
    "hvdtorch.launch": 0,
    "hvdtorch.knob_names": 0,  # which HVDTORCH_* variables are knobs: _C's list and Python's
    "hvdtorch.exceptions": 0,
    "hvdtorch.collectives.compression": 0,
    "hvdtorch.collectives.own_state": 0,
    "hvdtorch.collectives.powersgd": 0,  # the compressor object; its algorithm is in _C
    "hvdtorch.training.parameter_names": 0,
    "hvdtorch.training.buckets": 0,
    "hvdtorch.training.step_marks": 0,
    "hvdtorch.training.compiled_model": 0,  # DistributedModel under torch.compile: torch only
    "hvdtorch.training.compile_marks": 0,  # torch.compiler.disable once torch._dynamo loads: torch only
    "hvdtorch.timeline.summary": 0,
    "hvdtorch.timeline.plot": 0,
    "hvdtorch.runtime": 1,
    "hvdtorch.process_groups": 1,  # the torch.distributed groups init() makes and shutdown() destroys
    "hvdtorch.collectives.process_sets": 2,
    "hvdtorch.collectives.handles": 3,
    "hvdtorch.collectives.ops": 4,
    "hvdtorch.collectives.alltoall": 5,
    "hvdtorch.collectives.reducescatter": 5,
    "hvdtorch.collectives.broadcast": 5,
    "hvdtorch.collectives.sparse": 5,
    "hvdtorch.timeline": 5,
}
FEATURES = 6
TOP = 7  # the package (hvdtorch/__init__.py) and what imports or re-exports all of it
TOP_MODULES = {
    "hvdtorch",
    "hvdtorch.mpi_ops",
    "hvdtorch.functions",
    "hvdtorch.check",
    "hvdtorch.integrations.lightning",
    "hvdtorch.timeline.__main__",
}


def modules(package: str = PACKAGE) -> Dict[str, str]:
    found = {}
    top = os.path.dirname(package)
    for folder, dirs, files in os.walk(package):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, top)[:-3].replace(os.sep, ".")
                found[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return found


def graph(package: str = PACKAGE) -> Dict[str, Set[str]]:
    mods = modules(package)
    edges: Dict[str, Set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            targets: List[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [a.name for a in node.names if a.name != "_C"]  # the compiled extension: a leaf
                if not names:
                    continue
                subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in mods]
                targets = subs or [target]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t in mods and t != mod:
                    edges[mod].add(t)
    return edges


def layer(mod: str) -> int:
    if mod in TOP_MODULES:
        return TOP
    return LAYERS.get(mod, FEATURES)


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def problems(edges: Dict[str, Set[str]]) -> List[str]:
    out = [f"import cycle: {' -> '.join(c)}" for c in cycles(edges)]
    for mod in sorted(edges):
        for target in sorted(edges[mod]):
            if layer(target) > layer(mod):
                out.append(f"upward import: {mod} (layer {layer(mod)}) imports {target} (layer {layer(target)})")
    return out


def main() -> int:
    edges = graph()
    if "--check" not in sys.argv[1:]:
        for mod in sorted(edges, key=lambda m: (layer(m), m)):
            print(f"{layer(mod)} {mod}: {', '.join(sorted(edges[mod])) or '-'}")
    found = problems(edges)
    print("\n".join(found) if found else "no import cycle, no upward import")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
