"""shard=3 (parameters sharded at rest) against torch's FSDP2 and hvdtorch's
own shard=2 and unsharded DistributedModel, in the same jobs: peak RSS per
rank and training throughput with Adam.

    python benchmarks/zero3.py --ranks 2 --setting mlp --rounds 5 --iters 5 --memory-rounds 3
    python benchmarks/zero3.py --ranks 2 --setting googlenet --rounds 5 --iters 5

Settings:
  mlp        12 x Linear(2048, 2048) with ReLU (50.4 M parameters), batch 16
             per rank, cross-entropy over 2048 classes
  googlenet  benchmarks/googlenet.py's "compute" setting (GoogLeNet, 64 px,
             batch 16)
Configurations (torch.optim.Adam, lr 1e-4):
  dm      hvd.DistributedModel, the plain optimizer
  shard2  + hvd.DistributedOptimizer(shard=2)
  shard3  + hvd.DistributedOptimizer(shard=3, model=dm); shard3@<bytes>: with
          keep_gathered_below=<bytes>; shard3-own: share_gathered=False, a
          gathered copy per rank instead of one per host (neither in the
          default --configs)
  fsdp2   torch.distributed.fsdp.fully_shard on every Linear and Conv2d
          (its layers' units), then on the root; Gloo
Method: as benchmarks/zero.py's. Throughput: one torchrun job builds every
configuration, then --rounds rounds of interleaved windows (A B C D, A B C D,
...), each --warmup untimed steps then --iters timed steps between two
barriers; samples/s = ranks x batch x iters / the longest rank's window;
median [min-max] over rounds. Memory: one torchrun job per configuration
and round (peak RSS is a process's high-water mark), interleaved; the
largest rank's ru_maxrss after --iters steps, median [min-max]. The host's
total (--host-total): every rank samples its proportional set size
(/proc/self/smaps_rollup's Pss, which splits shared pages among the processes
that map them) at each Linear/Conv2d forward and each gradient accumulated, in
the same program order on every rank; the samples are summed over ranks
position by position, and the largest sum is the host's peak in that job.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import hvdtorch as hvd  # noqa: E402
from benchmarks.googlenet import NUM_CLASSES, SETTINGS, build_model  # noqa: E402
from benchmarks.workloads import image_batches  # noqa: E402
from benchmarks.zero import _max_over_ranks, _pss_kib, free_port  # noqa: E402

CONFIGS = ["dm", "shard2", "shard3", "fsdp2"]
LR = 1e-4
MLP_WIDTH, MLP_LAYERS, MLP_BATCH = 2048, 12, 16


def build(setting):
    if setting == "mlp":
        layers = []
        for _ in range(MLP_LAYERS):
            layers += [torch.nn.Linear(MLP_WIDTH, MLP_WIDTH), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers[:-1])
    return build_model("compute")


def batches(setting, rank, size):
    if setting != "mlp":
        s = SETTINGS["compute"]
        return image_batches(None, s["image_size"], s["batch"], NUM_CLASSES, rank, size), s["batch"]
    g = torch.Generator().manual_seed(rank)
    fixed = [
        (torch.randn(MLP_BATCH, MLP_WIDTH, generator=g), torch.randint(0, MLP_WIDTH, (MLP_BATCH,), generator=g))
        for _ in range(4)
    ]

    def cycle():
        while True:
            yield from fixed

    return cycle(), MLP_BATCH


class Config:
    def __init__(self, name, setting):
        torch.manual_seed(0)
        self.name = name
        model = build(setting)
        if name == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            for m in model.modules():
                if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)):
                    fully_shard(m)
            self.model = fully_shard(model)
            self.opt = torch.optim.Adam(self.model.parameters(), lr=LR)
            return
        self.model = hvd.DistributedModel(model, name=f"z3.{name}")
        self.opt = torch.optim.Adam(self.model.parameters(), lr=LR)
        if name.startswith("shard"):
            kw = {"keep_gathered_below": int(name.split("@")[1])} if "@" in name else {}
            if name.endswith("-own"):
                kw["share_gathered"] = False
            self.opt = hvd.DistributedOptimizer(self.opt, shard=int(name[5]), model=self.model, **kw)

    def steps(self, data, n):
        for _ in range(n):
            x, y = next(data)
            loss = F.cross_entropy(self.model(x), y)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()


def window(cfg, data, args, group):
    cfg.steps(data, args.warmup)
    dist.barrier(group=group)
    t0 = time.perf_counter()
    cfg.steps(data, args.iters)
    dist.barrier(group=group)
    (elapsed,) = _max_over_ranks([time.perf_counter() - t0], group)
    return elapsed


def worker_throughput(args):
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    group = dist.new_group(backend="gloo")
    configs = args.configs.split(",")
    built = {name: Config(name, args.setting) for name in configs}
    data = {name: batches(args.setting, rank, size) for name in configs}
    rates = {name: [] for name in configs}
    for rnd in range(args.rounds):
        for name in configs:
            it, batch = data[name]
            rates[name].append(size * batch * args.iters / window(built[name], it, args, group))
            if rank == 0:
                print(f"round {rnd + 1} {name}: {rates[name][-1]:.1f} samples/s", file=sys.stderr, flush=True)
    if rank == 0:
        with open(args.rows, "w") as f:
            for name in configs:
                r = rates[name]
                f.write(json.dumps(dict(config=name, rate=statistics.median(r), rate_min=min(r), rate_max=max(r))))
                f.write("\n")
    hvd.shutdown()


def sample_pss(model, units, samples):
    """Appends (this process's Pss in KiB, the gathered buckets it holds) to
    ``samples`` at each Linear/Conv2d forward and each gradient accumulated
    (the host-total method above). The buckets: {("host", j) or (rank, j):
    bytes}, j gathered into the host's copy or into the rank's own."""

    def sample(*_):
        held = {}
        if units is not None:
            for j, full in enumerate(units._full):
                if full is not None:
                    key = ("host", j) if j in units._on_host else (hvd.rank(), j)
                    held[key] = full.numel() * full.element_size()
        samples.append((_pss_kib(), held))

    for m in model.modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)):
            m.register_forward_pre_hook(sample)
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(sample)


def worker_memory(args):
    hvd.init()
    group = dist.new_group(backend="gloo")
    cfg = Config(args.configs, args.setting)
    it, _ = batches(args.setting, hvd.rank(), hvd.size())
    samples = []
    if args.host_total:
        sample_pss(cfg.model, getattr(cfg.opt, "_units", None), samples)
    cfg.steps(it, args.iters)
    (rss_kib,) = _max_over_ranks([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss], group)
    row = dict(config=args.configs, peak_rss_mib=rss_kib / 1024)
    if args.host_total:
        every = [None] * hvd.size()
        dist.all_gather_object(every, samples, group=group)
        if len({len(s) for s in every}) != 1:
            raise RuntimeError(f"the ranks took different numbers of samples: {[len(s) for s in every]}")
        row["host_pss_mib_by_sample"] = [round(sum(kib for kib, _ in column) / 1024, 1) for column in zip(*every)]
        row["host_pss_peak_mib"] = max(row["host_pss_mib_by_sample"])
        # The host's gathered bytes at each position: each bucket once, a host copy however many ranks hold it.
        gathered = [sum(dict(kv for _, held in column for kv in held.items()).values()) for column in zip(*every)]
        row["host_gathered_peak_mib"] = max(gathered) / 2**20
    if hvd.rank() == 0:
        row["parameters"] = sum(p.numel() for p in build(args.setting).parameters())
        with open(args.rows, "w") as f:
            f.write(json.dumps(row) + "\n")
    hvd.shutdown()


def torchrun(args, mode, configs, rows):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.ranks}"]
    cmd += [f"--master_port={free_port()}", os.path.abspath(__file__), "--worker", mode]
    cmd += ["--setting", args.setting, "--configs", configs, "--rows", rows]
    cmd += ["--rounds", str(args.rounds), "--iters", str(args.iters), "--warmup", str(args.warmup)]
    cmd += ["--host-total"] if args.host_total else []
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run(cmd, check=True, env=env)
    with open(rows) as f:
        return [json.loads(line) for line in f if line.strip()]


def spread(values):
    return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--setting", choices=["mlp", "googlenet"], default="mlp")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--memory-rounds", type=int, default=3)
    ap.add_argument("--memory-only", action="store_true")
    ap.add_argument("--host-total", action="store_true", help="also the host's total (summed Pss), see above")
    ap.add_argument("--worker", choices=["throughput", "memory"])
    ap.add_argument("--rows", default=None)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "zero3"))
    args = ap.parse_args()
    if args.worker == "throughput":
        return worker_throughput(args)
    if args.worker == "memory":
        return worker_memory(args)
    os.makedirs(args.out, exist_ok=True)
    tmp = os.path.join(args.out, f".rows-{os.getpid()}")
    configs = args.configs.split(",")
    rows = {name: {"config": name} for name in configs}
    if not args.memory_only:
        rows = {r["config"]: r for r in torchrun(args, "throughput", args.configs, tmp)}
    peaks = {name: [] for name in configs}
    hosts = {name: [] for name in configs}
    for rnd in range(args.memory_rounds):
        for name in configs:
            (m,) = torchrun(args, "memory", name, tmp)
            peaks[name].append(m["peak_rss_mib"])
            if "host_pss_peak_mib" in m:
                hosts[name].append(m["host_pss_peak_mib"])
                rows[name]["host_gathered_peak_mib"] = m["host_gathered_peak_mib"]
                rows[name]["host_pss_mib_by_sample"] = m["host_pss_mib_by_sample"]  # the last round's
            rows[name]["parameters"] = m["parameters"]
            print(f"memory round {rnd + 1} {name}: peak RSS {m['peak_rss_mib']:.0f} MiB", file=sys.stderr)
    os.remove(tmp)
    print(
        f"\n{args.setting}, {args.ranks} ranks, Adam; throughput median [min-max] of {args.rounds} rounds, "
        f"peak RSS per rank (largest rank) of {args.memory_rounds}"
    )
    ref = rows.get("fsdp2", {}).get("rate")
    with open(os.path.join(args.out, f"{args.setting}.jsonl"), "a") as f:
        for name in configs:
            r = rows[name]
            r.update(setting=args.setting, ranks=args.ranks, peak_rss_mib_rounds=peaks[name])
            if hosts[name]:
                r["host_pss_peak_mib_rounds"] = hosts[name]
            f.write(json.dumps(r) + "\n")
            line = f"  {name:7s}"
            if "rate" in r:
                line += f" {r['rate']:8.1f} samples/s [{r['rate_min']:.1f}-{r['rate_max']:.1f}]"
                if ref:
                    line += f" {r['rate'] / ref:5.2f}x fsdp2"
            if peaks[name]:
                line += f"   peak RSS {spread(peaks[name])} MiB"
            if hosts[name]:
                line += f"   host total {spread(hosts[name])} MiB, gathered {r['host_gathered_peak_mib']:.0f} MiB"
            print(line)


if __name__ == "__main__":
    main()
