"""The plot of `python -m hvdtorch.timeline summarize ... --plot out.png`.

Top: a Gantt strip per rank over the last few complete steps (or the whole
trace without step marks): one lane for compute (FORWARD, BACKWARD), one for
the busy phases of communication (copies into and out of the fusion buffer,
the collective), one for the waits (NEGOTIATE, QUEUE; many ops wait at once).
Bottom: per rank, a stacked bar of the time per step in each compute and busy
communication phase, next to the mean step time. Overlapping phases make
the stack taller than the step: the height above the step line is overlap.
"""

from typing import Dict, List, Sequence

from .summary import COMPUTE_PHASES, WAIT_PHASES, RankSummary, is_comm_busy

STEPS_SHOWN = 3


def _phase_group(phase: str) -> str:
    return phase.split(":")[0]


def _colors(phases: Sequence[str]) -> Dict[str, str]:
    fixed = {
        "FORWARD": "#4c72b0",
        "BACKWARD": "#55a868",
        "NEGOTIATE": "#c8c8c8",
        "QUEUE": "#8c8c8c",
        "MEMCPY_IN_FUSION": "#dd8452",
        "MEMCPY_OUT_FUSION": "#937860",
        "ALLREDUCE:ring": "#c44e52",
        "ALLREDUCE:node": "#8c1c13",
        "ALLREDUCE:central": "#e5ae38",
        "ALLREDUCE:native": "#b07aa1",
        "ALLGATHER": "#8172b3",
        "BROADCAST": "#da8bc3",
        "ALLTOALL": "#ccb974",
        "REDUCESCATTER": "#8da0cb",
    }
    spare = ["#64b5cd", "#6d904f", "#fc4f30", "#17becf", "#bcbd22"]
    out, unknown = {}, 0
    for p in phases:
        color = fixed.get(p) or fixed.get(_phase_group(p))
        if color is None:
            color, unknown = spare[unknown % len(spare)], unknown + 1
        out[p] = color
    return out


def _window(s: RankSummary):
    forwards = sorted(iv.start_us for iv in s.intervals if iv.phase == "FORWARD")
    if len(forwards) > STEPS_SHOWN:
        return forwards[-STEPS_SHOWN - 1], forwards[-1]
    if s.intervals:
        return min(iv.start_us for iv in s.intervals), max(iv.end_us for iv in s.intervals)
    return 0.0, 1.0


def plot(summaries: List[RankSummary], out_path: str):
    """Writes the figure to ``out_path`` and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    phases = sorted(
        {iv.phase for s in summaries for iv in s.intervals},
        key=lambda p: (0 if p in COMPUTE_PHASES else 2 if p in WAIT_PHASES else 1, p),
    )
    colors = _colors(phases)
    lanes = [("compute", lambda p: p in COMPUTE_PHASES), ("comm", is_comm_busy), ("wait", lambda p: p in WAIT_PHASES)]
    fig, (gantt, bars) = plt.subplots(
        2,
        1,
        figsize=(11, 3.0 + 1.1 * len(summaries) + 3.2),
        gridspec_kw={"height_ratios": [1.1 * len(summaries) + 0.6, 3.2]},
    )

    yticks, ylabels = [], []
    for row, s in enumerate(summaries):
        lo, hi = _window(s)
        for k, (lane, wanted) in enumerate(lanes):
            y = row * (len(lanes) + 1) + k
            spans = [
                ((iv.start_us - lo) / 1e3, iv.duration_us / 1e3, colors[iv.phase])
                for iv in s.intervals
                if wanted(iv.phase) and iv.end_us > lo and iv.start_us < hi
            ]
            if spans:
                gantt.broken_barh(
                    [(a, b) for a, b, _ in spans],
                    (y - 0.4, 0.8),
                    facecolors=[c for _, _, c in spans],
                    alpha=0.55 if lane == "wait" else 1.0,
                    linewidth=0,
                )
            yticks.append(y)
            ylabels.append(f"rank {s.rank} {lane}")
    gantt.set_yticks(yticks, ylabels)
    gantt.invert_yaxis()
    gantt.set_xlabel("ms (from the start of the window)")
    shown = f"last {STEPS_SHOWN} steps" if any(s.steps >= STEPS_SHOWN for s in summaries) else "whole trace"
    gantt.set_title(f"timeline per rank ({shown})")
    gantt.legend(
        handles=[Patch(color=colors[p], label=p) for p in phases],
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
    )

    stacked = [p for p in phases if p not in WAIT_PHASES]
    x = list(range(len(summaries)))
    bottoms = [0.0] * len(summaries)
    for p in stacked:
        heights = []
        for s in summaries:
            stat = next((q for q in s.phases if q.phase == p), None)
            heights.append(
                stat.per_step_ms
                if stat and stat.per_step_ms is not None
                else (stat.total_ms if stat and not s.steps else 0.0)
            )
        bars.bar(x, heights, bottom=bottoms, color=colors[p], label=p, width=0.5)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for i, s in enumerate(summaries):
        if s.step_ms_mean is not None:
            bars.hlines(s.step_ms_mean, i - 0.35, i + 0.35, colors="black", linestyles="dashed")
            bars.text(i + 0.37, s.step_ms_mean, f"step {s.step_ms_mean:.1f} ms", va="center", fontsize=8)
    bars.set_xticks(
        x,
        [
            f"rank {s.rank}" + (f"\n{s.overlap * 100:.0f}% of comm in backward" if s.overlap is not None else "")
            for s in summaries
        ],
    )
    bars.set_xlim(-0.7, len(summaries) - 0.3 + 0.6)
    bars.set_ylim(0, max(bottoms + [s.step_ms_mean or 0 for s in summaries]) * 1.25 or 1)
    unit = "ms per step" if any(s.steps for s in summaries) else "ms (whole trace)"
    bars.set_ylabel(unit)
    bars.set_title("mean time per step in each phase (stacked; dashed: mean step time)")
    bars.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return fig
