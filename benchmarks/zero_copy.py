"""Registered (zero-copy) buckets against the copy path, memcpy and peers, in
the same mpirun job.

    python benchmarks/zero_copy.py                    # 2 ranks, 64 MiB, 7 rounds
    python benchmarks/zero_copy.py --bytes 16M --rounds 9 --horovod

Every round runs each configuration once, in the same order on every rank
(interleaved, so slow drifts of the machine hit all of them alike); within a
configuration every repetition starts at an MPI barrier, so all ranks time
the same interval, and a repetition's time is the slowest rank's. A round's
figure is the median of --reps repetitions; the table gives the median over
rounds with min-max.

Configurations (float32, --bytes per rank, sum):
  memcpy          one torch copy_ of --bytes on every rank at once: the
                  physical reference (a same-host all-reduce moves at least
                  this much per rank)
  registered-node hvd.allreduce_ of a tensor in registered memory (what
                  DistributedModel's buckets are) with the node reducer: read
                  in place, results written straight into every rank's buffer
  node / ring     hvd.allreduce_ of a plain tensor (the copy path)
  mpi             MPI_Allreduce (mpi4py) in place
  horovod         Horovod 0.28.1's allreduce_ (--horovod; ranks then run the
                  Python of build/horovod-venv, see benchmarks/peers/build_horovod.sh)
"""

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOROVOD_PYTHON = os.path.join(ROOT, "build", "horovod-venv", "bin", "python")


def parse_bytes(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def worker(args):
    import torch
    from mpi4py import MPI

    import hvdtorch as hvd
    from hvdtorch import runtime

    torch.set_num_threads(1)
    hvd.init()
    peer = None
    if args.horovod:
        import horovod.torch as peer  # MPI is already initialised (mpi4py): Horovod uses it

        peer.init()
    comm = MPI.COMM_WORLD
    count = args.bytes // 4
    engine = runtime.state().engine
    registered = engine.registered_zeros(count, torch.float32)
    own, _ = engine.registered_stats()
    if own == 0:
        raise SystemExit("no registered memory here (shared memory off, or one rank per host)")
    plain = torch.zeros(count)
    src = torch.ones(count)
    dst = torch.empty(count)
    configs = {
        "memcpy": functools.partial(dst.copy_, src),
        "registered-node": functools.partial(hvd.allreduce_, registered, op=hvd.Sum, name="zc.reg", reducer="node"),
        "node": functools.partial(hvd.allreduce_, plain, op=hvd.Sum, name="zc.node", reducer="node"),
        "ring": functools.partial(hvd.allreduce_, plain, op=hvd.Sum, name="zc.ring", reducer="ring"),
        "mpi": functools.partial(comm.Allreduce, MPI.IN_PLACE, plain.numpy(), op=MPI.SUM),
    }
    if peer is not None:
        configs["horovod"] = functools.partial(peer.allreduce_, plain, op=peer.Sum, name="zc.horovod")

    def round_of(fn):
        times = []
        for _ in range(args.reps):
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    for fn in configs.values():
        fn()  # warm-up: allocations, negotiation, the response cache, peer mappings
    # Correctness of the registered path, once: every rank holds rank+1.
    registered.fill_(hvd.rank() + 1)
    hvd.allreduce_(registered, op=hvd.Sum, name="zc.check", reducer="node")
    want = hvd.size() * (hvd.size() + 1) / 2
    if not bool((registered == want).all()):
        raise SystemExit(f"rank {hvd.rank()}: registered all-reduce gave a wrong result")
    per_round = {name: [] for name in configs}
    for _ in range(args.rounds):
        for name, fn in configs.items():
            per_round[name].append(max(comm.allgather(round_of(fn))))
    if hvd.rank() == 0:
        print("RESULT " + json.dumps(per_round), flush=True)
    if peer is not None:
        peer.shutdown()
    hvd.shutdown()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--bytes", type=parse_bytes, default=64 << 20)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--horovod", action="store_true", help="also Horovod 0.28.1 (benchmarks/peers/build_horovod.sh)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    python = sys.executable
    if args.horovod:
        if not os.path.exists(HOROVOD_PYTHON):
            raise SystemExit(f"--horovod needs {HOROVOD_PYTHON}: run benchmarks/peers/build_horovod.sh first")
        python = HOROVOD_PYTHON
    env = dict(
        os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1", PYTHONPATH=ROOT
    )
    cmd = ["mpirun", "--oversubscribe", "-np", str(args.ranks), python, os.path.abspath(__file__), "--worker"]
    cmd += ["--bytes", str(args.bytes), "--rounds", str(args.rounds), "--reps", str(args.reps)]
    cmd += ["--horovod"] if args.horovod else []
    print("$ " + " ".join(cmd[:4]) + " python benchmarks/zero_copy.py --worker " + " ".join(cmd[7:]), flush=True)
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise SystemExit(f"benchmark failed (exit {out.returncode})")
    per_round = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
    med = {name: statistics.median(ts) for name, ts in per_round.items()}
    print(f"\n{args.ranks} ranks, {args.bytes >> 20} MiB float32, {args.rounds} interleaved rounds x {args.reps} reps")
    print(f"{'config':>16} {'median ms':>10} {'min-max ms':>16} {'x memcpy':>9}")
    for name, ts in per_round.items():
        span = f"{min(ts) * 1e3:.2f}-{max(ts) * 1e3:.2f}"
        print(f"{name:>16} {med[name] * 1e3:10.2f} {span:>16} {med[name] / med['memcpy']:9.2f}")
    print(f"\nregistered-node / memcpy: {med['registered-node'] / med['memcpy']:.2f}x (target <= 1.5x)")
    print(f"node (copy path) / registered-node: {med['node'] / med['registered-node']:.2f}x")
    if "horovod" in med:
        best_plain = min(med["node"], med["ring"])
        print(f"horovod / best plain hvd.allreduce: {med['horovod'] / best_plain:.2f}x (target >= 2x)")


if __name__ == "__main__":
    main()
