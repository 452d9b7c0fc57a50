"""Training-throughput benchmark: torch DDP (Gloo) against hvdtorch with
each reducer and each of the none / P / F / P+F configurations, in the same
job, under torchrun or mpirun unchanged.

One job (one world size) per invocation:
    torchrun --nproc_per_node=2 benchmarks/googlenet.py --setting compute
    mpirun -np 2 python benchmarks/googlenet.py --setting comm
The drivers benchmarks/run_torchrun.sh and run_mpirun.sh run world sizes
1..4 and then benchmarks/plot.py.

Settings:
  compute  GoogLeNet, 64 px images, batch 16 per rank (compute dominates)
  small    GoogLeNet, 32 px images, batch 8 per rank (communication matters)
  comm     FCHeavyNet (conv trunk + 2x2048 FC head, 12.7 M parameters), 32 px, batch 8
Data: synthetic, or --data DIR (an ImageFolder, e.g. from make_dataset.py).

`solo` runs the bare model on every rank with no communication at all: the
throughput N processes reach on this machine without any gradient exchange,
so the cost of synchronisation shows as the gap to solo.

For every configuration: median img/s (total and per rank) after warm-up,
and the median per-iteration breakdown: data loading, forward, backward,
waiting for gradient sync after backward, optimizer step. (DDP's sync wait
happens inside its backward; it is reported as part of backward.) Rows are
appended as JSON lines to --out/<setting>.jsonl.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import hvdtorch as hvd  # noqa: E402
from hvdtorch.data import batches  # noqa: E402
from hvdtorch.models import FCHeavyNet, GoogLeNet  # noqa: E402

SETTINGS = {
    "compute": dict(model="googlenet", image_size=64, batch=16),
    "small": dict(model="googlenet", image_size=32, batch=8),
    "comm": dict(model="fcheavy", image_size=32, batch=8),
}
MODES = {"none": (False, 0), "P": (True, 0), "F": (False, 25 << 20), "P+F": (True, 25 << 20)}


def build(setting):
    torch.manual_seed(0)
    s = SETTINGS[setting]
    if s["model"] == "googlenet":
        # The ImageNet stem downsamples 8x at once, so small inputs mean little
        # compute per image (and the same 6 M parameters to reduce).
        return GoogLeNet(num_classes=25, stem="imagenet")
    return FCHeavyNet(num_classes=25, image_size=s["image_size"])


def run_config(args, setting, name, rank, size):
    model = build(setting)
    if name == "solo":
        # Every rank trains alone, no communication: what N processes can do
        # on this machine at all (memory and cache contention included).
        sync = lambda: None  # noqa: E731
    elif name == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model) if size > 1 else model
        sync = lambda: None  # noqa: E731  (DDP waits inside backward)
    else:
        reducer, mode = name.split(":")
        pipeline, fusion = MODES[mode] if mode in MODES else (True, int(mode))
        model = hvd.DistributedModel(
            model, reducer=reducer, pipeline=pipeline, fusion_bytes=fusion, sync="explicit", name=f"bench.{name}"
        )
        sync = model.sync_gradients
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    s = SETTINGS[setting]
    data = batches(args.data, s["image_size"], s["batch"], 25, rank, size)
    phases = {k: [] for k in ("data", "forward", "backward", "sync", "optim", "total")}
    for it in range(args.warmup + args.iters):
        t0 = time.perf_counter()
        x, y = next(data)
        t1 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        t2 = time.perf_counter()
        opt.zero_grad()
        loss.backward()
        t3 = time.perf_counter()
        sync()
        t4 = time.perf_counter()
        opt.step()
        t5 = time.perf_counter()
        if it >= args.warmup:
            for k, v in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0)):
                phases[k].append(v)
    med = {k: statistics.median(v) for k, v in phases.items()}
    # The job runs at the pace of its slowest rank.
    slowest = hvd.allreduce(
        torch.tensor([med["total"]], dtype=torch.float64), op=hvd.Max, name=f"bench.{name}.slowest"
    ).item()
    return {
        "setting": setting,
        "config": name,
        "ranks": size,
        "batch_per_rank": SETTINGS[setting]["batch"],
        "image_size": SETTINGS[setting]["image_size"],
        "data": "jpeg" if args.data else "synthetic",
        "step_s": slowest,
        "img_per_s": size * SETTINGS[setting]["batch"] / slowest,
        "img_per_s_per_rank": SETTINGS[setting]["batch"] / slowest,
        **{f"{k}_s": v for k, v in med.items() if k != "total"},
        "launcher": hvd.runtime.state().launcher,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=list(SETTINGS), default="compute")
    p.add_argument(
        "--configs",
        default="solo,ddp,auto:P+F,node:P+F,ring:P+F,central:P+F,native:P+F,auto:none,auto:P,auto:F",
        help="comma list: solo (no communication), ddp, or <reducer>:<none|P|F|P+F|fusion bytes>",
    )
    p.add_argument("--iters", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1, help="measure each config this many times (median kept)")
    p.add_argument("--data", help="ImageFolder root (default: synthetic)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    os.makedirs(args.out, exist_ok=True)
    for name in args.configs.split(","):
        runs = [run_config(args, args.setting, name, rank, size) for _ in range(args.repeats)]
        row = sorted(runs, key=lambda r: r["step_s"])[len(runs) // 2]
        if rank == 0:
            ms = {k: row[f"{k}_s"] * 1e3 for k in ("step", "data", "forward", "backward", "sync", "optim")}
            print(
                f"[{args.setting} {size} ranks] {name:>14}: {row['img_per_s']:7.1f} img/s "
                f"(step {ms['step']:6.1f} ms: data {ms['data']:.1f}, fwd {ms['forward']:.1f}, "
                f"bwd {ms['backward']:.1f}, sync {ms['sync']:.1f}, optim {ms['optim']:.1f})",
                flush=True,
            )
            with open(os.path.join(args.out, f"{args.setting}.jsonl"), "a") as f:
                f.write(json.dumps(row) + "\n")
    hvd.shutdown()


if __name__ == "__main__":
    main()
