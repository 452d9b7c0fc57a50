"""python -m hvdtorch.timeline summarize trace.json [--plot out.png] [--json] [--top 10]
(the summary: summary.py, the plot: plot.py).

A package's __main__ rather than a block in __init__: hvdtorch imports hvdtorch.timeline at start-up, and
running an already imported module with -m would execute it a second time.
"""

import argparse
import os
import sys

from .plot import plot
from .summary import format_summary, summarize, to_json


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hvdtorch.timeline", description="Summaries of hvdtorch timelines (HVDTORCH_TIMELINE traces)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("summarize", help="per-phase and per-step times, slowest ops, overlap with backward")
    s.add_argument("traces", nargs="+", help="trace file(s); several: one per rank (trace-{rank}.json)")
    s.add_argument("--plot", metavar="OUT.png", help="also draw a Gantt strip per rank and a stacked bar per phase")
    s.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    s.add_argument("--top", type=int, default=10, help="how many of the slowest ops to list (default 10)")
    args = parser.parse_args(argv)
    for p in args.traces:
        if not os.path.isfile(p):
            parser.error(f"no such trace file: {p}")
    try:
        summaries = summarize(args.traces, args.top)
    except ValueError as e:
        parser.error(str(e))
    print(to_json(summaries) if args.json else format_summary(summaries))
    if args.plot:
        plot(summaries, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
