"""GPU training benchmarks (make gpu-check PHASE=bench-training runs them on the GPU machine).

    python benchmarks/gpu_training.py memory --ranks 2 --out DIR
    python benchmarks/gpu_training.py powersgd --ranks 2 --out DIR
    python benchmarks/gpu_training.py compile --ranks 2 --out DIR

Model: benchmarks/zero3.py's "mlp", --layers x Linear(--width, --width) with
ReLU between (12 x 2048: 50.4 M parameters, 201 MB of fp32 gradients),
cross-entropy over --width classes, --batch samples per rank (4 fixed
synthetic batches per rank, drawn on the CPU and moved, so every device sees
the same numbers), the same initial weights everywhere. --ranks processes
share cuda:0; NCCL refuses two ranks on one GPU, so torch's peers run on
torch.distributed's Gloo with the same CUDA tensors (Gloo copies them
through host memory), and hvdtorch on its own device ring (reducer "auto").
A peer that raises where it runs (Gloo lacks some ops on CUDA tensors:
FSDP2 needs a reduce-scatter) is reported as "<peer>: does not run here:
<the first line of its error>" and left out; the rest of the benchmark goes on.

memory: the peak of torch.cuda.max_memory_allocated() per rank (the largest
rank's) over --steps steps of Adam (lr 1e-4, benchmarks/zero3.py's), and
beside it the peak of max_memory_reserved() (what torch's caching allocator
held). Memory the engine allocates outside torch's allocator (the device
ring's slots, the staging buffers) is in neither. Configurations:
  dm        hvd.DistributedModel, the plain optimizer (unsharded)
  shard1    dm + hvd.DistributedOptimizer(opt, shard=1) (ZeRO-1: optimizer state)
  shard2    dm + hvd.DistributedOptimizer(opt, shard=2) (ZeRO-2: and gradients)
  shard3    dm + hvd.DistributedOptimizer(opt, shard=3, model=dm) (ZeRO-3: and parameters)
  zero-ddp  torch DDP + torch.distributed.optim.ZeroRedundancyOptimizer (Gloo)
  fsdp2     torch.distributed.fsdp.fully_shard on every Linear, then the root (Gloo)
A peak is a process's high-water mark, so each configuration runs in a
torchrun job of its own: --rounds rounds of one job per configuration,
interleaved (A B C ..., A B C ...), median [min-max] over rounds. Before a
row counts, its parameters after the steps (gathered in full) are compared
with dm's of the same round: an hvdtorch configuration whose largest
absolute difference is over --tolerance (1e-5: a tenth of the most one Adam
step at lr 1e-4 moves a parameter) is a failure (the table says so and the
exit status is 1), as is one that raises; the peers' differences are shown
beside theirs.

powersgd: samples/s of hvd.DistributedModel with
compression=hvd.Compression.powersgd(rank=--powersgd-rank, start_iter=--start-iter)
against DDP with torch's PowerSGD hook (powerSGD_hook: the same
matrix_approximation_rank and start_powerSGD_iter, error feedback and warm
start, as hvdtorch's) on the same model, SGD with momentum. DDP keeps one
bucket: the hook chains its all-reduces in future callbacks, and with
several buckets they reach Gloo in a different order on each rank (a
collective mismatch; benchmarks/cluster.py). Each is stepped --start-iter + 2
times before the rounds, so every timed step is compressed. torch's hook
takes a start of at least 2 (it needs two exact steps first).

compile: samples/s of torch.compile(hvd.DistributedModel(model)) against
the same DistributedModel eager (a second model, the same initial weights),
SGD with momentum. The compiled model is stepped 3 times before the rounds:
its first step, which compiles, is timed on its own and printed, not counted.
--backend: torch.compile's backend; inductor by default. On --device cpu,
where inductor needs a C++ compiler, aot_eager is taken when none is found,
and the table says which ran.

Throughput (powersgd, compile): --rounds rounds of interleaved windows (A B,
A B, ...), each a barrier and then --steps steps, the device drained at
both ends; samples/s = ranks x batch x steps / the longest rank's window;
median (min-max) over rounds, and hvdtorch's over the peer's.

--device cpu runs everything on CPU tensors (Gloo, hvdtorch's host reducers;
peak RSS from resource.getrusage, which counts the whole process, torch's
libraries included, instead of torch.cuda's counters), which only checks the
script itself on a machine without a GPU. CSV under --out.
"""

import argparse
import csv
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.gpu import Device, median_spread  # noqa: E402
from benchmarks.zero import _max_over_ranks, free_port  # noqa: E402
from benchmarks.zero3 import LR, MLP_LAYERS, MLP_WIDTH  # noqa: E402

MEMORY_CONFIGS = ["dm", "shard1", "shard2", "shard3", "zero-ddp", "fsdp2"]
PEERS = ("zero-ddp", "fsdp2", "ddp powersgd")
# Each rank's own batches, reused in turn: data loading stays out of the timings.
BATCHES = 4


def launch(nranks: int, args, timeout: float = 900) -> None:
    """Runs this script's worker mode on `nranks` processes (torchrun)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nranks}"]
    cmd += [f"--master_port={free_port()}", os.path.abspath(__file__), *args, "--worker"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's choice too, set here so that it says nothing about it
    p = subprocess.Popen(cmd, env=env)
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        # torchrun's ranks run in sessions of their own: SIGTERM has torchrun end them, SIGKILL would orphan them.
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        raise
    if rc:
        raise subprocess.CalledProcessError(rc, cmd)


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def write_csv(out: str, name: str, rows) -> str:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, name)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)
    return path


def device_name(a) -> str:
    return "cuda:0" if a.device == "cuda" else "cpu"


def describe(a) -> str:
    params = a.layers * (a.width * a.width + a.width)
    return f"MLP {a.layers} x Linear({a.width}, {a.width}) ({params / 1e6:.1f} M parameters), batch {a.batch} per rank"


# ---- the workers' common parts ----------------------------------------------------


def start(a):
    """(device, ranks, rank) with torch.distributed's default group on Gloo and hvdtorch on it."""
    import torch.distributed as dist

    import hvdtorch as hvd

    dev = Device(a.device)
    # Gloo raises after this long in a collective a peer never joins (a peer that failed on one rank only).
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.job_timeout))
    hvd.init()
    return dev, hvd.size(), hvd.rank()


def finish() -> None:
    import torch.distributed as dist

    import hvdtorch as hvd

    hvd.shutdown()
    dist.destroy_process_group()


def mlp(a):
    """benchmarks/zero3.py's "mlp" at --width and --layers, on the device; the same weights on every rank."""
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.width, a.width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1]).to(device_name(a))


def batches(a, rank: int):
    import torch

    g = torch.Generator().manual_seed(rank)
    dev = device_name(a)
    return [
        (torch.randn(a.batch, a.width, generator=g).to(dev), torch.randint(0, a.width, (a.batch,), generator=g).to(dev))
        for _ in range(BATCHES)
    ]


class Setup:
    """One configuration: what forward goes through and the optimizer."""

    def __init__(self, forward, opt, model=None):
        self.forward, self.opt = forward, opt
        self.model = forward if model is None else model
        self.done = 0  # steps taken: picks the next batch

    def steps(self, data, n: int) -> None:
        import torch.nn.functional as F

        for _ in range(n):
            x, y = data[self.done % len(data)]
            self.opt.zero_grad()
            F.cross_entropy(self.forward(x), y).backward()
            self.opt.step()
            self.done += 1


def timed_rounds(a, setups, data, dev, n: int):
    """--rounds rounds of interleaved windows; {kind: [samples/s per round]}."""
    import torch.distributed as dist

    rates = {k: [] for k in setups}
    for _ in range(a.rounds):
        for k, s in setups.items():
            dev.sync()
            dist.barrier()
            t0 = time.perf_counter()
            s.steps(data, a.steps)
            dev.sync()
            (elapsed,) = _max_over_ranks([time.perf_counter() - t0], None)
            rates[k].append(a.steps * a.batch * n / elapsed)
    return rates


def agreed(ok: bool) -> bool:
    """Whether every rank says ok (a peer that failed on one rank is out on all)."""
    (worst,) = _max_over_ranks([0.0 if ok else 1.0], None)
    return worst == 0.0


def rate_table(title: str, rates, peer: str, notes, n: int, out: str, csv_name: str) -> None:
    """Rank 0's table of samples/s, each against `peer`; CSV under --out."""
    print(f"\n{title}")
    ref = statistics.median(rates[peer]) if rates.get(peer) else None
    rows = []
    for k, rs in rates.items():
        if not rs:
            print(f"  {k}: does not run here: {notes[k]}")
            rows.append({"ranks": n, "config": k, "error": notes[k]})
            continue
        med, lo, hi = median_spread(rs)
        ratio = f"{med / ref:6.3f}x {peer}" if ref else "  -"
        print(f"  {k:<16} {med:11.1f} ({lo:.1f}-{hi:.1f})  {ratio}")
        row = {"ranks": n, "config": k, "median_sps": med, "min_sps": lo, "max_sps": hi}
        row[f"ratio_to_{peer.replace(' ', '_')}"] = med / ref if ref else ""
        rows.append(row)
    if ref is None:
        print(f"  no ratio: {peer} did not run here")
    print(f"CSV: {write_csv(out, csv_name, rows)}")


# ---- memory -------------------------------------------------------------------------


def memory_setup(name: str, a):
    import torch

    import hvdtorch as hvd

    model = mlp(a)
    if name == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                fully_shard(m)
        model = fully_shard(model)
        return Setup(model, torch.optim.Adam(model.parameters(), lr=LR))
    if name == "zero-ddp":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
        return Setup(model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=LR))
    dm = hvd.DistributedModel(model, name=f"gt.{name}")
    opt = torch.optim.Adam(dm.parameters(), lr=LR)
    if name == "shard3":
        opt = hvd.DistributedOptimizer(opt, named_parameters=dm.named_parameters(), shard=3, model=dm)
    elif name.startswith("shard"):
        # The optimizer finds the DistributedModel of its parameters and takes the reduction over.
        opt = hvd.DistributedOptimizer(opt, shard=int(name[5]))
    return Setup(dm, opt)


def full_parameters(name: str, model):
    """Every parameter in full, on the CPU, by the plain module's names (collective where they are sharded)."""
    if name == "shard3":
        sd = model.state_dict(to=0)  # gathered bucket by bucket, on rank 0
    elif name == "fsdp2":
        sd = {k: v.full_tensor() for k, v in model.state_dict().items()}
    else:
        sd = model.state_dict()
    return {k[len("module.") :] if k.startswith("module.") else k: v.detach().float().cpu() for k, v in sd.items()}


def memory_worker(a) -> None:
    import resource

    import torch

    dev, n, me = start(a)
    name = a.config
    if dev.cuda:
        torch.cuda.init()  # the allocator's counters exist once CUDA is initialised
        torch.cuda.reset_peak_memory_stats()
    try:
        s = memory_setup(name, a)
        s.steps(batches(a, me), a.steps)
        dev.sync()
    except Exception as e:
        with open(f"{a.rows}.error{me}", "w") as f:  # the reason, for the table
            f.write(first_line(e))
        if name not in PEERS:
            raise
        # A peer that cannot run here: out at once (no collective is to be trusted after it).
        sys.stdout.flush()
        os._exit(0)
    if dev.cuda:
        peak = torch.cuda.max_memory_allocated() / 2**20
        reserved = torch.cuda.max_memory_reserved() / 2**20
    else:
        peak, reserved = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 0.0  # KiB on Linux
    every = [0.0] * n
    every[me] = peak
    every = _max_over_ranks(every, None)
    (reserved,) = _max_over_ranks([reserved], None)
    params = full_parameters(name, s.model)
    if me == 0:
        with open(a.rows, "w") as f:
            json.dump({"config": name, "peak_mib": max(every), "per_rank_mib": every, "reserved_mib": reserved}, f)
        torch.save(params, a.rows + ".pt")
    finish()


def max_difference(path: str, ref_path: str) -> float:
    import torch

    got, want = torch.load(path), torch.load(ref_path)
    if got.keys() != want.keys():
        raise SystemExit(f"gpu_training.py: {path}: parameters {sorted(got)} against dm's {sorted(want)}")
    return max(float((got[k] - want[k]).abs().max()) for k in want)


def memory(a) -> int:
    configs = a.configs.split(",") if a.configs else MEMORY_CONFIGS
    peaks = {c: [] for c in configs}
    reserved = {c: [] for c in configs}
    diffs = {c: [] for c in configs}
    broken = {}  # config -> why it did not run
    tmp = tempfile.mkdtemp(prefix="gpu_training-")
    try:
        for rnd in range(a.rounds):
            for c in configs:
                if c in broken:
                    continue  # a peer that does not run here is not tried again
                rows = os.path.join(tmp, f"{c}-{rnd}.json")
                passthrough = [*common_args(a), "--config", c, "--rows", rows]
                failed = ""
                try:
                    launch(a.ranks, passthrough, timeout=2 * a.job_timeout)
                except subprocess.CalledProcessError as e:
                    failed = f"the job exited {e.returncode} (its ranks' output is above)"
                except subprocess.TimeoutExpired:
                    failed = f"the job took over {2 * a.job_timeout} s"
                errors = sorted(p for p in os.listdir(tmp) if p.startswith(f"{c}-{rnd}.json.error"))
                if errors:  # the first rank's reason
                    with open(os.path.join(tmp, errors[0])) as f:
                        failed = f.read().strip()
                if failed:
                    broken[c] = failed
                    continue
                with open(rows) as f:
                    r = json.load(f)
                peaks[c].append(r["peak_mib"])
                reserved[c].append(r["reserved_mib"])
                print(f"memory round {rnd + 1} {c}: {r['peak_mib']:.0f} MiB per rank", file=sys.stderr, flush=True)
            ref = os.path.join(tmp, f"dm-{rnd}.json.pt")
            for c in configs:
                got = os.path.join(tmp, f"{c}-{rnd}.json.pt")
                if c != "dm" and os.path.exists(got) and os.path.exists(ref):
                    diffs[c].append(max_difference(got, ref))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return memory_table(a, configs, peaks, reserved, diffs, broken)


def memory_table(a, configs, peaks, reserved, diffs, broken) -> int:
    what = "torch.cuda.max_memory_allocated()" if a.device == "cuda" else "RSS (getrusage ru_maxrss, whole process)"
    print(
        f"\nmemory: {describe(a)}, Adam, {a.steps} steps, {a.ranks} ranks on {device_name(a)}; "
        f"peak {what} per rank, MiB (the largest rank's), median [min-max] of {a.rounds} round(s)"
    )
    heads = ("x dm", "x zero-ddp", "x fsdp2")
    print(
        f"  {'config':<9} {'peak MiB':<26}{'reserved':>9}  " + " ".join(f"{h:>10}" for h in heads) + "  max |d| vs dm"
    )
    med = {c: statistics.median(peaks[c]) for c in configs if peaks[c]}
    failed, rows = [], []
    for c in configs:
        if c in broken or not peaks[c]:
            why = broken.get(c, "no round ran")
            if c in PEERS:
                print(f"  {c}: does not run here: {why}")
            else:
                print(f"  {c}: FAILED: {why}")
                failed.append(c)
            rows.append({"ranks": a.ranks, "config": c, "error": why})
            continue
        m, lo, hi = median_spread(peaks[c])
        ratios = [f"{m / med[p]:.3f}" if p in med else "-" for p in ("dm", "zero-ddp", "fsdp2")]
        worst = max(diffs[c]) if diffs[c] else None
        check = "(reference)" if c == "dm" else "-" if worst is None else f"{worst:.2e}"
        if c not in PEERS and c != "dm":
            if worst is None or worst > a.tolerance:
                check += f"  FAILED: not dm's parameters (tolerance {a.tolerance:g})"
                failed.append(c)
            else:
                check += "  equal"
        res = f"{statistics.median(reserved[c]):9.1f}" if a.device == "cuda" else f"{'-':>9}"
        peak = f"{m:.1f} [{lo:.1f}-{hi:.1f}]"
        print(f"  {c:<9} {peak:<26}{res}  " + " ".join(f"{r:>10}" for r in ratios) + f"  {check}")
        rows.append(
            {
                "ranks": a.ranks,
                "config": c,
                "peak_mib": m,
                "peak_min_mib": lo,
                "peak_max_mib": hi,
                "reserved_mib": statistics.median(reserved[c]) if a.device == "cuda" else "",
                "max_abs_diff_vs_dm": "" if worst is None else worst,
                "ratio_to_zero_ddp": m / med["zero-ddp"] if "zero-ddp" in med else "",
                "ratio_to_fsdp2": m / med["fsdp2"] if "fsdp2" in med else "",
            }
        )
    print(f"CSV: {write_csv(a.out, f'gpu_training_memory_{a.ranks}ranks.csv', rows)}")
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


# ---- PowerSGD -----------------------------------------------------------------------


def powersgd_worker(a) -> None:
    import torch

    import hvdtorch as hvd

    dev, n, me = start(a)
    data = batches(a, me)
    prime = a.start_iter + 2  # past start_iter on both: every timed step is compressed
    compression = hvd.Compression.powersgd(rank=a.powersgd_rank, start_iter=a.start_iter)
    model = hvd.DistributedModel(mlp(a), compression=compression, name="gt.powersgd")
    setups = {"hvd powersgd": Setup(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))}
    setups["hvd powersgd"].steps(data, prime)
    notes, peer, why = {}, None, ""
    try:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        from torch.nn.parallel import DistributedDataParallel

        net = mlp(a)
        one_bucket = sum(p.numel() * p.element_size() for p in net.parameters()) / 2**20 + 1
        ddp = DistributedDataParallel(net, bucket_cap_mb=one_bucket)
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=a.powersgd_rank, start_powerSGD_iter=a.start_iter
        )
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        peer = Setup(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9))
        peer.steps(data, prime)
        dev.sync()
    except Exception as e:
        peer, why = None, first_line(e)
    if agreed(peer is not None):
        setups["ddp powersgd"] = peer
    else:
        notes["ddp powersgd"] = why or "it failed on another rank"
    rates = timed_rounds(a, setups, data, dev, n)
    rates.setdefault("ddp powersgd", [])
    if me == 0:
        title = (
            f"PowerSGD (rank {a.powersgd_rank}, start_iter {a.start_iter}): {describe(a)}, SGD with momentum, "
            f"{n} ranks on {dev.name}; samples/s, median (min-max) of {a.rounds} rounds of {a.steps} steps; "
            f"hvdtorch's compressor counted {compression.iteration} reduced steps"
        )
        rate_table(title, rates, "ddp powersgd", notes, n, a.out, f"gpu_training_powersgd_{n}ranks.csv")
    finish()


# ---- torch.compile ------------------------------------------------------------------


def compile_backend(a) -> str:
    """--backend, or inductor; on the CPU inductor writes C++: aot_eager where no compiler is found."""
    if a.backend:
        return a.backend
    if a.device == "cpu" and not any(
        shutil.which(c) for c in (os.environ.get("CXX", ""), "g++", "c++", "clang++") if c
    ):
        return "aot_eager"
    return "inductor"


def compile_worker(a) -> None:
    import torch
    from torch._dynamo.utils import counters

    import hvdtorch as hvd

    dev, n, me = start(a)
    data = batches(a, me)
    backend = compile_backend(a)
    setups = {}
    for kind in ("compiled", "eager"):
        dm = hvd.DistributedModel(mlp(a), name=f"gt.{kind}")
        forward = torch.compile(dm, backend=backend) if kind == "compiled" else dm
        setups[kind] = Setup(forward, torch.optim.SGD(dm.parameters(), lr=0.01, momentum=0.9), model=dm)
    # The first compiled step compiles (every rank at once): timed alone, the longest rank's.
    dev.sync()
    t0 = time.perf_counter()
    setups["compiled"].steps(data, 1)
    dev.sync()
    (compile_s,) = _max_over_ranks([time.perf_counter() - t0], None)
    setups["compiled"].steps(data, 2)
    setups["eager"].steps(data, 3)
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    rates = timed_rounds(a, setups, data, dev, n)
    if me == 0:
        title = (
            f"torch.compile(DistributedModel) (backend {backend}"
            + (", chosen: no C++ compiler here" if backend == "aot_eager" and not a.backend else "")
            + f"): {describe(a)}, SGD with momentum, {n} ranks on {dev.name}; samples/s, median (min-max) of "
            f"{a.rounds} rounds of {a.steps} steps; the first compiled step {compile_s:.1f} s, not timed "
            f"(dynamo graphs {graphs}, graph breaks {breaks})"
        )
        rate_table(title, rates, "eager", {}, n, a.out, f"gpu_training_compile_{n}ranks.csv")
    finish()


# ---- command line -------------------------------------------------------------------


def common_args(a):
    """The options every worker takes, as given."""
    return [
        a.what,
        f"--device={a.device}",
        f"--width={a.width}",
        f"--layers={a.layers}",
        f"--batch={a.batch}",
        f"--steps={a.steps}",
        f"--rounds={a.rounds}",
        f"--job-timeout={a.job_timeout}",
        f"--tolerance={a.tolerance}",
        f"--powersgd-rank={a.powersgd_rank}",
        f"--start-iter={a.start_iter}",
        f"--backend={a.backend}",
        f"--out={a.out}",
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["memory", "powersgd", "compile"])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--width", type=int, default=MLP_WIDTH, help="the MLP's width (default: zero3.py's)")
    p.add_argument("--layers", type=int, default=MLP_LAYERS, help="the MLP's Linear layers (default: zero3.py's)")
    p.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    p.add_argument("--steps", type=int, default=10, help="steps per round (memory: per job)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--configs", default="", help=f"memory: some of {','.join(MEMORY_CONFIGS)} (default: all)")
    p.add_argument("--tolerance", type=float, default=1e-5, help="memory: largest parameter difference from dm's")
    p.add_argument(
        "--job-timeout", type=int, default=120, help="seconds a rank waits in a collective (memory: a job, twice it)"
    )
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--start-iter", type=int, default=2, help="powersgd: exact steps first (torch's hook needs 2+)")
    p.add_argument("--backend", default="", help="compile: torch.compile's backend (default: see above)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "gpu_training"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--rows", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        {"memory": memory_worker, "powersgd": powersgd_worker, "compile": compile_worker}[a.what](a)
        return 0
    if a.what == "powersgd" and a.start_iter < 2:
        p.error(
            "--start-iter: torch's PowerSGD hook takes 2 or more (error feedback and warm start need 2 exact steps)"
        )
    unknown = set(a.configs.split(",")) - set(MEMORY_CONFIGS) - {""}
    if unknown:
        p.error(f"--configs: unknown {sorted(unknown)}; choose from {MEMORY_CONFIGS}")
    if a.what == "memory":
        return memory(a)
    launch(a.ranks, common_args(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
