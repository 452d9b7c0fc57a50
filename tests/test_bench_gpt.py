"""benchmarks/gpt.py at its smallest: the GPT of --size test, 2 ranks under
torchrun, one round of one step per configuration (ddp, fsdp2, dm, shard3):
it prints its markdown table with the ratios to ddp and FSDP2 and exits 0.
One torchrun job (about 10 s on 2 quiet cores, 25 s on loaded ones): the
memory jobs (one more job per configuration) are left out for time."""

import json
import os
import signal
import subprocess
import sys

from tests.harness import ROOT, launcher_free_env

SCRIPT = os.path.join(ROOT, "benchmarks", "gpt.py")
DEADLINE = 120  # seconds


def run_bench(*args):
    """Runs the benchmark to its end or the deadline; returns its output. On
    the deadline its process group gets SIGTERM (torchrun passes it to the
    ranks), then SIGKILL, and the test fails with the output so far."""
    env = launcher_free_env()
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, SCRIPT, "--size", "test", "--ranks", "2", *args]
    p = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = p.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            out, _ = p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
        raise AssertionError(f"gpt.py did not finish within {DEADLINE} s\n{out[-6000:]}") from None
    assert p.returncode == 0, out[-6000:]
    return out


def table(out):
    """The markdown table's rows, each a list of cells; the header first."""
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines]


def test_throughput_table_has_the_ratios_to_ddp_and_fsdp2(tmp_path):
    path = tmp_path / "gpt.json"
    out = run_bench(
        "--configs", "ddp,fsdp2,dm,shard3", "--rounds", "1", "--iters", "1", "--warmup", "0", "--prime", "0",
        "--memory-rounds", "0", "--json", str(path),
    )  # fmt: skip
    head, *rows = table(out)
    assert head == ["config", "tokens/s", "vs ddp", "vs fsdp2", "loss"], out
    assert [r[0] for r in rows] == ["ddp", "fsdp2", "dm", "shard3"], out
    by = {r[0]: dict(zip(head, r)) for r in rows}
    assert by["ddp"]["vs ddp"] == "1.00" and by["fsdp2"]["vs fsdp2"] == "1.00", out
    for name in ("fsdp2", "dm", "shard3"):
        assert by[name]["vs ddp"].endswith("x") and float(by[name]["vs ddp"][:-1]) > 0, out
    with open(path) as f:
        report = json.load(f)
    assert report["settings"]["size"] == "test" and report["settings"]["ranks"] == 2
    losses = {r["config"]: r["loss"] for r in report["rows"]}
    assert all(r["tokens_per_s"] > 0 for r in report["rows"]), report
    # The same initial weights and tokens: one step in, every configuration has the same loss but for bf16 rounding.
    assert max(losses.values()) - min(losses.values()) < 0.05, losses
