"""GPU benchmarks (make gpu-check runs them on the GPU machine).

    python benchmarks/gpu.py allreduce --ranks 2 --max-bytes 1G --out DIR
    python benchmarks/gpu.py googlenet --out DIR

allreduce: every hvdtorch reducer on CUDA tensors against torch.distributed's
Gloo on the same CUDA tensors, in the same processes (ranks share cuda:0:
NCCL refuses two ranks on one GPU), and NCCL at one rank in a separate job;
with the device-to-device copy bandwidth (bytes / time of one copy) as the
physical reference. Per size (4 KiB .. --max-bytes, x4): median time of
--reps interleaved rounds (a barrier before each), its min-max spread,
algbw = bytes / time, busbw = algbw * 2(n-1)/n, and each reducer's busbw
ratio to Gloo's. CSV (and a PNG where matplotlib imports) under --out.

googlenet: GoogLeNet (benchmarks/workloads: torchvision's where it imports),
batch 128 per rank, 112 px synthetic images, SGD: images/s of the bare model
and of DistributedModel at one rank (the overhead), and at two ranks sharing
the GPU, DistributedModel against DDP (Gloo: NCCL cannot share a GPU) and
hvd.DistributedOptimizer, interleaved rounds, medians with spread.
"""

import argparse
import csv
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REDUCERS = ["ring", "central", "node", "auto"]


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


# ---- all-reduce -----------------------------------------------------------------


def allreduce_worker(a) -> None:
    import torch
    import torch.distributed as dist

    import hvdtorch as hvd

    torch.cuda.set_device(0)
    dist.init_process_group("gloo")
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    nccl = dist.new_group(backend="nccl") if n == 1 else None
    sizes, b = [], 4 << 10
    while b <= a.max_bytes:
        sizes.append(b)
        b *= 4
    impls = [f"hvd:{r}" for r in REDUCERS] + (["nccl"] if nccl is not None else ["gloo"])
    rows = []
    for size in sizes:
        x = torch.ones(size // 4, dtype=torch.float32, device="cuda:0")
        dst = torch.empty_like(x)
        times = {i: [] for i in impls + ["d2d copy"]}
        reps = a.reps if size < (256 << 20) else max(3, a.reps // 2)
        for rep in range(reps + 1):  # the first round warms up and is dropped
            for impl in impls + ["d2d copy"]:
                torch.cuda.synchronize()
                dist.barrier()
                t0 = time.perf_counter()
                if impl.startswith("hvd:"):
                    hvd.allreduce_(x, op=hvd.Sum, name=f"bench.{size}", reducer=impl[4:])
                elif impl == "gloo":
                    dist.all_reduce(x)
                elif impl == "nccl":
                    dist.all_reduce(x, group=nccl)
                else:
                    dst.copy_(x)
                torch.cuda.synchronize()
                if rep:
                    times[impl].append(time.perf_counter() - t0)
                x.fill_(1.0)
        for impl, ts in times.items():
            med, lo, hi = median_spread(ts)
            algbw = size / med / 1e9
            bus = algbw * (2 * (n - 1) / n if impl != "d2d copy" else 1.0)
            rows.append(
                {
                    "ranks": n,
                    "bytes": size,
                    "impl": impl,
                    "median_s": med,
                    "min_s": lo,
                    "max_s": hi,
                    "algbw_GBps": algbw,
                    "busbw_GBps": bus,
                }
            )
    if me == 0:
        report_allreduce(rows, a.out, n)
    hvd.shutdown()
    dist.destroy_process_group()


def report_allreduce(rows, out: str, n: int) -> None:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"gpu_allreduce_{n}ranks.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    peer = "gloo" if n > 1 else "nccl"
    print(f"\nall-reduce on cuda:0, {n} rank(s); busbw GB/s (median, min-max of rounds); ratio to {peer}")
    by = {(r["bytes"], r["impl"]): r for r in rows}
    for size in sorted({r["bytes"] for r in rows}):
        ref = by.get((size, peer))
        cells = []
        for impl in [f"hvd:{x}" for x in REDUCERS] + [peer, "d2d copy"]:
            r = by[(size, impl)]
            bw = r["busbw_GBps"] if n > 1 or impl == "d2d copy" else r["algbw_GBps"]
            ratio = f" {ref['median_s'] / r['median_s']:.2f}x" if ref and impl.startswith("hvd:") else ""
            cells.append(f"{impl} {bw:.2f}{ratio}")
        print(f"  {size:>11} B: " + " | ".join(cells))
    print(f"CSV: {path}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot: matplotlib does not import here; CSV only")
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for impl in sorted({r["impl"] for r in rows}):
        pts = sorted((r["bytes"], r["busbw_GBps"] if n > 1 else r["algbw_GBps"]) for r in rows if r["impl"] == impl)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes")
    ax.set_ylabel("busbw GB/s" if n > 1 else "algbw GB/s")
    ax.set_title(f"all-reduce on one GPU, {n} rank(s)")
    ax.legend()
    fig.savefig(os.path.join(out, f"gpu_allreduce_{n}ranks.png"), dpi=120)


# ---- GoogLeNet --------------------------------------------------------------------


def googlenet_worker(a) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import hvdtorch as hvd
    from benchmarks.workloads.models import googlenet

    torch.cuda.set_device(0)
    dist.init_process_group("gloo")
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    torch.manual_seed(0)
    x = torch.randn(a.batch, 3, 112, 112, device="cuda:0")
    y = torch.randint(0, 100, (a.batch,), device="cuda:0")

    def make(kind):
        model = googlenet(100).cuda()
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
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
            torch.cuda.synchronize()
            if rnd:
                rates[k].append(a.steps * a.batch * n / (time.perf_counter() - t0))
    if me == 0:
        ref = "bare" if n == 1 else "ddp"
        print(f"\nGoogLeNet, batch {a.batch} per rank, {n} rank(s) on cuda:0; images/s (median, min-max)")
        rows = []
        for k in kinds:
            med, lo, hi = median_spread(rates[k])
            ratio = statistics.median(rates[k]) / statistics.median(rates[ref])
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["allreduce", "googlenet"])
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--max-bytes", type=parse_bytes, default=parse_bytes("1G"))
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--batch", type=int, default=128)
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
        f"--max-bytes={a.max_bytes}",
        f"--reps={a.reps}",
        f"--batch={a.batch}",
        f"--steps={a.steps}",
        f"--rounds={a.rounds}",
        f"--out={a.out}",
    ]
    for n in (int(r) for r in a.ranks.split(",")):
        launch(n, passthrough)


if __name__ == "__main__":
    main()
