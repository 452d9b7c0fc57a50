"""benchmarks/cluster.py's harness at its smallest: two emulated hosts of one
rank, links shaped, one window each of the ceiling and the node reducer; and
that a stopped run leaves no namespace behind."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import netns

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "cluster.py")

pytestmark = pytest.mark.skipif(bool(netns.unavailable_reason()), reason=f"{netns.unavailable_reason()}")


def leftovers(pid):
    """Namespaces and /etc/netns files that the run with this pid made and left."""
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    names = [line.split()[0] for line in r.stdout.splitlines() if line.split()]
    names += os.listdir(netns.NETNS_ETC) if os.path.isdir(netns.NETNS_ETC) else []
    return [n for n in names if n.startswith(f"{netns.PREFIX}{pid}-")]


def start(out, *args):
    cmd = [sys.executable, SCRIPT, "--hosts", "2", "--ranks-per-host", "1", "--horovod", "off", "--out", str(out)]
    return subprocess.Popen(cmd + list(args), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_one_round_counts_the_bytes_and_removes_the_hosts(tmp_path):
    """The rows say what the window measured: the node reducer's hosts each
    sent about the hierarchical floor (one rank per host: the whole exchange
    is on the wire), the ceiling's nearly nothing."""
    p = start(
        tmp_path,
        "--rates",
        "1gbit",
        "--configs",
        "solo,dm:node",
        "--rounds",
        "1",
        "--iters",
        "1",
        "--prime",
        "0",
        "--warmup",
        "0",
    )
    out, _ = p.communicate(timeout=240)
    assert p.returncode == 0, out
    assert leftovers(p.pid) == []
    with open(tmp_path / "cluster.jsonl") as f:
        rows = {r["config"]: r for r in map(json.loads, f)}
    assert set(rows) == {"solo", "dm:node"}, rows
    floor = rows["dm:node"]["floor_bytes_per_host_step"]
    assert floor == rows["dm:node"]["grad_bytes"]  # 2 (H-1)/H G with H = 2
    assert 0.98 * floor <= rows["dm:node"]["bytes_per_host_step"] <= 1.1 * floor, rows["dm:node"]
    assert rows["solo"]["bytes_per_host_step"] < 0.01 * floor, rows["solo"]
    assert all(r["img_per_s"] > 0 and r["rate"] == "1gbit" for r in rows.values())
    assert "1gbit links, 2 hosts x 1 ranks" in out


def test_sigterm_removes_the_hosts(tmp_path):
    p = start(tmp_path, "--rates", "1gbit", "--configs", "solo", "--rounds", "1000")
    try:
        deadline = time.monotonic() + 60
        while len(leftovers(p.pid)) < 3:  # the hub and two hosts
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()[0]
            time.sleep(0.2)
        time.sleep(2)  # the agents are starting inside the namespaces
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0, out
    assert leftovers(p.pid) == [], out
