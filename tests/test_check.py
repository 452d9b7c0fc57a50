"""python -m hvdtorch.check: the report of one process, under torchrun, and of a broken build."""

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys

import hvdtorch
from tests.harness import ROOT, free_port
from tests.workers.common import registered_reducers

PY = sys.executable


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDTORCH_")}
    for k in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "SLURM_PROCID",
    ):
        env.pop(k, None)
    env.update({"PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"})
    env.update(extra)
    return env


def _run(args, env, timeout=120):
    return subprocess.run([PY, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _json_of(stdout):
    return json.loads(stdout[stdout.index("{") :])


def test_single_process_report_names_every_knob_and_its_source():
    env = _env(HVDTORCH_CYCLE_TIME="3", HVDTORCH_RING_WINDOW="2", HVDTORCH_TIMEOUT="45", HVDTORCH_TYPO="1")
    p = _run(["-m", "hvdtorch.check", "--json", "--option", "reducer=ring", "--option", "TIMEOUT=30"], env)
    assert p.returncode == 0, p.stdout + p.stderr
    r = _json_of(p.stdout)
    assert r["ok"] and r["problems"] == []
    assert r["versions"]["hvdtorch"] == hvdtorch.__version__
    assert r["versions"]["torch"] == __import__("torch").__version__
    assert r["shared_memory"]["ok"]
    assert r["launcher"] == "single" and "job" not in r
    # every knob the engine knows, once, in its order
    assert [k["name"] for k in r["knobs"]] == [name for name, _, _ in hvdtorch.knobs()]
    by_name = {k["name"]: k for k in r["knobs"]}
    assert (by_name["HVDTORCH_CYCLE_TIME"]["value"], by_name["HVDTORCH_CYCLE_TIME"]["source"]) == ("3", "environment")
    assert (by_name["HVDTORCH_RING_WINDOW"]["value"], by_name["HVDTORCH_RING_WINDOW"]["source"]) == ("2", "environment")
    assert (by_name["HVDTORCH_REDUCER"]["value"], by_name["HVDTORCH_REDUCER"]["source"]) == ("ring", "argument")
    # an argument wins over the environment, as in hvd.init(timeout=...)
    assert (by_name["HVDTORCH_TIMEOUT"]["value"], by_name["HVDTORCH_TIMEOUT"]["source"]) == ("30", "argument")
    defaults = {name: default for name, default, _ in hvdtorch.knobs()}
    assert by_name["HVDTORCH_CACHE_CAPACITY"]["source"] == "default"
    assert by_name["HVDTORCH_CACHE_CAPACITY"]["value"] == defaults["HVDTORCH_CACHE_CAPACITY"]
    assert r["unknown_environment"] == ["HVDTORCH_TYPO"]
    red = r["reducers"]
    assert set(registered_reducers()) <= set(red["available"])  # every reducer of the standard ops runs here
    assert set(red["auto_picks"].values()) <= set(red["available"])
    assert len(red["auto_picks"]) == 5
    assert red["settings_in_use"]["ring.window"] == 2  # read back from the ring reducer itself


def test_text_report_and_bad_knob_exit_status():
    p = _run(["-m", "hvdtorch.check"], _env())
    assert p.returncode == 0, p.stdout + p.stderr
    for section in ("versions", "build", "reducers", "auto picks", "knobs", "HVDTORCH_FUSION_THRESHOLD"):
        assert section in p.stdout
    assert p.stdout.rstrip().endswith("OK")
    bad = _run(["-m", "hvdtorch.check", "--option", "ring_window=many"], _env())
    assert bad.returncode == 1
    assert "PROBLEMS" in bad.stdout and "RING_WINDOW" in bad.stdout.upper()


def test_broken_build_exits_non_zero_naming_the_extension(tmp_path):
    # The package with an extension that does not load, as after a half-finished build (a file that is not
    # a shared object; a missing one would be found through an editable install of the real tree instead).
    shutil.copytree(
        os.path.dirname(hvdtorch.__file__), tmp_path / "hvdtorch", ignore=shutil.ignore_patterns("_C*", "__pycache__")
    )
    (tmp_path / "hvdtorch" / ("_C" + importlib.machinery.EXTENSION_SUFFIXES[0])).write_bytes(b"not an ELF file")
    env = _env()
    env["PYTHONPATH"] = str(tmp_path)
    p = subprocess.run([PY, "-m", "hvdtorch.check"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "hvdtorch._C cannot be loaded" in p.stderr


def test_under_torchrun_reports_every_rank_and_the_links():
    env = _env(HVDTORCH_TIMEOUT="60")
    p = _run(
        [
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            f"--master_port={free_port()}",
            "-m",
            "hvdtorch.check",
            "--json",
        ],
        env,
        timeout=240,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    r = _json_of(p.stdout)
    assert r["ok"], r["problems"]
    assert r["launcher"] == "torchrun"
    job = r["job"]
    assert job["size"] == 2
    ranks = sorted(job["ranks"], key=lambda x: x["rank"])
    assert [x["rank"] for x in ranks] == [0, 1]
    assert [x["local_rank"] for x in ranks] == [0, 1]
    assert ranks[0]["host"] == ranks[1]["host"]
    for x in ranks:
        assert set(x["allreduce"]) == set(r["reducers"]["available"])
        assert all(v == "ok" for v in x["allreduce"].values()), x
    # one host: the peers talk through shared memory
    assert ranks[0]["links"] == {"1": ["shm"]} and ranks[1]["links"] == {"0": ["shm"]}
