"""Fresh outputs against in place: what `hvd.allreduce(x)` (a new tensor, from
the output pool) costs beside `hvd.allreduce_(x)`, with Gloo in the same job.

    python -m torch.distributed.run --nproc_per_node=2 benchmarks/fresh_outputs.py
    mpirun -np 2 python benchmarks/fresh_outputs.py --sizes 1M,64M

Configurations (float32 Sum, reducer auto), each size in turn:
  hvd-inplace   hvd.allreduce_(x)
  hvd-fresh     hvd.allreduce(x): the output from the pool (csrc/torch/output_pool.h)
  hvd-clone     hvd.allreduce_(x.clone()): a fresh tensor from torch's allocator
                (what every fresh output cost before the pool)
  gloo-inplace  dist.all_reduce(x) on a Gloo group
  gloo-clone    dist.all_reduce(x.clone())

Every round runs each configuration once, in the same order (interleaved, so
drifts of the machine hit all alike); every repetition starts at a barrier
of a Gloo group of its own, and a repetition's time is the slowest rank's. A
round's figure is the median of --reps repetitions; the table gives the
median over rounds with min-max, and the ratios the targets name.
"""

import argparse
import functools
import os
import statistics
import time

import torch
import torch.distributed as dist

import hvdtorch as hvd
from hvdtorch import _C


def parse_sizes(s: str):
    units = {"K": 1 << 10, "M": 1 << 20}
    return [int(float(x[:-1]) * units[x[-1].upper()]) if x[-1].upper() in units else int(x) for x in s.split(",")]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("1M,4M,16M,64M"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    hvd.init()
    gloo = dist.new_group(backend="gloo")
    barrier = dist.new_group(backend="gloo")  # the repetitions' barriers only

    def slowest(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=barrier)
        return float(t.item())

    def timed(fn) -> float:
        times = []
        for _ in range(args.reps):
            dist.barrier(group=barrier)
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
            del out  # freed before the next repetition, as a loop that drops its result
        return slowest(statistics.median(times))

    rows = []
    for nbytes in args.sizes:
        x = torch.ones(nbytes // 4)
        configs = {
            "hvd-inplace": functools.partial(hvd.allreduce_, x, op=hvd.Sum, name="fo.inplace"),
            "hvd-fresh": functools.partial(hvd.allreduce, x, op=hvd.Sum, name="fo.fresh"),
            "hvd-clone": lambda x=x: hvd.allreduce_(x.clone(), op=hvd.Sum, name="fo.clone"),
            "gloo-inplace": functools.partial(dist.all_reduce, x, group=gloo),
            "gloo-clone": lambda x=x: dist.all_reduce(x.clone(), group=gloo),
        }
        for fn in configs.values():
            fn()  # warm-up: negotiation, the response cache, links, the pool's first block
        per_round = {name: [] for name in configs}
        for _ in range(args.rounds):
            for name, fn in configs.items():
                per_round[name].append(timed(fn))
        rows.append((nbytes, per_round))
    if hvd.rank() == 0:
        launcher = hvd.runtime.state().launcher
        print(
            f"{hvd.size()} ranks ({launcher}), {args.rounds} interleaved rounds x {args.reps} reps; "
            "ms, median [min-max]"
        )
        for nbytes, per_round in rows:
            med = {name: statistics.median(ts) for name, ts in per_round.items()}
            cells = "  ".join(
                f"{name} {med[name] * 1e3:.2f} [{min(ts) * 1e3:.2f}-{max(ts) * 1e3:.2f}]"
                for name, ts in per_round.items()
            )
            print(f"{nbytes >> 20:3d} MiB  {cells}")
            print(
                f"        fresh/inplace {med['hvd-fresh'] / med['hvd-inplace']:.2f}x (target <= 1.3x)   "
                f"clone/inplace {med['hvd-clone'] / med['hvd-inplace']:.2f}x   "
                f"gloo-clone/fresh {med['gloo-clone'] / med['hvd-fresh']:.2f}x (target >= 2x at 64 MiB)"
            )
        print(f"output pool: {_C.output_pool_stats()}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
