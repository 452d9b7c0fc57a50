"""A cold build of what `pip install .` compiles (the core and the extension), file by file against
the unity build (HVDTORCH_BUILD_UNITY_BATCH), on this machine's cores with ccache off.

    python benchmarks/cold_build.py [--rounds 1] [--batches 0,8] [--jobs 2]

Each round builds into fresh folders per batch size (in alternating order, so that a slow moment
of the machine falls on both) and times `setup.py build_ext`: CMake's configure, the core, the
extension (no C++ tests; the CUDA device left out). Printed: the median seconds of each batch
size, its spread, and the ratio against the first (file by file). Needs the venv's torch; writes
nothing outside a temporary folder.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cold_build(batch: int, jobs: int) -> float:
    """Seconds of setup.py's build of the extension (CMake configure, then the core and the
    extension) into fresh folders, as `pip install .` runs it."""
    with tempfile.TemporaryDirectory(prefix=f"hvdtorch-cold-build-{batch}-") as tmp:
        env = dict(
            os.environ,
            CCACHE_DISABLE="1",
            MAX_JOBS=str(jobs),
            HVDTORCH_BUILD_DIR=os.path.join(tmp, "cmake"),
            HVDTORCH_BUILD_UNITY_BATCH=str(batch),
            HVDTORCH_CUDA="0",
        )
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", os.path.join(tmp, "lib")],
            cwd=ROOT,
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return time.perf_counter() - start


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--batches", default="0,8", help="unity batch sizes, the first the reference (0: file by file)")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    samples = {b: [] for b in batches}
    for r in range(args.rounds):
        for b in batches if r % 2 == 0 else list(reversed(batches)):
            samples[b].append(_cold_build(b, args.jobs))
            print(f"round {r}: batch {b}: {samples[b][-1]:.0f} s", flush=True)
    reference = statistics.median(samples[batches[0]])
    for b in batches:
        s = samples[b]
        print(
            f"batch {b:>2}: median {statistics.median(s):.0f} s (min {min(s):.0f}, max {max(s):.0f}), "
            f"{statistics.median(s) / reference:.2f}x batch {batches[0]}"
        )


if __name__ == "__main__":
    main()
