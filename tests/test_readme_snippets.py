"""The Lightning and Ray examples of docs/integrations.md run as written
(copied out of that file at test time, so the docs cannot drift from what works)."""

import os
import re
import subprocess
import sys

import pytest

from tests.harness import ROOT, free_port


def _snippet(first_line: str) -> str:
    """The ```python block of docs/integrations.md whose first line starts with `first_line`."""
    with open(os.path.join(ROOT, "docs", "integrations.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    found = [b for b in blocks if b.startswith(first_line)]
    assert len(found) == 1, f"docs/integrations.md has {len(found)} python blocks starting with {first_line!r}"
    return found[0]


def _run(cmd, cwd, timeout):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    return p.stdout


def test_lightning_example_runs_under_torchrun(tmp_path):
    pytest.importorskip("lightning", reason="lightning could not be installed here (make installs it)")
    (tmp_path / "lightning_example.py").write_text(_snippet("# lightning_example.py"))
    out = _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            f"--master_port={free_port()}",
            "lightning_example.py",
        ],
        tmp_path,
        300,
    )
    m = re.search(r"2 processes, val_acc ([0-9.]+)", out)
    assert m and float(m.group(1)) > 0.5, out  # learns the rule: well above chance (0.25)


def test_ray_example_runs(tmp_path):
    pytest.importorskip("ray", reason="ray could not be installed here (make test tries)")
    (tmp_path / "ray_example.py").write_text(_snippet("# ray_example.py"))
    out = _run([sys.executable, "ray_example.py"], tmp_path, 300)
    m = re.search(r"2 workers, loss ([0-9.]+)", out)
    assert m and float(m.group(1)) < 0.69, out  # below ln 2: it learned something
