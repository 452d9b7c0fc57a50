"""`import hvdtorch` loads nothing heavy beyond torch itself (a fresh
interpreter each): not torch._dynamo (about 2 s on a CPU; hvdtorch's
torch.compiler.disable marks wait for it, training/compile_marks.py), not
the plotting, integration or launcher libraries. What it costs in seconds is
measured in BENCHMARKS.md ("Import"), not here: a timed test on loaded cores
would fail now and then."""

import os
import subprocess
import sys

from tests.harness import ROOT

HEAVY = ["torch._dynamo", "sympy", "matplotlib", "lightning", "pytorch_lightning", "ray", "mpi4py", "torchvision"]


def _run(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_import_loads_nothing_heavy():
    out = _run(f"import sys, hvdtorch; print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    assert out.strip() == "[]", f"import hvdtorch loaded {out.strip()}"


def test_compile_marks_apply_once_dynamo_loads():
    # Loaded after hvdtorch (a torch optimizer's constructor loads it), and before: the frames that must run
    # eagerly under torch.compile carry torch.compiler.disable's mark either way.
    check = (
        "from hvdtorch.training import compiled_model, step_marks;"
        "fns = [hvdtorch.DistributedModel.forward, hvdtorch.DistributedModel._before_forward,"
        " step_marks.StepMarks.forward, compiled_model.begin_bucketed_graphs, compiled_model.end_bucketed_graphs];"
        "print([getattr(f, '_torchdynamo_disable', False) for f in fns])"
    )
    after = _run(
        "import sys, torch, hvdtorch; assert 'torch._dynamo' not in sys.modules;"
        "torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1); assert 'torch._dynamo' in sys.modules;" + check
    )
    assert after.strip() == str([True] * 5), after
    before = _run("import torch._dynamo, hvdtorch;" + check)
    assert before.strip() == str([True] * 5), before
    unmarked = _run("import sys, hvdtorch;" + check)
    assert unmarked.strip() == str([False] * 5), unmarked
