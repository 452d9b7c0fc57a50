"""What DistributedModel adds to a training step with one process.

    python benchmarks/overhead.py --iters 40

Steps of the bare GoogLeNet and of the same model wrapped in
hvd.DistributedModel are interleaved (ABAB...) in one process, so machine
drift hits both alike; prints the median step time of each and the ratio.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hvdtorch as hvd  # noqa: E402
from benchmarks.workloads import googlenet  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    args = p.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    bare = googlenet(25)
    torch.manual_seed(0)
    wrapped = hvd.DistributedModel(googlenet(25))
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    y = torch.randint(0, 25, (args.batch_size,))
    opts = {m: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for m in (bare, wrapped)}
    times = {bare: [], wrapped: []}
    for it in range(args.iters + 3):
        for m in (bare, wrapped) if it % 2 else (wrapped, bare):
            t0 = time.perf_counter()
            opts[m].zero_grad()
            F.cross_entropy(m(x), y).backward()
            opts[m].step()
            if it >= 3:
                times[m].append(time.perf_counter() - t0)
    b, w = statistics.median(times[bare]), statistics.median(times[wrapped])
    print(
        f"bare model: {b * 1e3:.1f} ms/step, DistributedModel: {w * 1e3:.1f} ms/step, "
        f"overhead {(w / b - 1) * 100:+.1f}% (medians of {args.iters} interleaved steps, size 1)"
    )
    hvd.shutdown()


if __name__ == "__main__":
    main()
