"""Plot of the control-plane scale benchmark (csrc/bench/control_plane_bench.cc).

    build/cmake/bench_control_plane_bench 256 200 > benchmarks/results/control_plane/bench.txt
    python benchmarks/plot_control_plane.py benchmarks/results/control_plane/bench.txt

Writes control_plane.png next to the data: per cycle with every op cached,
the busiest rank's messages and its CPU time against the number of ranks,
for the star (rank 0 answers everyone) and the decentralized AND (hosts of 8
ranks first, then one rank per host; below 16 ranks, one host).
"""

import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    """(path, uncached) -> sorted [(ranks, msgs, cpu_us, wall_us)] from the bench's table."""
    rows = defaultdict(list)
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 8 or not parts[0].isdigit() or parts[1] not in ("star", "flat", "hier"):
                continue
            uncached = parts[2] != "none"
            rest = parts[5:] if uncached else parts[3:]  # "1 in 10" is three words
            msgs, _bytes, wall, _spread, cpu = rest[:5]
            rows[(parts[1], uncached)].append((int(parts[0]), float(msgs), float(cpu), float(wall)))
    return {k: sorted(v) for k, v in rows.items()}


def main(path):
    rows = load(path)
    # The AND as the engine runs it: hierarchical where there are hosts.
    curves = {"star (rank 0 answers every rank)": rows[("star", False)]}
    flat = {n: r for n, *r in rows[("flat", False)]}
    flat.update({n: r for n, *r in rows.get(("hier", False), [])})
    curves["AND (hosts of 8 first)"] = [(n, *flat[n]) for n in sorted(flat)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, pts in curves.items():
        ns = [p[0] for p in pts]
        ax1.plot(ns, [p[1] for p in pts], marker="o", label=label)
        ax2.plot(ns, [p[2] for p in pts], marker="o", label=label)
    for ax, title in ((ax1, "busiest rank: messages per cycle"), (ax2, "busiest rank: CPU us per cycle")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks (in-process)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    out = os.path.join(os.path.dirname(path), "control_plane.png")
    fig.savefig(out, dpi=100)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1])
