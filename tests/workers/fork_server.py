"""Rank side of tests/test_fork_server.py: what a rank sees of its own process."""

import atexit
import json
import os
import sys
import time


def describe(folder: str) -> None:
    """Writes this rank's process facts to FOLDER/rank-R.json, and at exit (an
    atexit handler, as hvdtorch's shutdown is) FOLDER/rank-R.exited."""
    rank = os.environ["RANK"]
    facts = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "sid": os.getsid(0),
        "argv": sys.argv[1:],
        "cwd": os.getcwd(),
        "mark": os.environ.get("HVDTORCH_TEST_MARK"),
        "stdin_is_null": os.path.samefile("/proc/self/fd/0", os.devnull),
    }
    with open(os.path.join(folder, f"rank-{rank}.json"), "w") as f:
        json.dump(facts, f)
    atexit.register(lambda: open(os.path.join(folder, f"rank-{rank}.exited"), "w").close())
    print(f"rank {rank} on stdout", flush=True)
    print(f"rank {rank} on stderr", file=sys.stderr, flush=True)


def fail_on_rank_1() -> None:
    if os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 fails on purpose")


def wait_to_be_killed() -> None:
    print("waiting", flush=True)
    time.sleep(60)
