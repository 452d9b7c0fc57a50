"""Summaries of the Chrome traces hvdtorch writes (HVDTORCH_TIMELINE).

    python -m hvdtorch.timeline summarize trace.json [--plot out.png] [--json] [--top 10]
    python -m hvdtorch.timeline summarize trace-0.json trace-1.json --plot out.png   # one file per rank

A trace (see csrc/core/timeline/timeline.h) has one trace "process" per op
name and, for every op, begin/end pairs of its phases: NEGOTIATE, QUEUE,
MEMCPY_IN_FUSION, ALLREDUCE:<reducer> (or ALLGATHER, BROADCAST, ALLTOALL,
REDUCESCATTER), MEMCPY_OUT_FUSION. A DistributedModel adds FORWARD and BACKWARD under its own
name (hvdtorch/training/step_marks.py). From these the summary gives, per rank:

* per phase: how often, total time, time per step, and the share of the
  busy time of communication;
* steps: a step runs from one FORWARD begin to the next; their count and
  median / min / max duration (only complete steps count, so the time before
  the first forward, e.g. the initial broadcast, is outside every step);
* the slowest ops: one op from its NEGOTIATE begin to the end of its last
  phase, with the phase that took longest;
* the overlap of communication with backward: the time some op was copying
  or reducing (MEMCPY_*, the collective; not NEGOTIATE/QUEUE, which are
  waits), the part of it inside a BACKWARD interval, and the exposed rest.

Times in a trace are microseconds since that rank's engine started its
timeline, so files of different ranks are aligned at their starts only.
"""

import json
import os
import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

COMPUTE_PHASES = ("FORWARD", "BACKWARD")
WAIT_PHASES = ("NEGOTIATE", "QUEUE")


@dataclass
class Interval:
    op: str
    phase: str
    start_us: float
    end_us: float

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


@dataclass
class PhaseStats:
    phase: str
    count: int
    total_ms: float
    per_step_ms: Optional[float]
    share_of_comm: Optional[float]  # of the busy communication time (None for compute and wait phases)


@dataclass
class OpStats:
    op: str
    start_ms: float
    latency_ms: float
    slowest_phase: str
    slowest_phase_ms: float


@dataclass
class RankSummary:
    rank: int
    path: str
    span_ms: float
    steps: int
    step_ms_median: Optional[float]
    step_ms_mean: Optional[float]
    step_ms_min: Optional[float]
    step_ms_max: Optional[float]
    phases: List[PhaseStats]
    slowest_ops: List[OpStats]
    comm_busy_ms: float
    comm_in_backward_ms: float
    backward_ms: float
    overlap: Optional[float]  # comm_in_backward / comm_busy
    unmatched: int  # begins without end or ends without begin (a cut trace)
    intervals: List[Interval] = field(default_factory=list, repr=False)


def is_comm_busy(phase: str) -> bool:
    return phase not in COMPUTE_PHASES and phase not in WAIT_PHASES


def load_events(path: str) -> List[dict]:
    """The events of one trace file; a file cut short by a crash (no closing
    bracket, a trailing comma) is read up to its last complete event."""
    with open(path) as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    body = text.strip().rstrip("]").rstrip().rstrip(",")
    cut = body.rfind("}")
    try:
        if not body.startswith("["):
            raise json.JSONDecodeError("a trace is a JSON array", text, 0)
        return json.loads(body[: cut + 1] + "]") if cut >= 0 else []
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a Chrome trace written by hvdtorch ({e})") from None


def intervals_of(events: Iterable[dict]) -> Tuple[List[Interval], int]:
    """Pairs every begin with the next end of the same op and phase. Returns
    the intervals (by start) and how many begins or ends had no partner."""
    names: Dict[int, str] = {}
    open_begins: Dict[Tuple[int, str], List[float]] = {}
    out: List[Interval] = []
    unmatched = 0
    for e in events:
        ph = e.get("ph")
        if ph == "M" and e.get("name") == "process_name":
            names[e["pid"]] = e["args"]["name"]
        elif ph == "B":
            open_begins.setdefault((e["pid"], e["name"]), []).append(float(e["ts"]))
        elif ph == "E":
            stack = open_begins.get((e["pid"], e["name"]))
            if not stack:
                unmatched += 1
                continue
            start = stack.pop(0)
            out.append(Interval(names.get(e["pid"], f"pid {e['pid']}"), e["name"], start, float(e["ts"])))
    unmatched += sum(len(s) for s in open_begins.values())
    out.sort(key=lambda i: (i.start_us, i.end_us))
    return out, unmatched


def union_length(spans: Sequence[Tuple[float, float]]) -> float:
    total, cur_start, cur_end = 0.0, None, None
    for s, e in sorted(spans):
        if cur_end is None or s > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def merged(spans: Sequence[Tuple[float, float]]) -> List[Tuple[float, float]]:
    out: List[List[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def intersection_length(a: Sequence[Tuple[float, float]], b: Sequence[Tuple[float, float]]) -> float:
    a, b = merged(a), merged(b)
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _step_starts(intervals: List[Interval]) -> List[float]:
    """FORWARD begins of the model with the most forwards (one model drives the steps)."""
    by_model: Dict[str, List[float]] = {}
    for iv in intervals:
        if iv.phase == "FORWARD":
            by_model.setdefault(iv.op, []).append(iv.start_us)
    if not by_model:
        return []
    return sorted(max(by_model.values(), key=len))


def _ops(intervals: List[Interval]) -> List[OpStats]:
    """One op = the phases of one name from a NEGOTIATE begin to before the next."""
    by_name: Dict[str, List[Interval]] = {}
    for iv in intervals:
        if is_comm_busy(iv.phase) or iv.phase in WAIT_PHASES:
            by_name.setdefault(iv.op, []).append(iv)
    ops = []
    for name, ivs in by_name.items():
        current: List[Interval] = []
        for iv in ivs + [None]:
            if current and (iv is None or iv.phase == "NEGOTIATE"):
                slowest = max(current, key=lambda x: x.duration_us)
                ops.append(
                    OpStats(
                        name,
                        current[0].start_us / 1e3,
                        (max(x.end_us for x in current) - current[0].start_us) / 1e3,
                        slowest.phase,
                        slowest.duration_us / 1e3,
                    )
                )
                current = []
            if iv is not None:
                current.append(iv)
    return ops


def summarize_rank(path: str, rank: int, top: int = 10) -> RankSummary:
    intervals, unmatched = intervals_of(load_events(path))
    starts = _step_starts(intervals)
    step_durations = [b - a for a, b in zip(starts, starts[1:])]
    window = (starts[0], starts[-1]) if len(starts) > 1 else None
    steps = len(step_durations)

    totals: Dict[str, List[float]] = {}
    in_steps: Dict[str, float] = {}
    for iv in intervals:
        totals.setdefault(iv.phase, []).append(iv.duration_us)
        if window and window[0] <= iv.start_us < window[1]:
            in_steps[iv.phase] = in_steps.get(iv.phase, 0.0) + iv.duration_us
    busy_total = sum(sum(v) for k, v in totals.items() if is_comm_busy(k))
    phases = [
        PhaseStats(
            k,
            len(v),
            sum(v) / 1e3,
            in_steps.get(k, 0.0) / 1e3 / steps if steps else None,
            sum(v) / busy_total if busy_total and is_comm_busy(k) else None,
        )
        for k, v in totals.items()
    ]
    order = {p: i for i, p in enumerate(COMPUTE_PHASES + WAIT_PHASES)}
    phases.sort(key=lambda p: (order.get(p.phase, len(order)), -p.total_ms))

    comm = [(iv.start_us, iv.end_us) for iv in intervals if is_comm_busy(iv.phase)]
    backward = [(iv.start_us, iv.end_us) for iv in intervals if iv.phase == "BACKWARD"]
    comm_busy = union_length(comm)
    in_backward = intersection_length(comm, backward)
    span = (max(iv.end_us for iv in intervals) - min(iv.start_us for iv in intervals)) if intervals else 0.0
    ops = sorted(_ops(intervals), key=lambda o: -o.latency_ms)[:top]
    return RankSummary(
        rank=rank,
        path=path,
        span_ms=span / 1e3,
        steps=steps,
        step_ms_median=statistics.median(step_durations) / 1e3 if steps else None,
        step_ms_mean=statistics.fmean(step_durations) / 1e3 if steps else None,
        step_ms_min=min(step_durations) / 1e3 if steps else None,
        step_ms_max=max(step_durations) / 1e3 if steps else None,
        phases=phases,
        slowest_ops=ops,
        comm_busy_ms=comm_busy / 1e3,
        comm_in_backward_ms=in_backward / 1e3,
        backward_ms=union_length(backward) / 1e3,
        overlap=in_backward / comm_busy if comm_busy and backward else None,
        unmatched=unmatched,
        intervals=intervals,
    )


def rank_of_path(path: str, default: int) -> int:
    numbers = re.findall(r"\d+", os.path.basename(path))
    return int(numbers[-1]) if numbers else default


def summarize(paths: Sequence[str], top: int = 10) -> List[RankSummary]:
    """One summary per file; with several files the rank is the last number
    in each file name (trace-{rank}.json), else the file's position."""
    if len(paths) == 1:
        return [summarize_rank(paths[0], 0, top)]
    ranked = sorted(((rank_of_path(p, i), p) for i, p in enumerate(paths)))
    if len({r for r, _ in ranked}) != len(ranked):
        ranked = list(enumerate(paths))
    return [summarize_rank(p, r, top) for r, p in ranked]


def _ms(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3f}"


def format_summary(summaries: Sequence[RankSummary]) -> str:
    lines = []
    for s in summaries:
        lines.append(f"rank {s.rank}: {s.path}  ({s.span_ms:.1f} ms traced)")
        if s.steps:
            lines.append(
                f"  steps: {s.steps} complete; step time median {s.step_ms_median:.2f} ms, mean "
                f"{s.step_ms_mean:.2f} (min {s.step_ms_min:.2f}, max {s.step_ms_max:.2f}); ms/step below "
                "are means over the complete steps"
            )
        else:
            lines.append("  steps: none (no FORWARD marks: a DistributedModel writes them)")
        lines.append(f"  {'phase':<24} {'count':>6} {'total ms':>10} {'ms/step':>9} {'% of comm':>9}")
        for p in s.phases:
            share = "-" if p.share_of_comm is None else f"{p.share_of_comm * 100:.1f}"
            lines.append(f"  {p.phase:<24} {p.count:>6} {p.total_ms:>10.3f} {_ms(p.per_step_ms):>9} {share:>9}")
        if s.overlap is not None:
            lines.append(
                f"  communication busy {s.comm_busy_ms:.2f} ms, of which {s.comm_in_backward_ms:.2f} ms "
                f"({s.overlap * 100:.0f}%) inside backward ({s.backward_ms:.2f} ms); "
                f"exposed {s.comm_busy_ms - s.comm_in_backward_ms:.2f} ms"
            )
        else:
            lines.append(f"  communication busy {s.comm_busy_ms:.2f} ms (no BACKWARD marks: overlap unknown)")
        if s.slowest_ops:
            width = max(34, max(len(o.op) for o in s.slowest_ops))
            lines.append(f"  {'slowest ops':<{width + 2}} {'start ms':>9} {'latency ms':>11}  longest phase")
            for o in s.slowest_ops:
                lines.append(
                    f"    {o.op:<{width}} {o.start_ms:>9.2f} {o.latency_ms:>11.3f}  "
                    f"{o.slowest_phase} {o.slowest_phase_ms:.3f} ms"
                )
        if s.unmatched:
            lines.append(f"  note: {s.unmatched} begin/end events without a partner (trace cut short)")
        lines.append("")
    return "\n".join(lines)


def to_json(summaries: Sequence[RankSummary]) -> str:
    out = []
    for s in summaries:
        d = asdict(s)
        d.pop("intervals")
        out.append(d)
    return json.dumps(out, indent=1)
