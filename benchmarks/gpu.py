"""GPU benchmarks (make gpu-check PHASE=bench runs them on the GPU machine).

    python benchmarks/gpu.py allreduce --ranks 1,2 --max-bytes 256M --out DIR
    python benchmarks/gpu.py googlenet --ranks 1,2 --out DIR

allreduce: float32 Sum all-reduce on cuda:0 per route, each against the
device-to-device copy of the same bytes (one cudaMemcpy on the GPU: the
physical reference) and a peer in the same processes. At one rank: NCCL
through hvdtorch (reducer="native") and NCCL called directly
(torch.distributed); at two ranks sharing the GPU (NCCL refuses two ranks on
one GPU): the device ring over CUDA IPC (reducer="ring"), staging through
pinned host memory (reducer="node": the host reduction in shared memory;
reducer="central"), reducer="auto", and torch.distributed's Gloo on the same
CUDA tensors (--routes: some of them). Per size (--min-bytes, 4 KiB, .. --max-bytes,
x4): the median time of --reps
interleaved rounds (a barrier before each, the GPU drained after), its
min-max, algbw = bytes / time, busbw = algbw * 2(n-1)/n (at one rank:
algbw), and busbw over the copy's bandwidth (bytes / copy time). Every
route's result is checked once per size before its times count. Which route
auto took at each size is read off the engine's counters (device ring runs,
NCCL runs, one-rank runs kept on the device; none: staged) in the last round and set beside the fastest
measured route; rank 0 also prints auto's calibration. CSV (and a PNG where matplotlib imports)
under --out.

googlenet: torchvision's GoogLeNet (benchmarks/workloads), batch 128 per
rank, 224 px synthetic images, SGD with momentum: images/s of the bare model
and of DistributedModel at one rank (the overhead), and at two ranks sharing
the GPU DistributedModel against DDP (Gloo: NCCL cannot share a GPU) and
hvd.DistributedOptimizer; interleaved rounds (a barrier before each), medians
with min-max. --profile then runs 3 steps of DistributedModel and of DDP
under torch.profiler and prints where they went (profile_steps).

--device cpu runs both on CPU tensors (memcpy as the copy, Gloo where NCCL
would be), which only checks the script itself on a machine without a GPU.
"""

import argparse
import csv
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPY = "d2d copy"


def parse_bytes(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def launch(nranks: int, args) -> None:
    """Runs this script's worker mode on `nranks` processes (torchrun)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nranks}", __file__, *args, "--worker"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run(cmd, check=True, env=env, timeout=900)


def median_spread(xs):
    return statistics.median(xs), min(xs), max(xs)


class Device:
    """cuda:0, or the CPU for --device cpu."""

    def __init__(self, kind: str):
        import torch

        self.torch = torch
        self.cuda = kind == "cuda"
        self.name = "cuda:0" if self.cuda else "cpu"
        if self.cuda:
            torch.cuda.set_device(0)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()


# ---- all-reduce -----------------------------------------------------------------


def routes(n: int):
    """(label, how) for this many ranks; how: ("hvd", reducer) or ("torch", group name). On CUDA
    tensors hvd native is NCCL, hvd ring the device ring, hvd node and central are staged."""
    if n == 1:
        return [("hvd native", ("hvd", "native")), ("hvd auto", ("hvd", "auto")), ("torch nccl", ("torch", "nccl"))]
    return [
        ("hvd ring", ("hvd", "ring")),
        ("hvd node", ("hvd", "node")),
        ("hvd central", ("hvd", "central")),
        ("hvd auto", ("hvd", "auto")),
        ("torch gloo", ("torch", "gloo")),
    ]


def allreduce_worker(a) -> None:
    import torch
    import torch.distributed as dist

    import hvdtorch as hvd
    from hvdtorch import _C

    dev = Device(a.device)
    dist.init_process_group("gloo")
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    groups = {"gloo": dist.group.WORLD}
    if n == 1:
        groups["nccl"] = dist.new_group(backend="nccl" if dev.cuda else "gloo")
    table = [r for r in routes(n) if not a.routes or r[0] in a.routes.split(",")]
    sizes, b = [], a.min_bytes
    while b <= a.max_bytes:
        sizes.append(b)
        b *= 4
    rows, auto_routes = [], {}
    for size in sizes:
        x = torch.ones(size // 4, dtype=torch.float32, device=dev.name)
        dst = torch.empty_like(x)
        labels = [label for label, _ in table] + [COPY]
        times = {label: [] for label in labels}
        reps = a.reps if size < (256 << 20) else max(3, a.reps // 2)
        for rep in range(reps + 1):  # the first round warms up, checks the results and is dropped
            for label, how in table + [(COPY, None)]:
                x.fill_(1.0)
                dev.sync()
                dist.barrier()
                counters = (_C.device_ring_runs(), _C.device_native_runs(), _C.device_one_rank_runs())
                t0 = time.perf_counter()
                if how is None:
                    dst.copy_(x)
                elif how[0] == "hvd":
                    hvd.allreduce_(x, op=hvd.Sum, name=f"bench.{how[1]}.{size}", reducer=how[1])
                else:
                    dist.all_reduce(x, group=groups[how[1]])
                dev.sync()
                took = time.perf_counter() - t0
                if rep == 0 and how is not None:
                    lo, hi = float(x.min()), float(x.max())
                    assert lo == hi == n, f"{label} at {size} B: the sum is {lo}..{hi}, not {n}"
                if rep == reps and how == ("hvd", "auto"):
                    # The last round: the first may hold the calibration, which runs every route.
                    ring, native = _C.device_ring_runs() - counters[0], _C.device_native_runs() - counters[1]
                    kept = _C.device_one_rank_runs() - counters[2]
                    route = "device ring" if ring else "NCCL" if native else "on the device" if kept else "staged"
                    auto_routes[size] = route
                if rep:
                    times[label].append(took)
        copy_median = statistics.median(times[COPY])
        for label, ts in times.items():
            med, lo, hi = median_spread(ts)
            algbw = size / med / 1e9
            bus = algbw * (2 * (n - 1) / n if label != COPY and n > 1 else 1.0)
            rows.append(
                {
                    "ranks": n,
                    "bytes": size,
                    "route": label,
                    "median_s": med,
                    "min_s": lo,
                    "max_s": hi,
                    "algbw_GBps": algbw,
                    "busbw_GBps": bus,
                    "busbw_over_copy": bus / (size / copy_median / 1e9),
                    "auto_took": auto_routes.get(size, "") if label == "hvd auto" else "",
                }
            )
    if me == 0:
        report_allreduce(rows, a.out, n, dev.name, _C.last_device_calibration())
    hvd.shutdown()
    dist.destroy_process_group()


def report_allreduce(rows, out: str, n: int, where: str, calibration: str) -> None:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"gpu_allreduce_{n}ranks.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    labels = list(dict.fromkeys(r["route"] for r in rows))
    by = {(r["bytes"], r["route"]): r for r in rows}
    kind = "busbw" if n > 1 else "algbw"
    print(f"\nall-reduce on {where}, {n} rank(s): {kind} GB/s (median; min-max in the CSV), x: over the copy's")
    print(f"auto's calibration: {calibration or '(none ran)'}")
    print(f"  {'bytes':>10} " + " ".join(f"{label:>16}" for label in labels) + "  auto took")
    for size in sorted({r["bytes"] for r in rows}):
        cells = [
            f"{by[(size, label)]['busbw_GBps']:9.2f} {by[(size, label)]['busbw_over_copy']:4.2f}x" for label in labels
        ]
        routes_here = [by[(size, label)] for label in labels if label.startswith("hvd ") and label != "hvd auto"]
        verdict = ""
        if (size, "hvd auto") in by and routes_here:  # --routes may leave auto or its peers out
            best = min(routes_here, key=lambda r: r["median_s"])
            auto = by[(size, "hvd auto")]
            verdict = f"{auto['auto_took']}, {auto['median_s'] / best['median_s']:.2f}x the time of {best['route']}"
        print(f"  {size:>10} " + " ".join(f"{c:>16}" for c in cells) + "  " + verdict)
    print(f"CSV: {path}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot: matplotlib does not import here; CSV only")
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for label in labels:
        pts = sorted((r["bytes"], r["busbw_GBps"]) for r in rows if r["route"] == label)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes")
    ax.set_ylabel("busbw GB/s" if n > 1 else "algbw GB/s")
    ax.set_title(f"all-reduce on {where}, {n} rank(s)")
    ax.legend()
    fig.savefig(os.path.join(out, f"gpu_allreduce_{n}ranks.png"), dpi=120)


# ---- GoogLeNet --------------------------------------------------------------------


def googlenet_worker(a) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import hvdtorch as hvd
    from benchmarks.workloads.models import googlenet, googlenet_source

    dev = Device(a.device)
    dist.init_process_group("gloo")
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    torch.manual_seed(0)
    x = torch.randn(a.batch, 3, a.image, a.image, device=dev.name)
    y = torch.randint(0, 100, (a.batch,), device=dev.name)

    def make(kind):
        torch.manual_seed(0)
        model = googlenet(100).to(dev.name)
        if kind == "hvdtorch":
            model = hvd.DistributedModel(model)
        elif kind == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if kind == "hvd optimizer":
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        return model, opt

    kinds = ["bare", "hvdtorch"] if n == 1 else ["hvdtorch", "ddp", "hvd optimizer"]
    setups = {k: make(k) for k in kinds}
    rates = {k: [] for k in kinds}
    for rnd in range(a.rounds + 1):  # round 0 warms up
        for k in kinds:
            model, opt = setups[k]
            dev.sync()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
            dev.sync()
            if rnd:
                rates[k].append(a.steps * a.batch * n / (time.perf_counter() - t0))
    if a.profile and n > 1:
        profile_steps(a, setups, x, y, dev, me)
    if me == 0:
        ref = "bare" if n == 1 else "ddp"
        print(
            f"\nGoogLeNet ({googlenet_source()}), batch {a.batch} per rank, {a.image} px, {n} rank(s) on {dev.name}; "
            f"images/s, median (min-max) of {a.rounds} rounds of {a.steps} steps"
        )
        rows = []
        for k in kinds:
            med, lo, hi = median_spread(rates[k])
            ratio = med / statistics.median(rates[ref])
            print(f"  {k:<14} {med:9.1f} ({lo:.1f}-{hi:.1f})  {ratio:.3f}x {ref}")
            rows.append(
                {"ranks": n, "kind": k, "median_ips": med, "min_ips": lo, "max_ips": hi, f"ratio_to_{ref}": ratio}
            )
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"gpu_googlenet_{n}ranks.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    hvd.shutdown()
    dist.destroy_process_group()


def profile_steps(a, setups, x, y, dev, me) -> None:
    """--profile: where a step of DistributedModel and of DDP goes, from
    torch.profiler over 3 steps each (after the timed rounds): rank 0 prints
    the step's wall time, the time the GPU was busy with this process's
    kernels and copies, and the operators that took the most GPU and CPU
    time; the full tables go to profile_<kind>.txt under --out."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.cuda else [])
    for kind in ("hvdtorch", "ddp"):
        model, opt = setups[kind]
        dev.sync()
        dist.barrier()
        with profile(activities=activities) as prof:
            t0 = time.perf_counter()
            for _ in range(3):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
            dev.sync()
            wall = (time.perf_counter() - t0) / 3
        if me != 0:
            continue
        events = prof.key_averages()
        device_us = sum(getattr(e, "self_device_time_total", 0) or 0 for e in events) / 3
        by_device = events.table(sort_by="self_device_time_total" if dev.cuda else "self_cpu_time_total", row_limit=25)
        by_cpu = events.table(sort_by="self_cpu_time_total", row_limit=25)
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"profile_{kind.replace(' ', '_')}.txt"), "w") as f:
            f.write(f"{kind}: {wall * 1e3:.1f} ms per step, device busy {device_us / 1e3:.1f} ms\n\n")
            f.write(by_device + "\n\n" + by_cpu + "\n")
        print(
            f"\nprofile {kind}: {wall * 1e3:.1f} ms per step (rank 0), GPU busy with its work {device_us / 1e3:.1f} ms"
        )
        for line in by_device.splitlines()[:14]:
            print("  " + line[:150])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["allreduce", "googlenet"])
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--max-bytes", type=parse_bytes, default=parse_bytes("256M"))
    p.add_argument("--min-bytes", type=parse_bytes, default=parse_bytes("4K"), help="all-reduce: smallest size (x4)")
    p.add_argument("--routes", default="", help="all-reduce: comma-separated route labels to run (default: all)")
    p.add_argument("--profile", action="store_true", help="googlenet: torch.profiler over 3 steps at 2+ ranks")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "gpu"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        (allreduce_worker if a.what == "allreduce" else googlenet_worker)(a)
        return
    passthrough = [
        a.what,
        f"--device={a.device}",
        f"--max-bytes={a.max_bytes}",
        f"--min-bytes={a.min_bytes}",
        f"--routes={a.routes}",
        *(["--profile"] if a.profile else []),
        f"--reps={a.reps}",
        f"--batch={a.batch}",
        f"--image={a.image}",
        f"--steps={a.steps}",
        f"--rounds={a.rounds}",
        f"--out={a.out}",
    ]
    for n in (int(r) for r in a.ranks.split(",")):
        launch(n, passthrough)


if __name__ == "__main__":
    main()
