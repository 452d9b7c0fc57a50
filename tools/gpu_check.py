"""Everything that needs a GPU, as one command for the GPU machine, in three
phases that each fit a few minutes:

    make gpu-check PHASE=tests OUT=<dir>     # build, hvdtorch.check, the CUDA device and engine
                                             # suites, compute-sanitizer memcheck on both, the gpu
                                             # tests at 1-4 processes sharing cuda:0
    make gpu-check PHASE=bench OUT=<dir>     # hand-over latency, all-reduce per route, the device
                                             # ring's slot sizes, GoogLeNet and its profile
                                             # (BENCHMARKS.md "GPU")
    make gpu-check PHASE=bench-training BUDGET=600 OUT=<dir>
                                             # peak memory of DistributedModel, shard=1/2/3, ZeRO-DDP
                                             # and FSDP2; PowerSGD against DDP's hook; torch.compile
                                             # against eager (benchmarks/gpu_training.py)
    make gpu-check PHASE=tests ONLY=gpu_tests,engine_cuda OUT=<dir>   # some steps again

Each step has a timeout, and the phase a budget (BUDGET seconds: a step that
would start after it is reported as not run); steps that do not share the
GPU's timing run side by side. The budget counts the build too: the
bench-training steps' timeouts add up to 420 s, so that phase wants a
BUDGET above the default 330 (BUDGET=600 leaves the build 180 s).
Every step writes its log under
build/gpu-check/<phase>/; OUT receives two files per phase:
summary-<phase>.txt (each step's outcome and time) and
gpu-check-<phase>.tar.gz (the logs, the machine's description, the
benchmarks' CSV and plots). The console shows each step's start and end, the
tail of a failed step's log, the benchmark tables and the summary.

Where no GPU is visible, every step that needs one prints "no GPU: skipped"
and everything else runs for real (the build with this interpreter, the
check, the logs and the tarball), so the script itself is rehearsed on any
machine; REHEARSE=1 also runs the benchmark scripts on the CPU at small sizes.

REUSE_BUILD=1 takes the extension and the CUDA suites already built in this
tree for this interpreter (hvdtorch/_C and build/cmake-gpu) when they import,
and then, in PHASE=tests, builds once more into build/gpu-check/build beside
the GPU steps, so the phase still shows that this machine's torch builds it.

Uses the interpreter that runs it (the GPU machine's python3 holds torch),
and no package registry: the wheels `make gpu-wheels` put in build/gpu-wheels
(Lightning's, tqdm's) are installed for the run where that interpreter lacks them.
Exit status 1 if any step that ran failed.
"""

import argparse
import datetime
import glob
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build", "cmake-gpu")
WORK = os.path.join(ROOT, "build", "gpu-check")
PY = sys.executable
# `make gpu-wheels` puts Lightning's wheels here (the GPU machine has no registry); those whose
# distribution this interpreter lacks are installed into SITE, which every step's PYTHONPATH ends with.
WHEELS = os.path.join(ROOT, "build", "gpu-wheels")
SITE = os.path.join(WORK, "site")


@dataclass
class Step:
    name: str
    cmd: List[str]
    timeout: int
    needs_gpu: bool = False
    env: Dict[str, str] = field(default_factory=dict)
    cwd: str = ROOT
    # Where REHEARSE=1 runs it on a machine without a GPU (the benchmarks on the CPU).
    rehearsal: Optional[List[str]] = None
    # Why it cannot run here (a tool missing), decided before the phase starts.
    unavailable: Optional[str] = None


class Runner:
    """Runs groups of steps: the steps of one group one after another, the
    groups side by side; records each outcome."""

    def __init__(self, logs: str, budget: float, gpu: bool, rehearse: bool, only: Optional[List[str]]):
        self.logs, self.gpu, self.rehearse, self.only = logs, gpu, rehearse, only
        self.deadline = time.monotonic() + budget
        self.results: Dict[str, str] = {}
        self.seconds: Dict[str, float] = {}
        self.lock = threading.Lock()

    def say(self, text: str) -> None:
        with self.lock:
            print(text, flush=True)

    def record(self, step: Step, outcome: str, seconds: float = 0.0) -> None:
        with self.lock:
            self.results[step.name] = outcome
            self.seconds[step.name] = seconds

    def run_step(self, step: Step, always: bool = False) -> bool:
        if not always and self.only is not None and step.name not in self.only:
            return True
        if step.unavailable:
            self.say(f"---- {step.name}: {step.unavailable}: skipped")
            self.record(step, f"skipped ({step.unavailable})")
            return True
        cmd = step.cmd
        if step.needs_gpu and not self.gpu:
            if not (self.rehearse and step.rehearsal):
                self.say(f"---- {step.name}: no GPU: skipped")
                self.record(step, "skipped (no GPU)")
                return True
            cmd = step.rehearsal
        left = self.deadline - time.monotonic()
        if left < 5:
            self.say(f"---- {step.name}: not run: the phase's budget is spent")
            self.record(step, "not run (budget)")
            return False
        timeout = min(step.timeout, left)
        log_path = os.path.join(self.logs, f"{step.name}.log")
        self.say(f"---- {step.name}: start ({' '.join(cmd)}), timeout {timeout:.0f} s")
        t0 = time.monotonic()
        with open(log_path, "w") as log:
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            try:
                p = subprocess.Popen(
                    cmd,
                    cwd=step.cwd,
                    # A crash shows the Python stack it happened under.
                    env=step_env(step),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # a timeout kills its whole process group (torchrun's ranks too)
                )
            except OSError as e:
                log.write(f"cannot start: {e}\n")
                rc = f"cannot start: {e}"
            else:
                try:
                    rc = p.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                    rc = f"timed out after {timeout:.0f} s"
        took = time.monotonic() - t0
        ok = rc == 0
        outcome = "ok" if ok else (f"FAILED (exit {rc})" if isinstance(rc, int) else f"FAILED ({rc})")
        if not ok:
            with open(log_path, errors="replace") as f:
                tail = f.readlines()[-40:]
            self.say(f"---- {step.name}: {outcome} in {took:.0f} s; its log ends:\n" + "".join(tail).rstrip())
        else:
            self.say(f"---- {step.name}: ok in {took:.0f} s")
        self.record(step, outcome, took)
        return ok

    def run_group(self, steps: List[Step], stop_on_failure: bool = False, always: bool = False) -> bool:
        ok = True
        for step in steps:
            ok = self.run_step(step, always) and ok
            if not ok and stop_on_failure:
                break
        return ok

    def run_groups(self, groups: List[List[Step]]) -> None:
        threads = [threading.Thread(target=self.run_group, args=(g,)) for g in groups if g]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def step_env(step: Step) -> Dict[str, str]:
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "PYTHONUNBUFFERED": "1", **step.env}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), SITE) if p)
    return env


def install_missing_wheels() -> str:
    """Installs each wheel of WHEELS whose distribution this interpreter
    lacks into SITE (no registry, no dependencies resolved: the folder holds
    them); what was done, in one line."""
    import importlib.metadata

    wheels = sorted(glob.glob(os.path.join(WHEELS, "*.whl")))
    if not wheels:
        return f"no wheels in {WHEELS} (make gpu-wheels): Lightning's GPU tests skip where it is not installed"
    missing = []
    for wheel in wheels:
        dist = os.path.basename(wheel).split("-")[0]
        try:
            importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append(wheel)
    if not missing:
        return "every wheel's distribution is installed already"
    cmd = [PY, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", SITE, *missing]
    done = subprocess.run(cmd, capture_output=True, text=True)
    names = ", ".join(os.path.basename(w).split("-")[0] for w in missing)
    if done.returncode != 0:
        return f"installing {names} failed: {(done.stderr or done.stdout).strip()[-400:]}"
    return f"installed {names} into {SITE}"


def gpu_visible() -> bool:
    """Whether torch sees a CUDA GPU (asked in a child: this process stays off the GPU)."""
    try:
        out = subprocess.run(
            [PY, "-c", "import torch; print(torch.cuda.device_count())"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        return out.returncode == 0 and int(out.stdout.strip().splitlines()[-1]) > 0
    except (subprocess.SubprocessError, ValueError, IndexError):
        return False


def describe_machine(path: str) -> str:
    """The facts a GPU result is quoted with: date, GPU, driver, torch, CUDA, tools. Returns the headline."""

    def output(cmd) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "(not available)"

    torch_facts = output(
        [
            PY,
            "-c",
            "import torch; print(torch.__version__, 'cuda', torch.version.cuda, 'nccl', "
            "'.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '-')",
        ]
    )
    gpu = output(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    lines = [
        f"date (UTC): {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}",
        f"python: {sys.version.split()[0]} ({PY})",
        f"torch: {torch_facts}",
        f"GPU (name, driver, memory): {gpu or '(none)'}",
        f"nvcc: {output([cuda_tool('nvcc') or 'nvcc', '--version']).splitlines()[-1:] or '(not found)'}",
        f"compute-sanitizer: {cuda_tool('compute-sanitizer') or '(not found)'}",
        f"CPUs: {os.cpu_count()}",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n\n" + output(["nvidia-smi"]) + "\n")
    return "; ".join(lines[:4])


def cuda_tool(name: str) -> Optional[str]:
    """A CUDA toolkit program: on the PATH, or in the toolkit's usual folders."""
    found = shutil.which(name)
    if found:
        return found
    for p in (f"/usr/local/cuda/bin/{name}", *sorted(glob.glob(f"/usr/local/cuda-*/bin/{name}"))):
        if os.path.exists(p):
            return p
    return None


def torch_cuda_version() -> Optional[str]:
    """The CUDA version this interpreter's torch was built with; None for a CPU build."""
    import torch

    return torch.version.cuda


def extension_path() -> str:
    return os.path.join(ROOT, "hvdtorch", "_C" + sysconfig.get_config_var("EXT_SUFFIX"))


def suite(name: str) -> str:
    return os.path.join(BUILD, name)


def build_steps(jobs: int, reuse: bool) -> Tuple[List[Step], bool]:
    """The build of the extension and the CUDA suites against this
    interpreter's torch, and whether it takes the tree's build as it is."""
    # The CUDA suites exist where nvcc is there and torch is a CUDA build (a rehearsal on a
    # CPU torch builds the extension alone).
    cuda = cuda_tool("nvcc") is not None and torch_cuda_version() is not None
    targets = "hvdtorch_ext" + (" test_cuda_device test_engine_cuda" if cuda else "")
    env = {"HVDTORCH_BUILD_DIR": BUILD, "HVDTORCH_BUILD_TESTS": "1", "MAX_JOBS": str(jobs)}
    built = os.path.exists(extension_path()) and os.path.exists(suite("test_engine_cuda"))
    if reuse and built:
        # Taken as built: it must import with this torch, and say what it holds.
        probe = (
            "import hvdtorch, torch; "
            "print(hvdtorch._C.__file__, 'cuda_built', hvdtorch.cuda_built(), torch.__version__)"
        )
        return [Step("build", [PY, "-c", probe], 120)], True
    return [
        Step(
            "build",
            [PY, "setup.py", "build_ext", "--inplace"],
            420,
            env={**env, "HVDTORCH_BUILD_TARGETS": targets},
        )
    ], False


# One all-reduce of a CPU tensor and, where a GPU is visible, of a CUDA tensor, in one process.
FIRST_OPS = (
    'import torch, hvdtorch as hvd; hvd.init(); print("built here:", hvd._C.__file__); '
    'assert hvd.allreduce(torch.ones(4), name="cpu").eq(1).all(); '
    'assert not torch.cuda.is_available() or hvd.allreduce(torch.ones(4, device="cuda"), name="gpu").eq(1).all(); '
    'hvd.shutdown(); print("first all-reduces ok")'
)


def rebuild_step(jobs: int) -> Step:
    """REUSE_BUILD=1: a fresh build of the package into build/gpu-check/build
    (its own CMake folder and lib folder), then hvdtorch.check importing that
    build from outside the tree, and its first all-reduces."""
    base = os.path.join(WORK, "build")
    script = (
        f"set -e; rm -rf {base}; "
        f"HVDTORCH_BUILD_DIR={base}/cmake HVDTORCH_BUILD_TARGETS=hvdtorch_ext MAX_JOBS={jobs} "
        f"{PY} setup.py -q build --build-base {base}; "
        f"lib=$(ls -d {base}/lib.*); cd /tmp && PYTHONPATH=$lib {PY} -m hvdtorch.check && "
        f"PYTHONPATH=$lib {PY} -c '{FIRST_OPS}'"
    )
    return Step("build_on_this_machine", ["bash", "-c", script], 420)


CUDA_BUILT = (
    "import torch, hvdtorch; assert torch.cuda.is_available(), 'torch sees no GPU'; "
    "assert hvdtorch.cuda_built(), 'this build of hvdtorch has no CUDA device'; print('CUDA device built and visible')"
)


def test_steps() -> List[List[Step]]:
    """PHASE=tests, after the build: groups that run side by side."""
    sanitizer = cuda_tool("compute-sanitizer")
    missing = None if sanitizer else "compute-sanitizer is not installed"

    def memcheck(name: str) -> Step:
        cmd = [sanitizer or "compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1", suite(name)]
        return Step(f"memcheck_{name}", cmd, 180, needs_gpu=True, unavailable=missing)

    try:
        import xdist  # noqa: F401

        parallel = ["-n", "4"]
    except ImportError:
        parallel = []
    pytest_cmd = [PY, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *parallel, "tests/test_gpu.py"]
    return [
        [
            Step("check", [PY, "-m", "hvdtorch.check"], 120),
            # A build without the CUDA device would let every gpu test skip: on a GPU that fails.
            Step("cuda_built", [PY, "-c", CUDA_BUILT], 60, needs_gpu=True),
            Step("cuda_device", [suite("test_cuda_device")], 150, needs_gpu=True),
            Step("engine_cuda", [suite("test_engine_cuda")], 200, needs_gpu=True),
            memcheck("test_cuda_device"),
        ],
        [memcheck("test_engine_cuda")],
        [Step("gpu_tests", pytest_cmd, 330, needs_gpu=True, env={"PYTHONPATH": ROOT})],
    ]


def slot_sweep(bench: List[str], results: str, sizes: str) -> str:
    """The device ring alone at 2 ranks, once per slot size."""
    runs = [
        f"echo 'device ring slots of {mib} MiB:'; HVDTORCH_DEVICE_RING_SLOT_BYTES={mib << 20} {' '.join(bench)} "
        f"allreduce --ranks 2 --routes 'hvd ring' {sizes} --out {results}/slots-{mib}MiB"
        for mib in (2, 8, 32)
    ]
    return "set -e; " + "; ".join(runs)


def bench_steps(results: str) -> List[Step]:
    """PHASE=bench: one after another (they time the GPU)."""
    env = {"PYTHONPATH": ROOT}
    bench = [PY, "benchmarks/gpu.py"]
    small = ["--device", "cpu", "--max-bytes", "1M", "--reps", "3", "--steps", "2", "--rounds", "2", "--batch", "4"]
    return [
        Step(
            "bench_allreduce",
            [*bench, "allreduce", "--ranks", "1,2", "--max-bytes", "256M", "--out", results],
            240,
            needs_gpu=True,
            env=env,
            rehearsal=[*bench, "allreduce", "--ranks", "1,2", *small, "--out", results],
        ),
        # One hand-over between two processes on the GPU, by IPC event and by stream flag.
        Step(
            "bench_handoff",
            ["bash", "-c", f"nvcc -O2 -arch=sm_90 -o {WORK}/handoff benchmarks/gpu_handoff.cu && {WORK}/handoff 2000"],
            120,
            needs_gpu=True,
            rehearsal=["bash", "-c", f"nvcc -O2 -arch=sm_90 -o {WORK}/handoff benchmarks/gpu_handoff.cu"],
        ),
        # The device ring's slot size, 16-256 MiB (HVDTORCH_DEVICE_RING_SLOT_BYTES is read at init).
        Step(
            "bench_ring_slots",
            ["bash", "-c", slot_sweep(bench, results, "--max-bytes 256M --min-bytes 16M")],
            240,
            needs_gpu=True,
            env=env,
            rehearsal=[
                "bash",
                "-c",
                slot_sweep(bench, results, "--device cpu --max-bytes 1M --min-bytes 64K --reps 2"),
            ],
        ),
        Step(
            "bench_googlenet",
            [*bench, "googlenet", "--ranks", "1,2", "--profile", "--out", results],
            240,
            needs_gpu=True,
            env=env,
            rehearsal=[*bench, "googlenet", "--ranks", "1,2", "--profile", *small, "--image", "32", "--out", results],
        ),
    ]


def bench_training_steps(results: str) -> List[Step]:
    """PHASE=bench-training: one after another (they time the GPU); their timeouts add up to 420 s."""
    env = {"PYTHONPATH": ROOT}
    bench = [PY, "benchmarks/gpu_training.py"]
    # The model of zero3.py's "mlp" setting (12 x 2048, 50.4 M parameters) on the GPU; 4 x 128 on the CPU.
    small = ["--device", "cpu", "--width", "128", "--layers", "4", "--batch", "8", "--steps", "2", "--rounds", "2"]

    def step(what: str, timeout: int, sizes: List[str]) -> Step:
        return Step(
            f"bench_{what}",
            [*bench, what, "--ranks", "2", *sizes, "--out", results],
            timeout,
            needs_gpu=True,
            env=env,
            rehearsal=[*bench, what, "--ranks", "2", *small, "--out", results],
        )

    return [
        # One torchrun job per configuration and round (a peak is a process's): 6 configurations x 2 rounds,
        # a job a collective waits in for 45 s at most (a peer stuck on one rank), 90 s whole.
        step("memory", 180, ["--steps", "3", "--rounds", "2", "--job-timeout", "45"]),
        step("powersgd", 100, ["--steps", "10", "--rounds", "5", "--batch", "64"]),
        # The compile (both ranks at once) is most of it: its first step is timed alone, outside the rounds.
        step("compile", 140, ["--steps", "10", "--rounds", "5", "--batch", "64"]),
    ]


# The benchmarks whose tables the console shows after each benchmark phase, and the starts of their lines.
REPORTED = {
    "bench": ("bench_handoff", "bench_allreduce", "bench_ring_slots", "bench_googlenet"),
    "bench-training": ("bench_memory", "bench_powersgd", "bench_compile"),
}
TABLE_HEADS = ("  ", "all-reduce", "GoogLeNet", "auto", "profile", "device ring", "event", "flag", "spin", "copy")
TABLE_HEADS += ("memory:", "PowerSGD", "torch.compile", "FAILED", "\n")


def report_tables(logs: str, names: Tuple[str, ...]) -> None:
    """The benchmarks' own tables (from their logs), for the console."""
    for name in names:
        path = os.path.join(logs, f"{name}.log")
        if not os.path.exists(path):
            continue
        with open(path, errors="replace") as f:
            lines = [ln.rstrip() for ln in f if ln.startswith(TABLE_HEADS)]
        table = [ln for ln in lines if ln.strip()]
        if table:
            print(f"\n==== {name}\n" + "\n".join(table[-60:]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="where the summary and the tarball of the logs go")
    p.add_argument("--phase", choices=["tests", "bench", "bench-training"], required=True)
    p.add_argument("--only", default="", help="comma-separated step names: run only these (the build always runs)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="compile jobs (default: every core)")
    p.add_argument("--budget", type=float, default=330, help="seconds the phase may take; later steps are not run")
    p.add_argument("--reuse-build", action="store_true", help="take the tree's build when it imports (see above)")
    p.add_argument("--rehearse", action="store_true", help="without a GPU, run the benchmarks on the CPU, small")
    a = p.parse_args()

    out = os.path.abspath(a.out)
    nvcc = cuda_tool("nvcc")
    if nvcc and not shutil.which("nvcc"):  # CMake and setup.py look for it on the PATH
        os.environ["PATH"] = os.path.dirname(nvcc) + os.pathsep + os.environ["PATH"]
    logs = os.path.join(WORK, a.phase)
    shutil.rmtree(logs, ignore_errors=True)
    os.makedirs(logs)
    os.makedirs(out, exist_ok=True)
    t0 = time.monotonic()
    print(f"==== gpu-check, phase {a.phase}: {describe_machine(os.path.join(logs, 'machine.txt'))}", flush=True)
    gpu = gpu_visible()
    if not gpu:
        print("==== no GPU visible to torch here: the steps that need one are skipped", flush=True)
    print(f"==== wheels: {install_missing_wheels()}", flush=True)
    only = [s for s in a.only.split(",") if s] or None
    runner = Runner(logs, a.budget, gpu, a.rehearse, only)

    build, reused = build_steps(a.jobs, a.reuse_build)
    if a.phase == "tests":
        groups = test_steps() + ([[rebuild_step(max(2, a.jobs // 2))]] if reused else [])
    elif a.phase == "bench":
        groups = [bench_steps(os.path.join(logs, "results"))]
    else:
        groups = [bench_training_steps(os.path.join(logs, "results"))]
    if not runner.run_group(build, stop_on_failure=True, always=True):
        print("==== the build failed: nothing else can run", flush=True)
    elif a.phase == "tests":
        runner.run_groups(groups)
    else:
        runner.run_group(groups[0])
        report_tables(logs, REPORTED[a.phase])

    summary = [f"gpu-check phase {a.phase}, {time.monotonic() - t0:.0f} s"]
    order = [s.name for s in build] + [s.name for g in groups for s in g]
    summary += [
        f"  {name:<28} {runner.results[name]:<46} {runner.seconds[name]:5.0f} s"
        for name in order
        if name in runner.results
    ]
    with open(os.path.join(out, f"summary-{a.phase}.txt"), "w") as f:
        f.write("\n".join(summary) + "\n")
    with tarfile.open(os.path.join(out, f"gpu-check-{a.phase}.tar.gz"), "w:gz") as tar:
        tar.add(logs, arcname=f"gpu-check-{a.phase}")
    print("\n==== summary\n" + "\n".join(summary), flush=True)
    failed = [n for n, o in runner.results.items() if o.startswith(("FAILED", "not run"))]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
