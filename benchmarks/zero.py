"""Sharded optimizer benchmark (ZeRO stages 1 and 2): optimizer-state bytes
and peak RSS per rank, and training throughput with Adam, against
DistributedModel, torch DDP and DDP + torch's ZeroRedundancyOptimizer, in
the same job.

    python benchmarks/zero.py --ranks 2 --settings comm,compute --rounds 7 --iters 10
    python benchmarks/zero.py --memory-only --settings comm --memory-rounds 5   # peak RSS only
    python benchmarks/zero.py --plot benchmarks/results/zero      # the plot of earlier runs

Configurations (all with torch.optim.Adam, lr 1e-4):
  dm        hvd.DistributedModel (all-reduce, P+F), the plain optimizer
  shard1    hvd.DistributedModel + hvd.DistributedOptimizer(shard=1): buckets are
            all-reduced during backward, each rank steps its shard, parameters
            are all-gathered
  shard2    hvd.DistributedModel + hvd.DistributedOptimizer(shard=2): buckets are
            reduce-scattered during backward, each rank steps its shard
  shard1-overlap, shard2-overlap
            the same with overlap_gathers=True: step() returns before the
            parameters are gathered, each forward waits for its own (not in the
            default --configs)
  shard1-plainheap, shard2-plainheap
            the default without its malloc settings: glibc's dynamic mmap
            threshold stays on (hvdtorch.zero.host_heap.fix_mmap_threshold
            replaced by a no-op); for memory jobs, which run each
            configuration alone (in a throughput job the settings are
            process-wide: the first sharded step fixes them for every
            configuration). Not in the default --configs
  shard1-alwaystrim, shard2-alwaystrim
            the default, and the heap trimmed (malloc_trim) after every
            step, as an earlier version did (not in the default --configs)
  ddp       torch DistributedDataParallel (Gloo), the plain optimizer
  zero-ddp  DDP + torch.distributed.optim.ZeroRedundancyOptimizer (ZeRO-1 on DDP)

Settings: benchmarks/googlenet.py's (comm: FCHeavyNet, 12.7 M parameters,
32 px, batch 8; compute: GoogLeNet, 64 px, batch 16; small: GoogLeNet 32 px).

Method. Throughput: one torchrun job per setting builds every configuration
once, then runs --rounds rounds of interleaved windows (A B C D E, A B C D E,
...), each window --warmup untimed steps then --iters timed steps between two
barriers on a Gloo group of its own (benchmarks/googlenet.py's measure_window);
img/s = ranks x batch x iters / the longest rank's window; median [min-max]
over rounds. Memory: one short torchrun job per configuration and round
(peak RSS is a process's high-water mark, so configurations cannot share a
process), --memory-rounds rounds interleaved (A B C D E, A B C D E, ...):
the bytes of optimizer state on each rank after the first step, and each
rank's peak RSS (ru_maxrss) after --iters steps, the largest rank's; median
[min-max] over rounds. RSS counts a shared page in every process that maps
it: a rank that reads its peers' registered buffers in place (the node
reducer's zero-copy path: DistributedModel's buckets, the sharded
optimizer's buckets) counts the pages it read. PSS after the last step
(/proc/self/smaps_rollup: shared pages split between the processes mapping
them) is reported beside it. "of state saved": (dm's peak RSS - this
configuration's) / (dm's state - this configuration's), the part of the
optimizer state a rank no longer holds that the peak RSS follows down.
Rows go to --out/<setting>.jsonl (one per configuration, throughput and
memory together; --memory-only: memory alone) and the plot to
--out/zero.png.
"""

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import hvdtorch as hvd  # noqa: E402
from benchmarks.googlenet import NUM_CLASSES, SETTINGS, build_model, measure_window, train_steps  # noqa: E402
from benchmarks.workloads import image_batches  # noqa: E402

CONFIGS = ["dm", "shard1", "shard2", "ddp", "zero-ddp"]
# Measured when asked for by --configs.
OPT_IN = [f"shard{s}-{v}" for v in ("overlap", "plainheap", "alwaystrim") for s in (1, 2)]
LR = 1e-4


class Config:
    """A configuration's model, optimizer, sync() after backward and step()."""

    def __init__(self, name, setting, size):
        self.name = name
        self.model = build_model(setting)
        self.sync = lambda: None  # DDP waits inside backward
        if name in ("ddp", "zero-ddp") and size > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.model = DistributedDataParallel(self.model)
        if name == "zero-ddp" and size > 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            self.opt = ZeroRedundancyOptimizer(self.model.parameters(), optimizer_class=torch.optim.Adam, lr=LR)
        else:
            self.opt = torch.optim.Adam(self.model.parameters(), lr=LR)
        if name == "dm" or name.startswith("shard"):
            self.model = hvd.DistributedModel(self.model, sync="explicit", name=f"zero.{name}")
            self.sync = self.model.sync_gradients
        if name.startswith("shard"):
            overlap = name.endswith("-overlap")
            self.opt = hvd.DistributedOptimizer(self.opt, shard=int(name[5]), overlap_gathers=overlap)
            self.sync = self.opt.synchronize
        self.step = self.opt.step
        if name.endswith(("-plainheap", "-alwaystrim")):
            self.step = _heap_variant(self.opt.step, name.split("-")[1])

    def state_bytes(self) -> int:
        if isinstance(self.opt, hvd.ShardedOptimizer):
            return self.opt.state_bytes()
        opt = getattr(self.opt, "optim", self.opt)  # ZeroRedundancyOptimizer's local optimizer
        return sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if torch.is_tensor(v))


def _heap_variant(step, variant):
    """step() of a -plainheap or -alwaystrim configuration (the A/B of
    zero/host_heap.py; the other configurations keep the default)."""
    import ctypes

    from hvdtorch.zero import host_heap

    if variant == "plainheap":
        host_heap.fix_mmap_threshold = lambda: None  # this process runs this configuration alone
        return step
    trim = ctypes.CDLL(None).malloc_trim

    def trimmed_step(*args, **kwargs):
        loss = step(*args, **kwargs)
        trim(0)
        return loss

    return trimmed_step


def _max_over_ranks(values, group):
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def worker_throughput(args):
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    group = dist.new_group(backend="gloo")
    s = SETTINGS[args.setting]
    configs = args.configs.split(",")
    built = {name: Config(name, args.setting, size) for name in configs}
    data = {name: image_batches(None, s["image_size"], s["batch"], NUM_CLASSES, rank, size) for name in configs}
    windows = {name: [] for name in configs}
    for rnd in range(args.rounds):
        for name in configs:
            elapsed, _ = measure_window(built[name], data[name], args, group)
            windows[name].append(size * s["batch"] * args.iters / elapsed)
            if rank == 0:
                print(f"round {rnd + 1} {name}: {windows[name][-1]:.1f} img/s", file=sys.stderr, flush=True)
    if rank == 0:
        with open(args.rows, "w") as f:
            for name in configs:
                rates = windows[name]
                row = dict(config=name, img_per_s=statistics.median(rates), img_per_s_min=min(rates))
                row.update(img_per_s_max=max(rates), img_per_s_rounds=rates)
                f.write(json.dumps(row) + "\n")
    hvd.shutdown()


def worker_memory(args):
    hvd.init()
    size = hvd.size()
    group = dist.new_group(backend="gloo")
    s = SETTINGS[args.setting]
    cfg = Config(args.configs, args.setting, size)
    data = image_batches(None, s["image_size"], s["batch"], NUM_CLASSES, hvd.rank(), size)
    train_steps(cfg, data, 1)
    per_rank = torch.tensor([float(cfg.state_bytes())], dtype=torch.float64)
    every = [torch.zeros(1, dtype=torch.float64) for _ in range(size)]
    dist.all_gather(every, per_rank, group=group)
    train_steps(cfg, data, args.iters)
    rss_kib, pss_kib = _max_over_ranks([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, _pss_kib()], group)
    params = sum(p.numel() for p in cfg.model.parameters())
    if hvd.rank() == 0:
        with open(args.rows, "w") as f:
            row = dict(config=args.configs, state_bytes_per_rank=[int(t.item()) for t in every])
            row.update(peak_rss_mib=rss_kib / 1024, pss_mib=pss_kib / 1024, parameters=params)
            f.write(json.dumps(row) + "\n")
    hvd.shutdown()


def _pss_kib() -> float:
    """This process's proportional set size now (0 where the kernel does not say)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args, mode, configs, rows):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.ranks}"]
    cmd += [f"--master_port={free_port()}"]
    cmd += [os.path.abspath(__file__), "--worker", mode, "--setting", args.setting, "--configs", configs]
    cmd += ["--rounds", str(args.rounds), "--iters", str(args.iters), "--warmup", str(args.warmup), "--rows", rows]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run(cmd, check=True, env=env)
    with open(rows) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_setting(args):
    configs = args.configs.split(",")
    tmp = os.path.join(args.out, f".rows-{os.getpid()}")
    rows = {name: {"config": name} for name in configs}
    if not args.memory_only:
        rows = {r["config"]: r for r in torchrun(args, "throughput", args.configs, tmp)}
    runs = {name: [] for name in configs}
    for rnd in range(args.memory_rounds):
        for name in configs:
            (mem,) = torchrun(args, "memory", name, tmp)
            runs[name].append(mem)
            print(f"memory round {rnd + 1} {name}: peak RSS {mem['peak_rss_mib']:.0f} MiB", file=sys.stderr)
    os.remove(tmp)
    out = []
    for name in configs:
        r = rows[name]
        peaks = [m["peak_rss_mib"] for m in runs[name]]
        r.update(runs[name][0])
        r.update(peak_rss_mib=statistics.median(peaks), peak_rss_mib_min=min(peaks), peak_rss_mib_max=max(peaks))
        r.update(peak_rss_mib_rounds=peaks, pss_mib=statistics.median(m["pss_mib"] for m in runs[name]))
        r.update(setting=args.setting, ranks=args.ranks, rounds=args.rounds, iters=args.iters, cores=os.cpu_count())
        r.update(memory_rounds=args.memory_rounds)
        out.append(r)
    with open(os.path.join(args.out, f"{args.setting}.jsonl"), "a") as f:
        for r in out:
            f.write(json.dumps(r) + "\n")
    if not args.memory_only:
        print_table(out)
    print_memory_table(out)
    return out


def print_memory_table(rows):
    by = {r["config"]: r for r in rows}
    first = rows[0]
    print(
        f"\n{first['setting']}, {first['ranks']} ranks, Adam, {first['iters']} steps: peak RSS per rank (the largest "
        f"rank's) median [min-max] of {first['memory_rounds']} rounds"
    )
    print("  config      state MiB/rank  peak RSS MiB            PSS MiB  vs dm MiB  of state saved  vs zero-ddp MiB")
    for r in rows:
        state = max(r["state_bytes_per_rank"]) / 2**20
        line = (
            f"  {r['config']:<11} {state:8.1f}       {r['peak_rss_mib']:6.0f} [{r['peak_rss_mib_min']:.0f}-"
            f"{r['peak_rss_mib_max']:.0f}]   {r['pss_mib']:7.0f}"
        )
        if "dm" in by and r["config"] != "dm":
            dm = by["dm"]
            saved_rss = dm["peak_rss_mib"] - r["peak_rss_mib"]
            saved_state = max(dm["state_bytes_per_rank"]) / 2**20 - state
            ratio = f"{saved_rss / saved_state:.2f}" if saved_state > 0 else "-"
            line += f"  {-saved_rss:+9.0f}  {ratio:>14}"
        if "zero-ddp" in by and r["config"] != "zero-ddp":
            line += f"  {r['peak_rss_mib'] - by['zero-ddp']['peak_rss_mib']:+15.0f}"
        print(line)


def print_table(rows):
    by = {r["config"]: r for r in rows}
    unsharded = by.get("dm", rows[0])["state_bytes_per_rank"][0]
    first = rows[0]
    print(f"\n{first['setting']}, {first['ranks']} ranks, Adam: img/s median [min-max] of {first['rounds']} rounds")
    print("  config      img/s                      state MiB/rank (of unsharded)  peak RSS MiB  ratios")
    for r in rows:
        ratios = [f"{r['img_per_s'] / by[p]['img_per_s']:.2f}x {p}" for p in ("dm", "ddp", "zero-ddp") if p in by]
        state = max(r["state_bytes_per_rank"])
        print(
            f"  {r['config']:<9} {r['img_per_s']:7.1f} [{r['img_per_s_min']:.1f}-{r['img_per_s_max']:.1f}]"
            f"   {state / 2**20:8.2f} ({state / unsharded:.3f})          {r['peak_rss_mib']:8.0f}   "
            + ", ".join(x for x in ratios if not x.endswith(" " + r["config"]))
        )


def plot(folder):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = sorted(f[:-6] for f in os.listdir(folder) if f.endswith(".jsonl"))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    width = 0.8 / max(len(settings), 1)
    for k, setting in enumerate(settings):
        with open(os.path.join(folder, f"{setting}.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        latest, timed = {}, {}
        for r in rows:  # the last run of each configuration (with throughput: the last timed one)
            latest[r["config"]] = r
            if "img_per_s" in r:
                timed[r["config"]] = r
        names = [c for c in CONFIGS + OPT_IN if c in latest]
        xs = [i + k * width for i in range(len(names))]
        med = [timed[c]["img_per_s"] if c in timed else 0.0 for c in names]
        err = [[m - timed[c]["img_per_s_min"] if c in timed else 0.0 for m, c in zip(med, names)]]
        err.append([timed[c]["img_per_s_max"] - m if c in timed else 0.0 for m, c in zip(med, names)])
        axes[0].bar(xs, med, width, yerr=err, capsize=3, label=setting)
        axes[1].bar(xs, [max(latest[c]["state_bytes_per_rank"]) / 2**20 for c in names], width, label=setting)
        axes[2].bar(xs, [latest[c]["peak_rss_mib"] for c in names], width, label=setting)
        for ax in axes:
            ax.set_xticks([i + width * (len(settings) - 1) / 2 for i in range(len(names))], names)
    ranks = latest[names[0]]["ranks"]
    axes[0].set_ylabel(f"images / s ({ranks} ranks, median, min-max)")
    axes[1].set_ylabel("Adam state per rank (MiB)")
    axes[2].set_ylabel("peak RSS per rank (MiB)")
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Sharded optimizer (ZeRO-1/2) against DistributedModel, DDP and DDP + ZeroRedundancyOptimizer")
    fig.tight_layout()
    path = os.path.join(folder, "zero.png")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--settings", default="comm,compute", help="comma list of benchmarks/googlenet.py's settings")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--memory-rounds", type=int, default=1, help="memory jobs per configuration")
    p.add_argument("--memory-only", action="store_true", help="measure memory alone, no throughput")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "zero"))
    p.add_argument("--plot", metavar="FOLDER", help="only plot the rows in FOLDER")
    p.add_argument("--worker", choices=["throughput", "memory"], help=argparse.SUPPRESS)
    p.add_argument("--setting", help=argparse.SUPPRESS)
    p.add_argument("--rows", help=argparse.SUPPRESS)
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.worker:
        (worker_throughput if args.worker == "throughput" else worker_memory)(args)
        return
    if args.plot:
        plot(args.plot)
        return
    unknown = set(args.configs.split(",")) - set(CONFIGS + OPT_IN)
    if unknown:
        p.error(f"unknown configs {sorted(unknown)}; choose from {CONFIGS + OPT_IN}")
    if "plainheap" in args.configs and not args.memory_only and not args.worker:
        p.error("the -plainheap configurations change malloc settings process-wide: measure them with --memory-only")
    if args.memory_rounds < 1:
        p.error("--memory-rounds must be at least 1: the tables give each configuration's state and peak RSS")
    os.makedirs(args.out, exist_ok=True)
    for setting in args.settings.split(","):
        args.setting = setting
        run_setting(args)
    plot(args.out)


if __name__ == "__main__":
    main()
