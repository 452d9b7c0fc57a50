"""Rank side of the soak tests (tests/test_soak.py, `make soak`): long runs that
must not grow. Each rank prints
    SOAK rank=<r> what=<train|cycles> n=<count> rss_growth_kib=<k> threads=<a>/<b> fds=<a>/<b> shm=<n>
where a is after warm-up and b at the end, and shm counts the /dev/shm
segments of every job this process ran that still exist.
"""

import ctypes
import gc
import os
import time

import torch

import hvdtorch as hvd


def _rss_kib() -> int:
    """Resident memory that is still in use: the garbage collector runs and
    glibc returns what it keeps of freed memory (each init() starts threads,
    and each thread's malloc arena holds on to freed pages until trimmed)."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


class _RssTrend:
    """Growth of resident memory over a run, robust to transient chunks.

    With the engine running, RSS saw-tooths without leaking (measured on the
    train job: it climbs by under 1 KiB a step for a few hundred steps, then
    drops by about 4 MiB; after 5800 steps it is where it was after 1300),
    so one sample at each end can differ by a whole tooth, or two. The n
    iterations after the warm-up are sampled SAMPLES times and growth is the
    minimum of the last EDGE samples less the minimum of the first EDGE: a
    leak raises every sample after it, a tooth only some."""

    SAMPLES = 12
    EDGE = 3

    def __init__(self, warmup: int, n: int):
        self.warmup = warmup
        self.every = max(1, n // (self.SAMPLES - 1))
        self.samples = []

    def at(self, i: int):
        """Called at the start of iteration i, warm-up iterations included."""
        if i >= self.warmup and (i - self.warmup) % self.every == 0:
            self.samples.append(_rss_kib())

    def growth_kib(self) -> int:
        self.samples.append(_rss_kib())
        return min(self.samples[-self.EDGE :]) - min(self.samples[: self.EDGE])


def _threads_fds():
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def _segments(tokens) -> int:
    return sum(1 for f in os.listdir("/dev/shm") for t in tokens if f.startswith(f"hvdtorch-{t}"))


def _report(what, n, rss_growth, res0, tokens):
    res1 = _threads_fds()
    print(
        f"SOAK rank={hvd.rank() if hvd.is_initialized() else os.environ['RANK']} what={what} n={n} "
        f"rss_growth_kib={rss_growth} threads={res0[0]}/{res1[0]} fds={res0[1]}/{res1[1]} "
        f"shm={_segments(tokens)}",
        flush=True,
    )


def train(steps: str, warmup: str):
    """DistributedModel steps (pipelined, fused, several buckets)."""
    steps, warmup = int(steps), int(warmup)
    hvd.init()
    tokens = [hvd.runtime.state().shm_token]
    torch.manual_seed(0)
    model = hvd.DistributedModel(
        torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)
        ),
        fusion_bytes=8 << 10,
        first_bucket_bytes=2 << 10,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randint(0, 8, (16,))
    t0 = time.time()
    trend = _RssTrend(warmup, steps - warmup)
    for step in range(steps):
        if step == warmup:
            res0 = _threads_fds()
        trend.at(step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    # The parameters stayed identical on every rank (a cheap end-to-end check).
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert torch.equal(hvd.broadcast(flat, root_rank=0, name="soak.final"), flat), "ranks diverged"
    _report("train", steps - warmup, trend.growth_kib(), res0, tokens)
    print(f"rank {hvd.rank()}: {steps} steps in {time.time() - t0:.1f} s", flush=True)
    hvd.shutdown()


def cycles(count: str, warmup: str):
    """init(), a few ops, shutdown(), again and again."""
    count, warmup = int(count), int(warmup)
    tokens = []
    t0 = time.time()
    trend = _RssTrend(warmup, count - warmup)
    for i in range(count):
        if i == warmup:
            res0 = _threads_fds()
        trend.at(i)
        hvd.init()
        tokens.append(hvd.runtime.state().shm_token)
        n = hvd.size()
        out = hvd.allreduce(torch.arange(1000.0), op=hvd.Sum, name="cycle")
        assert torch.equal(out, torch.arange(1000.0) * n), f"cycle {i}: wrong sum"
        hvd.broadcast(torch.ones(3), root_rank=n - 1, name="cycle.b")
        hvd.shutdown()
    _report("cycles", count - warmup, trend.growth_kib(), res0, tokens)
    print(f"rank {os.environ['RANK']}: {count} cycles in {time.time() - t0:.1f} s", flush=True)
