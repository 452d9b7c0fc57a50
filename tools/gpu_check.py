"""Everything that needs a GPU, in one command for the GPU machine
(`make gpu-check OUT=<dir>`): build against the machine's torch, the device
contract and engine suites on cuda:0 (under compute-sanitizer where it is
installed), the gpu-marked tests at 1, 2 and 4 processes sharing cuda:0, the
simulated-device tests, and the GPU benchmarks. Each step's output goes to
<OUT>/<step>.log and is echoed; a failed step does not stop the later ones;
the exit status is 1 if any step failed. Uses the interpreter that runs it
(the machine's python3, which holds torch) and needs no package registry:
without pytest, the GPU tests run through tests/harness.py directly.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build", "cmake-gpu")


def step(out: str, name: str, cmd, env=None, timeout=900) -> bool:
    print(f"\n==== {name}: {' '.join(cmd)}", flush=True)
    t0 = time.time()
    with open(os.path.join(out, f"{name}.log"), "w") as log:
        try:
            p = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env={**os.environ, **(env or {})},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for line in p.stdout:
                sys.stdout.write(line)
                log.write(line)
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "timeout"
    ok = rc == 0
    print(f"==== {name}: {'ok' if ok else f'FAILED ({rc})'} in {time.time() - t0:.0f} s", flush=True)
    return ok


def gpu_tests_command():
    try:
        import pytest  # noqa: F401

        return [sys.executable, "-m", "pytest", "-q", "-rs", "tests/test_gpu.py", "tests/test_sim_device_mode.py"]
    except ImportError:
        code = (
            "from tests.harness import run_ranks\n"
            "for n in (1, 2, 4):\n"
            "    run_ranks('tests.workers.gpu:check_collectives', n, timeout=280); print('collectives', n, 'ok')\n"
            "for n in (1, 2):\n"
            "    run_ranks('tests.workers.gpu:check_distributed_model', n, timeout=200); print('model', n, 'ok')\n"
        )
        return [sys.executable, "-c", code]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--jobs", default=str(os.cpu_count() or 2))
    a = p.parse_args()
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    results = {}
    build_env = {"HVDTORCH_BUILD_DIR": BUILD, "HVDTORCH_BUILD_TESTS": "1", "MAX_JOBS": a.jobs}
    results["build"] = step(out, "build", [sys.executable, "setup.py", "build_ext", "--inplace"], build_env)
    if not results["build"]:
        print("build failed: nothing else can run")
        return 1
    results["check"] = step(out, "check", [sys.executable, "-m", "hvdtorch.check"])
    results["ctest"] = step(
        out, "ctest", ["ctest", "--test-dir", BUILD, "--output-on-failure", "-R", "cuda|sim|device"]
    )
    sanitizer = shutil.which("compute-sanitizer") or (
        "/usr/local/cuda/bin/compute-sanitizer" if os.path.exists("/usr/local/cuda/bin/compute-sanitizer") else None
    )
    if sanitizer:
        for t in ("test_cuda_device", "test_engine_cuda"):
            results[f"sanitizer_{t}"] = step(
                out,
                f"sanitizer_{t}",
                [sanitizer, "--tool", "memcheck", "--error-exitcode", "1", os.path.join(BUILD, t)],
            )
    else:
        print("compute-sanitizer: not installed here; skipped")
    env = {"PYTHONPATH": ROOT}
    results["gpu_tests"] = step(out, "gpu_tests", gpu_tests_command(), env, timeout=1200)
    results["bench_allreduce"] = step(
        out, "bench_allreduce", [sys.executable, "benchmarks/gpu.py", "allreduce", "--ranks", "1,2", "--out", out], env
    )
    results["bench_googlenet"] = step(
        out, "bench_googlenet", [sys.executable, "benchmarks/gpu.py", "googlenet", "--ranks", "1,2", "--out", out], env
    )
    print("\n==== summary")
    for name, ok in results.items():
        print(f"  {name:<28} {'ok' if ok else 'FAILED'}")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
