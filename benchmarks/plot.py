"""Plots and tables from the benchmark suite's JSON lines.

    python benchmarks/plot.py benchmarks/results/torchrun

Writes, next to the data: throughput_<setting>.png (img/s against workers,
with the ideal line: workers x the 1-process throughput),
breakdown_<setting>.png (per-iteration latency by phase at 2 ranks),
fusion.png (step time against fusion buffer size) and summary.md (the
tables quoted in BENCHMARKS.md: img/s, scaling efficiency, ratio to DDP).
"""

import json
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PHASES = ["data", "forward", "backward", "sync", "optim"]


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def baseline(rows):
    """1-process throughput: the bare model ("solo", or DDP, which at size 1
    runs the bare model); the median of the two when both ran."""
    import statistics

    one = [r["img_per_s"] for r in rows if r["ranks"] == 1 and r["config"] in ("solo", "ddp")]
    return statistics.median(one) if one else None


def throughput_plot(rows, setting, out):
    base = baseline(rows)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    by_cfg = defaultdict(list)
    for r in rows:
        by_cfg[r["config"]].append((r["ranks"], r["img_per_s"]))
    ranks = sorted({r["ranks"] for r in rows})
    if base:
        ax.plot(ranks, [base * n for n in ranks], "k:", label="ideal (N x 1 process)")
    for cfg, pts in sorted(by_cfg.items()):
        pts.sort()
        style = {"ddp": "--", "solo": ":"}.get(cfg, "-")
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            style,
            marker="o",
            ms=3,
            label=cfg + (" (no communication)" if cfg == "solo" else ""),
        )
    ax.set_xlabel("workers (processes, one thread each, on a 2-core machine)")
    ax.set_ylabel("images / s (all workers)")
    ax.set_title(f"throughput, setting '{setting}'")
    ax.set_xticks(ranks)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"throughput_{setting}.png"), dpi=110)
    plt.close(fig)


def breakdown_plot(rows, setting, out, ranks=2):
    sel = [r for r in rows if r["ranks"] == ranks]
    if not sel:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    bottom = [0.0] * len(sel)
    for ph in PHASES:
        vals = [r[f"{ph}_s"] * 1e3 for r in sel]
        ax.bar([r["config"] for r in sel], vals, bottom=bottom, label=ph)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("ms per iteration (median)")
    ax.set_title(f"latency breakdown, setting '{setting}', {ranks} ranks")
    ax.tick_params(axis="x", rotation=45, labelsize=7)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"breakdown_{setting}.png"), dpi=110)
    plt.close(fig)


def fusion_plot(rows, out):
    pts = sorted((int(r["config"].split(":")[1]), r["step_s"] * 1e3) for r in rows)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("fusion buffer (bytes)")
    ax.set_ylabel("step time (ms, median)")
    ax.set_title("fusion sweep: comm setting, 2 ranks, P+F")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "fusion.png"), dpi=110)
    plt.close(fig)


def table(rows, setting):
    base = baseline(rows)
    ranks = sorted({r["ranks"] for r in rows})
    cell = {(r["config"], r["ranks"]): r for r in rows}
    configs = sorted({r["config"] for r in rows}, key=lambda c: (c != "solo", c != "ddp", c))
    lines = [
        f"### setting `{setting}`",
        "",
        f"1-process throughput: {base:.1f} img/s" if base else "",
        "",
        "| config | " + " | ".join(f"{n} rank{'s' if n > 1 else ''}" for n in ranks) + " |",
        "|---|" + "---|" * len(ranks),
    ]
    for c in configs:
        parts = []
        for n in ranks:
            r = cell.get((c, n))
            if not r:
                parts.append("")
                continue
            ddp = cell.get(("ddp", n))
            eff = f", {r['img_per_s'] / (base * n) * 100:.0f}% of ideal" if base else ""
            solo = cell.get(("solo", n))
            vs = f", {r['img_per_s'] / ddp['img_per_s']:.2f}x DDP" if ddp and c not in ("ddp", "solo") and n > 1 else ""
            vs_solo = (
                f", {r['img_per_s'] / solo['img_per_s'] * 100:.0f}% of solo" if solo and c != "solo" and n > 1 else ""
            )
            parts.append(f"{r['img_per_s']:.1f}{eff}{vs}{vs_solo}")
        lines.append(f"| {c} | " + " | ".join(parts) + " |")
    return "\n".join(lines) + "\n"


def main():
    out = sys.argv[1]
    md = []
    for setting in ("compute", "small", "comm"):
        path = os.path.join(out, f"{setting}.jsonl")
        if not os.path.exists(path):
            continue
        rows = load(path)
        throughput_plot(rows, setting, out)
        breakdown_plot(rows, setting, out)
        md.append(table(rows, setting))
    fpath = os.path.join(out, "fusion.jsonl")
    if os.path.exists(fpath):
        rows = load(fpath)
        fusion_plot(rows, out)
        md.append(
            "### fusion sweep (comm, 2 ranks, P+F)\n\n| fusion bytes | step ms |\n|---|---|\n"
            + "\n".join(
                f"| {int(r['config'].split(':')[1])} | {r['step_s'] * 1e3:.1f} |"
                for r in sorted(rows, key=lambda r: int(r["config"].split(":")[1]))
            )
            + "\n"
        )
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
