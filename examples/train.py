"""Data-parallel GoogLeNet training with hvdtorch.

    torchrun --nproc_per_node=2 examples/train.py --steps 30
    mpirun -np 2 python examples/train.py --data /path/to/imagefolder

Synthetic data by default, or an ImageFolder directory of JPEGs (--data).
Each rank trains on its own shard (DistributedSampler); rank 0 shows a tqdm
progress bar and, at the end, the throughput in images per second (after
warm-up). With --json the result is also printed as one JSON line for scripts.

The model and the data reader are not part of hvdtorch: they come from
benchmarks/workloads/, which uses torchvision's GoogLeNet and ImageFolder
where torchvision imports and its own identical definitions where it does
not. In your own script, use your model and DataLoader instead.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

import hvdtorch as hvd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from benchmarks.workloads import googlenet, googlenet_source, image_batches  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="ImageFolder root (default: synthetic images)")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--num-classes", type=int, default=25)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.05)
    # auto, or a reducer of the registry that serves the standard ops (hvdtorch/check.py lists them with their costs).
    reducers = ["auto"] + [row["name"] for row in hvd._C.reducer_registry() if row["own_op"] is None]
    p.add_argument("--reducer", default="auto", choices=reducers)
    p.add_argument("--fusion-bytes", type=int, default=25 << 20)
    p.add_argument("--no-pipeline", action="store_true")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    model = googlenet(num_classes=args.num_classes)
    model = hvd.DistributedModel(
        model, reducer=args.reducer, fusion_bytes=args.fusion_bytes, pipeline=not args.no_pipeline
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)

    data = image_batches(args.data, args.image_size, args.batch_size, args.num_classes, rank, size)
    step_times = []
    bar = tqdm(range(args.warmup + args.steps), unit="step", disable=rank != 0 or None)  # None: off without a terminal
    for step in bar:
        t0 = time.perf_counter()
        x, y = next(data)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        if step >= args.warmup:
            step_times.append(dt)
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    bar.close()
    # Throughput of the job: every rank does the same steps, so use the
    # slowest rank's median step time.
    median = statistics.median(step_times)
    slowest = hvd.allreduce(torch.tensor([median]), op=hvd.Max, name="train.median").item()
    result = {
        "ranks": size,
        "batch_per_rank": args.batch_size,
        "image_size": args.image_size,
        "median_step_s": slowest,
        "img_per_s": size * args.batch_size / slowest,
        "final_loss": loss.item(),
        "reducer": args.reducer,
        "fusion_bytes": args.fusion_bytes,
        "pipeline": not args.no_pipeline,
        "launcher": hvd.runtime.state().launcher,
        "model": googlenet_source(),
    }
    if rank == 0:
        print(
            f"GoogLeNet {args.image_size}px, {size} rank(s) x batch {args.batch_size}: "
            f"{result['img_per_s']:.1f} img/s (median step {slowest * 1000:.0f} ms), loss {loss.item():.3f}"
        )
        if args.json:
            print("RESULT " + json.dumps(result), flush=True)
    hvd.shutdown()
    return result


if __name__ == "__main__":
    main()
