"""What `import hvdtorch` costs on top of `import torch`, in a fresh interpreter each time.

    python benchmarks/import_time.py [--rounds 15] [--json out.json]

Each round starts one interpreter that imports torch alone and one that imports torch and then
hvdtorch, in alternating order (so that a slow moment of the machine falls on both), and times
each from the start of the process to its exit. Printed: the median of each, its spread (min and
max), and the median of the rounds' differences, the figure BENCHMARKS.md quotes ("The first hour: import and build").
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = {"torch": "import torch", "torch+hvdtorch": "import torch; import hvdtorch"}


def _time(code: str) -> float:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)
    return time.perf_counter() - start


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", help="write the samples and medians here")
    args = ap.parse_args(argv)
    for code in PROGRAMS.values():  # warm the page cache: the first import of a cold disk is not the figure
        _time(code)
    samples = {k: [] for k in PROGRAMS}
    for r in range(args.rounds):
        order = list(PROGRAMS) if r % 2 == 0 else list(reversed(PROGRAMS))
        for k in order:
            samples[k].append(_time(PROGRAMS[k]))
    diffs = [b - a for a, b in zip(samples["torch"], samples["torch+hvdtorch"])]
    result = {k: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v)} for k, v in samples.items()}
    result["added_by_hvdtorch"] = {"median_s": statistics.median(diffs), "min_s": min(diffs), "max_s": max(diffs)}
    for k, v in result.items():
        print(f"{k:>18}: median {v['median_s']:.3f} s (min {v['min_s']:.3f}, max {v['max_s']:.3f})")
    ratio = result["torch+hvdtorch"]["median_s"] / result["torch"]["median_s"]
    print(f"{'ratio':>18}: {ratio:.3f}x torch alone, {args.rounds} rounds")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": args.rounds, "samples": samples, "result": result, "ratio": ratio}, f, indent=1)


if __name__ == "__main__":
    main()
