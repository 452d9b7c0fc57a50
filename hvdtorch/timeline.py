"""Tools for hvdtorch's timeline (the Chrome trace HVDTORCH_TIMELINE writes).

    python -m hvdtorch.timeline summarize trace.json [--plot out.png] [--json]

The summary itself lives in timeline_summary.py and the plot in timeline_plot.py.
"""

if __name__ == "__main__":
    import sys

    from .timeline_summary import main
    sys.exit(main())
