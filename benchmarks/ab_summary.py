"""Summary of benchmarks/ab.sh: per measurement, the median over rounds of
each side (old, new), the spread (min-max) and the ratio new/old.

    python benchmarks/ab_summary.py benchmarks/results/ab
"""

import csv
import json
import os
import statistics
import sys
from collections import defaultdict


def collect(root):
    """{(what, side): [values over rounds]}; what names the measurement."""
    values = defaultdict(list)
    for d in sorted(os.listdir(root)):
        path = os.path.join(root, d)
        if not os.path.isdir(path) or "." not in d:
            continue
        side = d.split(".")[0]
        ar = os.path.join(path, "allreduce.csv")
        if os.path.exists(ar):
            with open(ar) as f:
                for row in csv.DictReader(f):
                    key = f"allreduce {row['impl']:>16} {int(row['bytes']):>9} B: ms"
                    values[(key, side)].append(float(row["time_s"]) * 1e3)
        for setting in ("comm", "compute"):
            js = os.path.join(path, f"{setting}.jsonl")
            if os.path.exists(js):
                with open(js) as f:
                    for line in f:
                        row = json.loads(line)
                        values[(f"googlenet {setting:>7} {row['config']:>8}: img/s", side)].append(row["img_per_s"])
    return values


def main():
    values = collect(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/ab")
    whats = sorted({w for w, _ in values})
    print(f"{'measurement':<45} {'old median [min-max]':>24} {'new median [min-max]':>24} {'new/old':>8}")
    for w in whats:
        old, new = values.get((w, "old")), values.get((w, "new"))
        if not old or not new:
            continue
        mo, mn = statistics.median(old), statistics.median(new)
        print(
            f"{w:<45} {mo:9.3f} [{min(old):.3f}-{max(old):.3f}] {mn:9.3f} [{min(new):.3f}-{max(new):.3f}] "
            f"{mn / mo:7.2f}x"
        )


if __name__ == "__main__":
    main()
