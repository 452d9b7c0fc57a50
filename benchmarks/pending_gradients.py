"""What the pending-gradient stand-ins (hvdtorch/training/pending_gradients.py)
cost a DistributedOptimizer step that never touches .grad between backward
and step().

    OMP_NUM_THREADS=1 torchrun --nproc_per_node=2 benchmarks/pending_gradients.py --rounds 7

GoogLeNet (173 parameters, 64x64 images, batch 16 per rank), SGD with
momentum. Each round times --iters steps with the stand-ins placed after
every backward and --iters with their placement turned off (the class's
place() replaced by a no-op), in turn, between barriers; prints the median
step time of each with its range and their ratio.
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
from hvdtorch.training import pending_gradients  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=8)
    args = p.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    model = googlenet(10)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))
    place = pending_gradients.PendingGradients.place

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    times = {"stand-ins": [], "off": []}
    for _ in range(args.rounds):
        for name, ms in times.items():
            pending_gradients.PendingGradients.place = place if name == "stand-ins" else (lambda self: None)
            hvd.barrier()
            start = time.perf_counter()
            for _ in range(args.iters):
                step()
            hvd.barrier()
            ms.append((time.perf_counter() - start) / args.iters * 1e3)
    pending_gradients.PendingGradients.place = place
    if hvd.rank() == 0:
        for name, ms in times.items():
            print(f"{name:10s} median {statistics.median(ms):.2f} ms/step [{min(ms):.2f}-{max(ms):.2f}]")
        print(f"ratio stand-ins / off: {statistics.median(times['stand-ins']) / statistics.median(times['off']):.3f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
