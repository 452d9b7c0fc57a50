"""Sharded optimizer benchmark (ZeRO stages 1 and 2): optimizer-state bytes
and peak RSS per rank, and training throughput with Adam, against
DistributedModel, torch DDP and DDP + torch's ZeroRedundancyOptimizer, in
the same job.

    python benchmarks/zero.py --ranks 2 --settings comm,compute --rounds 7 --iters 10
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
  ddp       torch DistributedDataParallel (Gloo), the plain optimizer
  zero-ddp  DDP + torch.distributed.optim.ZeroRedundancyOptimizer (ZeRO-1 on DDP)

Settings: benchmarks/googlenet.py's (comm: FCHeavyNet, 12.7 M parameters,
32 px, batch 8; compute: GoogLeNet, 64 px, batch 16; small: GoogLeNet 32 px).

Method. Throughput: one torchrun job per setting builds every configuration
once, then runs --rounds rounds of interleaved windows (A B C D E, A B C D E,
...), each window --warmup untimed steps then --iters timed steps between two
barriers on a Gloo group of its own (benchmarks/googlenet.py's measure_window);
img/s = ranks x batch x iters / the longest rank's window; median [min-max]
over rounds. Memory: one short torchrun job per configuration (peak RSS is a
process's high-water mark, so configurations cannot share a process): the
bytes of optimizer state on each rank after the first step, and each rank's
peak RSS (ru_maxrss) after --iters steps; the largest rank's is reported.
Rows go to --out/<setting>.jsonl (one per configuration, throughput and
memory together) and the plot to --out/zero.png.
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
OPT_IN = ["shard1-overlap", "shard2-overlap"]  # measured when asked for by --configs
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

    def state_bytes(self) -> int:
        if isinstance(self.opt, hvd.ShardedOptimizer):
            return self.opt.state_bytes()
        opt = getattr(self.opt, "optim", self.opt)  # ZeroRedundancyOptimizer's local optimizer
        return sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if torch.is_tensor(v))


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
    (rss_kib,) = _max_over_ranks([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss], group)
    params = sum(p.numel() for p in cfg.model.parameters())
    if hvd.rank() == 0:
        with open(args.rows, "w") as f:
            row = dict(config=args.configs, state_bytes_per_rank=[int(t.item()) for t in every])
            row.update(peak_rss_mib=rss_kib / 1024, parameters=params)
            f.write(json.dumps(row) + "\n")
    hvd.shutdown()


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
    rows = {r["config"]: r for r in torchrun(args, "throughput", args.configs, tmp)}
    for name in configs:
        (mem,) = torchrun(args, "memory", name, tmp)
        rows[name].update(mem)
    os.remove(tmp)
    out = []
    for name in configs:
        r = rows[name]
        r.update(setting=args.setting, ranks=args.ranks, rounds=args.rounds, iters=args.iters, cores=os.cpu_count())
        out.append(r)
    with open(os.path.join(args.out, f"{args.setting}.jsonl"), "a") as f:
        for r in out:
            f.write(json.dumps(r) + "\n")
    print_table(out)
    return out


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
        latest = {}
        for r in rows:  # the last run of each configuration
            latest[r["config"]] = r
        names = [c for c in CONFIGS + OPT_IN if c in latest]
        xs = [i + k * width for i in range(len(names))]
        med = [latest[c]["img_per_s"] for c in names]
        err = [[m - latest[c]["img_per_s_min"] for m, c in zip(med, names)]]
        err.append([latest[c]["img_per_s_max"] - m for m, c in zip(med, names)])
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
    os.makedirs(args.out, exist_ok=True)
    for setting in args.settings.split(","):
        args.setting = setting
        run_setting(args)
    plot(args.out)


if __name__ == "__main__":
    main()
