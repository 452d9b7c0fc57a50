"""The Python package keeps its layers: no import cycle (imports inside
function bodies count) and no module importing one above it
(tools/import_graph.py holds the layers and the graph); the torch adapter
(csrc/torch) includes no algorithm of the core."""

import os
import subprocess
import sys

from tests.harness import ROOT


def test_no_import_cycle_and_no_upward_import():
    p = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "import_graph.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_check_sees_an_import_hidden_in_a_function(tmp_path):
    # A package shaped like ours where runtime imports ops inside a function: upward, and a cycle.
    pkg = tmp_path / "hvdtorch"
    (pkg / "collectives").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .collectives import ops\n")
    (pkg / "runtime.py").write_text("def init():\n    from .collectives import ops\n    return ops\n")
    (pkg / "collectives" / "__init__.py").write_text("")
    (pkg / "collectives" / "ops.py").write_text("from .. import _C, runtime\n")
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import import_graph
    finally:
        sys.path.pop(0)
    edges = import_graph.graph(str(pkg))
    ops = "hvdtorch.collectives.ops"
    assert edges["hvdtorch.runtime"] == {ops} and edges[ops] == {"hvdtorch.runtime"}
    found = import_graph.problems(edges)
    assert f"upward import: hvdtorch.runtime (layer 1) imports {ops} (layer 4)" in found
    assert f"import cycle: {ops} -> hvdtorch.runtime" in found


def test_the_torch_adapter_includes_no_algorithm():
    """csrc/torch converts types and asks the engine; which reducer or route
    runs is the core's answer (the router, ReducerSet::forRequest), so no
    file of the adapter includes a header of csrc/core/algorithms/."""
    torch_dir = os.path.join(ROOT, "csrc", "torch")
    found = []
    for folder, _, files in os.walk(torch_dir):
        for f in files:
            path = os.path.join(folder, f)
            with open(path) as src:
                for n, line in enumerate(src, 1):
                    if line.startswith("#include") and '"algorithms/' in line:
                        found.append(f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}")
    assert os.path.isdir(torch_dir) and not found, "\n".join(found)
