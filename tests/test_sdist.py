"""The source distribution builds and works as a user would install it: the
sdist is made from this tree, checked to hold the CMake project and every
C++/CUDA source, built into a fresh venv that holds only the pinned torch (and
what installing needs), imported from outside the tree, and run as a 2-rank job
(`python -m hvdtorch.check` under torchrun all-reduces with every reducer and
checks the sums); a later `cmake --build` of its build folder, which would
update nothing Python imports, fails instead.

The sdist is unpacked under build/sdist-check/ and installed from there (what
`pip install hvdtorch-X.tar.gz` does in a temporary folder): a fixed place lets
ccache (CCACHE_BASEDIR, set by the Makefile) reuse the core's objects of
`make build`, so only the torch-including files compile again.
"""

import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(ROOT, "build", "sdist-check")


def pinned(requirement_file, name):
    with open(os.path.join(ROOT, requirement_file)) as f:
        for line in f:
            if re.match(rf"{name}==", line.strip()):
                return line.strip()
    raise AssertionError(f"{requirement_file} pins no {name}")


def run(cmd, timeout, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return p.stdout


@pytest.mark.timeout(1200)
def test_sdist_holds_the_sources_and_installs_into_a_fresh_venv():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", WORK, ROOT], 300, cwd=ROOT)
    (sdist,) = [f for f in os.listdir(WORK) if f.endswith(".tar.gz")]
    with tarfile.open(os.path.join(WORK, sdist)) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        tar.extractall(WORK, filter="data")
    tracked = run(["git", "ls-files", "csrc", "CMakeLists.txt", "setup.py", "pyproject.toml", "hvdtorch"], 60, cwd=ROOT)
    needed = [f for f in tracked.split() if not f.startswith("csrc/fuzz/corpus/")]
    assert not [f for f in needed if f not in names], "tracked build inputs missing from the sdist"

    venv = os.path.join(WORK, "venv")
    run([sys.executable, "-m", "venv", venv], 120)
    pip = [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    setuptools = run([sys.executable, "-c", "import setuptools; print(setuptools.__version__)"], 60).strip()
    run([*pip, pinned("requirements-dev.txt", "torch"), "numpy", f"setuptools=={setuptools}"], 600)
    source = os.path.join(WORK, sdist[: -len(".tar.gz")])
    env = dict(os.environ, MAX_JOBS=os.environ.get("MAX_JOBS", "2"))
    env.pop("HVDTORCH_BUILD_TESTS", None)  # a user's install: the extension and the core only
    env.pop("HVDTORCH_BUILD_DIR", None)
    run([*pip, "--no-build-isolation", "--no-deps", source], 900, env=env)

    python = os.path.join(venv, "bin", "python")
    outside = os.path.join(WORK, "elsewhere")
    os.makedirs(outside)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HVDTORCH_", "RANK", "WORLD_SIZE"))}
    where = run([python, "-c", "import hvdtorch, hvdtorch._C as c; print(c.__file__)"], 120, cwd=outside, env=env)
    assert where.startswith(venv), where
    out = run(
        [python, "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "hvdtorch.check"],
        300,
        cwd=outside,
        env=dict(env, OMP_NUM_THREADS="1", HVDTORCH_TIMEOUT="60"),
    )
    assert "job: 2 ranks" in out and "\nOK" in out, out

    # The install's build folder wrote into pip's temporary folder: a later rebuild of it would update
    # nothing Python imports, so it fails, saying so.
    os.utime(os.path.join(source, "csrc", "torch", "build_info.cpp"))
    rebuild = subprocess.run(
        ["cmake", "--build", os.path.join(source, "build", "cmake"), "--target", "hvdtorch_ext"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rebuild.returncode != 0 and "cmake cannot update" in rebuild.stdout + rebuild.stderr, rebuild
    shutil.rmtree(WORK)
