"""Runs every collective once and checks each result against what it must be.

    torchrun --nproc_per_node=3 examples/collectives.py
    mpirun -np 3 python examples/collectives.py

Exits non-zero (and says what differs) if any result is wrong.
"""

import sys

import torch

import hvdtorch as hvd


def main() -> int:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    failures = []

    def check(what, got, want):
        if not torch.equal(got, want):
            failures.append(f"{what}: got {got.tolist()}, want {want.tolist()}")

    x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + r
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    check("allreduce Sum", hvd.allreduce(x, op=hvd.Sum), base * n + sum(range(n)))
    check("allreduce Average", hvd.allreduce(x), base + sum(range(n)) / n)
    check("allreduce Max", hvd.allreduce(x, op=hvd.Max), base + n - 1)
    y = x.clone()
    hvd.allreduce_(y, op=hvd.Min)
    check("allreduce_ Min", y, base)
    g = hvd.allgather(torch.full((r + 1, 2), r, dtype=torch.int64))
    check("allgather", g, torch.cat([torch.full((k + 1, 2), k, dtype=torch.int64) for k in range(n)]))
    check("broadcast", hvd.broadcast(x, root_rank=n - 1), base + n - 1)
    handles = [hvd.allreduce_async(torch.ones(4) * r, name=f"async.{i}", op=hvd.Sum) for i in range(5)]
    for h in handles:
        check("allreduce_async", hvd.synchronize(h), torch.ones(4) * sum(range(n)))
    hvd.barrier()

    if r == 0:
        print(
            f"collectives: {n} ranks, launcher {hvd.runtime.state().launcher}, "
            f"local_size {hvd.local_size()}, cross_size {hvd.cross_size()}: "
            + ("all results correct" if not failures else f"{len(failures)} wrong")
        )
    for f in failures:
        print(f"rank {r}: WRONG {f}", file=sys.stderr)
    hvd.shutdown()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
