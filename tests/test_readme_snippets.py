"""The Lightning and Ray examples of docs/integrations.md run as written
(copied out of that file at test time, so the docs cannot drift from what works),
and the README's quickstart is examples/quickstart.py's code (which
tests/test_quickstart.py runs): its lines, in the file's order, and its launch lines."""

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


def _code(line: str) -> str:
    """A Python line without its comment and surrounding blanks (quickstart's comments hold no '  #')."""
    return line.split("  #")[0].strip()


def test_readme_quickstart_is_the_example_file():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    with open(os.path.join(ROOT, "examples", "quickstart.py")) as f:
        example = f.read()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    python, launch = re.findall(r"```(?:python|bash)\n(.*?)```", quickstart, re.S)[:2]
    file_lines = [_code(line) for line in example.splitlines()]
    shown = [_code(line) for line in python.splitlines() if _code(line) not in ("", "...")]
    assert len(shown) >= 20, python
    # Each line of the README block is a line of the file, in the file's order ("..." marks lines left out).
    at = 0
    for line in shown:
        assert line in file_lines[at:], f"README quickstart line not in examples/quickstart.py (in order): {line!r}"
        at = file_lines.index(line, at) + 1
    # The README's launch lines are the ones in the example's docstring, and they start the example.
    commands = [_code(line) for line in launch.splitlines() if _code(line)]
    assert commands and all("examples/quickstart.py" in c for c in commands), launch
    assert all(c in example for c in commands), (commands, example[:600])
