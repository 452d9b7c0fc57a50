"""python -m hvdtorch.timeline summarize: checked against the raw events of a real 2-rank trace."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hvdtorch.timeline.summary import load_events, summarize
from tests.harness import ROOT, run_ranks


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = tmp_path_factory.mktemp("timeline")
    run_ranks(
        "tests.workers.timeline:train_with_timeline",
        2,
        timeout=120,
        args=[str(out)],
        env={"HVDTORCH_TIMELINE": str(out / "trace-{rank}.json")},
    )
    paths = [str(out / f"trace-{r}.json") for r in range(2)]
    runs = [json.load(open(out / f"run-{r}.json")) for r in range(2)]
    return out, paths, runs


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "hvdtorch.timeline", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _raw(path):
    """Begin/end events by phase, straight from the file."""
    events = json.load(open(path))
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    return events, names


def _mask(events, wanted, length):
    """A microsecond raster of the time covered by begin/end pairs whose phase is `wanted`."""
    m = np.zeros(length, dtype=bool)
    begun = {}
    for e in sorted((e for e in events if e["ph"] in "BE" and wanted(e["name"])), key=lambda e: e["ts"]):
        key = (e["pid"], e["name"])
        if e["ph"] == "B":
            begun[key] = e["ts"]
        else:
            m[begun.pop(key) : e["ts"]] = True
    return m


def test_summary_matches_the_raw_events(traces):
    out, paths, runs = traces
    p = _cli("summarize", *reversed(paths), "--json", "--plot", str(out / "plot.png"), "--top", "4")
    assert p.returncode == 0, p.stdout + p.stderr
    summaries = json.loads(p.stdout[: p.stdout.rindex("]") + 1])
    assert [s["rank"] for s in summaries] == [0, 1]  # ranks from the file names, whatever the order given
    for s, path, run in zip(summaries, paths, runs):
        events, names = _raw(path)
        phases = {q["phase"]: q for q in s["phases"]}
        # totals and counts: sum of end stamps minus sum of begin stamps, per phase
        for phase in {e["name"] for e in events if e["ph"] == "B"}:
            begins = [e["ts"] for e in events if e["ph"] == "B" and e["name"] == phase]
            ends = [e["ts"] for e in events if e["ph"] == "E" and e["name"] == phase]
            assert phases[phase]["count"] == len(begins) == len(ends)
            assert phases[phase]["total_ms"] == pytest.approx((sum(ends) - sum(begins)) / 1e3, abs=1e-9)
        # every bucket reduced once per step, every forward and backward marked
        # (plus the wrap's own all-reduces: one that agrees the bucket order, a Min and a Max that check
        # every rank built the same model)
        reduced = [names.get(e["pid"], "") for e in events if e["ph"] == "B" and e["name"].startswith("ALLREDUCE:")]
        order_reductions = sum(1 for op in reduced if op.endswith(".bucket_order"))
        assert order_reductions == 1
        same_model = sum(1 for op in reduced if ".same_model." in op)
        assert same_model == 2
        reductions = sum(q["count"] for k, q in phases.items() if k.startswith("ALLREDUCE:"))
        assert reductions == run["steps"] * run["buckets"] + order_reductions + same_model
        assert run["buckets"] >= 3
        assert phases["FORWARD"]["count"] == phases["BACKWARD"]["count"] == run["steps"]
        assert s["steps"] == run["steps"] - 1
        forwards = sorted(e["ts"] for e in events if e["ph"] == "B" and e["name"] == "FORWARD")
        assert s["step_ms_median"] == pytest.approx(float(np.median(np.diff(forwards))) / 1e3)
        # overlap with backward, on a microsecond raster of the raw events
        length = max(e["ts"] for e in events if "ts" in e) + 1
        busy = _mask(events, lambda n: n not in ("FORWARD", "BACKWARD", "NEGOTIATE", "QUEUE"), length)
        backward = _mask(events, lambda n: n == "BACKWARD", length)
        assert s["comm_busy_ms"] == pytest.approx(busy.sum() / 1e3)
        assert s["comm_in_backward_ms"] == pytest.approx((busy & backward).sum() / 1e3)
        assert s["overlap"] == pytest.approx((busy & backward).sum() / busy.sum())
        # the head's bucket is reduced while backward sleeps before the first layer: the comparison above
        # covers a real overlap, not an empty one
        assert s["comm_in_backward_ms"] > 0 and s["overlap"] > 0
        # slowest ops: a real NEGOTIATE begin and a real end of that op, longest first
        ops = s["slowest_ops"]
        assert len(ops) == 4 and [o["latency_ms"] for o in ops] == sorted((o["latency_ms"] for o in ops), reverse=True)
        for o in ops:
            pid = next(k for k, v in names.items() if v == o["op"])
            start = round(o["start_ms"] * 1e3)
            assert any(
                e["ph"] == "B" and e["pid"] == pid and e["name"] == "NEGOTIATE" and e["ts"] == start for e in events
            )
            assert any(
                e["ph"] == "E" and e["pid"] == pid and e["ts"] == round(start + o["latency_ms"] * 1e3) for e in events
            )
        assert s["unmatched"] == 0
    png = (out / "plot.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def test_table_output(traces):
    _, paths, _ = traces
    p = _cli("summarize", paths[0])
    assert p.returncode == 0, p.stderr
    for text in (
        "rank 0:",
        "steps: 4 complete",
        "FORWARD",
        "BACKWARD",
        "NEGOTIATE",
        "ALLREDUCE:",
        "inside backward",
        "slowest ops",
    ):
        assert text in p.stdout


def test_cut_trace_and_bad_input(tmp_path):
    cut = tmp_path / "cut.json"
    cut.write_text(
        '[\n{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "x"}},\n'
        '{"name": "QUEUE", "ph": "B", "ts": 10, "pid": 1, "tid": 0},\n'
        '{"name": "QUEUE", "ph": "E", "ts": 25, "pid": 1, "tid": 0},\n'
        '{"name": "ALLREDUCE:ring", "ph": "B", "ts": 30, "pid": 1, "tid": 0},\n'
    )
    assert len(load_events(str(cut))) == 4
    (s,) = summarize([str(cut)])
    assert s.unmatched == 1 and s.steps == 0
    assert [(p.phase, p.count, p.total_ms) for p in s.phases] == [("QUEUE", 1, 0.015)]
    bad = tmp_path / "bad.json"
    bad.write_text("this is not json")
    p = _cli("summarize", str(bad))
    assert p.returncode == 2 and "bad.json" in p.stderr
    p = _cli("summarize", str(tmp_path / "missing.json"))
    assert p.returncode == 2 and "no such trace file" in p.stderr
