"""The training table from benchmarks/run_training.sh's JSON lines.

    python benchmarks/training_table.py benchmarks/results/training

Reads <dir>/<launcher>/<setting>.jsonl (rows of benchmarks/googlenet.py) and
prints Markdown: per launcher and world size, img/s of hvdtorch, Horovod,
DDP and solo (median [min-max] over rounds) and hvdtorch's ratio to each
(ratios of medians). World sizes above the core count are labelled as
oversubscription; the 2-rank tables come first.
"""

import json
import os
import sys

SETTING_LABELS = {
    "comm": "comm-heavy (FC-heavy net, 32 px, batch 8)",
    "compute": "compute-heavy (GoogLeNet, 64 px, batch 16)",
    "small": "GoogLeNet, 32 px, batch 8",
}
PEERS = [("horovod", "Horovod 0.28.1 (MPI)"), ("ddp", "DDP (Gloo)"), ("solo", "no communication (solo)")]


def load(root):
    rows = []
    for launcher in sorted(os.listdir(root)):
        d = os.path.join(root, launcher)
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            if name.endswith(".jsonl"):
                with open(os.path.join(d, name)) as f:
                    rows += [dict(json.loads(line), launcher_dir=launcher) for line in f if line.strip()]
    return rows


def cell(r):
    return f"{r['img_per_s']:.1f} [{r['img_per_s_min']:.1f}-{r['img_per_s_max']:.1f}]"


def table(rows, launcher, ranks):
    sel = [r for r in rows if r["launcher_dir"] == launcher and r["ranks"] == ranks]
    cores = sel[0].get("cores") or 0
    over = f", oversubscribed: {ranks} ranks on {cores} cores" if cores and ranks > cores else ""
    first = sel[0]
    model = next((f" GoogLeNet: {r['model']}." for r in sel if r["setting"] != "comm"), "")
    lines = [
        f"### {launcher}, {ranks} ranks{over}",
        "",
        f"img/s, median [min-max] of {first['rounds']} interleaved rounds of {first['iters']} steps; "
        f"ratios of medians.{model}",
        "",
        "| setting | hvdtorch | "
        + " | ".join(label for _, label in PEERS)
        + " | "
        + " | ".join(f"hvdtorch / {peer}" for peer, _ in PEERS)
        + " |",
        "|---" * (2 + 2 * len(PEERS)) + "|",
    ]
    for setting in [s for s in SETTING_LABELS if any(r["setting"] == s for r in sel)]:
        by = {r["config"]: r for r in sel if r["setting"] == setting}  # the last row of a config wins
        hvd = next((r for c, r in by.items() if c not in ("horovod", "ddp", "solo")), None)
        if hvd is None:
            continue
        values, ratios = [], []
        for peer, _ in PEERS:
            r = by.get(peer)
            if r is None:
                values.append("(mpirun only)" if peer == "horovod" and launcher == "torchrun" else "(not run)")
                ratios.append("")
                continue
            values.append(cell(r))
            ratios.append(f"{hvd['img_per_s'] / r['img_per_s']:.2f}")
        label = f"{SETTING_LABELS[setting]}, hvdtorch `{hvd['config']}`"
        lines.append(f"| {label} | {cell(hvd)} | " + " | ".join(values) + " | " + " | ".join(ratios) + " |")
    return "\n".join(lines) + "\n"


def main():
    rows = load(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/training")
    if not rows:
        raise SystemExit("training_table.py: no results (run benchmarks/run_training.sh)")
    keys = sorted({(r["ranks"] != 2, r["ranks"], r["launcher_dir"] != "mpirun", r["launcher_dir"]) for r in rows})
    print("\n".join(table(rows, launcher, ranks) for _, ranks, _, launcher in keys))


if __name__ == "__main__":
    main()
