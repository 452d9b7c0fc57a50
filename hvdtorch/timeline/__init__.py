"""The engine's timeline: recording it while the job runs (Horovod's
start_timeline / stop_timeline), and summarizing a trace from the command line:

    python -m hvdtorch.timeline summarize trace.json [--plot out.png] [--json]

(__main__.py; the summary lives in summary.py, the plot in plot.py).

    hvd.start_timeline("/tmp/trace.json")        # rank 0 writes it
    hvd.start_timeline("/tmp/trace-{rank}.json")  # every rank writes its own
    ...
    hvd.stop_timeline()

The file is the same Chrome trace HVDTORCH_TIMELINE writes from init() on
(chrome://tracing, Perfetto). Starting again switches to the new file;
stop_timeline() finishes the file and is a no-op when nothing is recorded.
Unlike Horovod, no environment variable has to be set beforehand.
"""

from .. import runtime


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Starts writing the timeline to ``file_path`` (ValueError if it cannot
    be written or hvdtorch is not initialized). ``mark_cycles``: also mark
    every negotiation cycle of the background thread (CYCLE_START)."""
    if not isinstance(file_path, str) or not file_path:
        raise ValueError(f"hvdtorch: start_timeline needs a file path, got {file_path!r}")
    runtime.state().engine.start_timeline(file_path, bool(mark_cycles))


def stop_timeline() -> None:
    """Stops recording and closes the timeline file."""
    runtime.state().engine.stop_timeline()
