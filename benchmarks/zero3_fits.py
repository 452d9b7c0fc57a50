"""A model that does not fit unsharded on this machine trains with shard=3.

    python benchmarks/zero3_fits.py --ranks 2 --width 8192 --layers 15 --steps 3

An MLP of --layers x Linear(width, width) (15 x 8192: 1.01 B parameters)
with Adam on --ranks ranks of one host. Unsharded, every rank would hold the
parameters, their gradients and Adam's two states: 16 bytes a parameter, so
2 ranks need 32 GB for this model alone, more than this 24 GiB machine has
(and shard=2 still holds whole parameters and gradient buffers, 24 GB). With
shard=3 a rank holds a 1/N shard of each and, for a moment, the units in
use. Each rank builds the model, wraps it, trains --steps steps and reports
its loss, its step time and its peak RSS (ru_maxrss); the job prints the
parameter count, the sum of the ranks' peaks and the machine's memory.
--meta builds the model on the meta device: the optimizer then makes each
rank's shards layer by layer (hvdtorch/zero/meta_init.py), so no rank ever
holds the whole model; the peak RSS once the optimizer is built is printed
for both ways of building.
Not part of make test (minutes, and most of the machine's memory).
"""

import argparse
import contextlib
import os
import resource
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import hvdtorch as hvd  # noqa: E402
from benchmarks.zero import free_port  # noqa: E402


def worker(args):
    hvd.init()
    rank = hvd.rank()
    torch.manual_seed(0)
    with torch.device("meta") if args.meta else contextlib.nullcontext():
        layers = []
        for _ in range(args.layers):
            layers += [torch.nn.Linear(args.width, args.width, bias=True), torch.nn.ReLU()]
        net = torch.nn.Sequential(*layers[:-1])
    params = sum(p.numel() for p in net.parameters())
    model = hvd.DistributedModel(net)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4), shard=3, model=model)
    del net, layers
    built = hvd.allgather_object(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if rank == 0:
        print(
            f"built {'on the meta device' if args.meta else 'whole on every rank'}: peak RSS per rank once the "
            f"optimizer is built {', '.join(f'{p / 1024:.2f}' for p in built)} GiB (the model: "
            f"{4 * params / 2**30:.2f} GiB of float32)",
            flush=True,
        )
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.width, generator=g)
    y = torch.randint(0, args.width, (args.batch,), generator=g)
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        print(f"rank {rank} step {step}: loss {loss.item():.4f}, {times[-1]:.1f} s", flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peaks = hvd.allgather_object(peak)
    if rank == 0:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        print(
            f"{params / 1e9:.2f} B parameters, {hvd.size()} ranks, shard=3: peak RSS per rank "
            f"{', '.join(f'{p / 1024:.1f}' for p in peaks)} GiB, {sum(peaks) / 1024:.1f} GiB in all, on a "
            f"{total:.1f} GiB machine; unsharded would need {hvd.size() * 16 * params / 2**30:.1f} GiB for the "
            f"model state alone; step time (after the first) {min(times[1:] or times):.1f} s",
            flush=True,
        )
    hvd.shutdown()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=15)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--meta", action="store_true", help="build the model on the meta device")
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.ranks}"]
    cmd += [f"--master_port={free_port()}", os.path.abspath(__file__), "--worker"]
    cmd += ["--width", str(args.width), "--layers", str(args.layers), "--batch", str(args.batch)]
    cmd += ["--steps", str(args.steps)] + (["--meta"] if args.meta else [])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run(cmd, check=True, env=env)


if __name__ == "__main__":
    main()
