"""All-reduce benchmark: every hvdtorch reducer against torch.distributed's
Gloo all_reduce and MPI_Allreduce (mpi4py, Open MPI), measured in the same
processes of the same mpirun job.

    python benchmarks/allreduce.py                      # 2 and 4 ranks, 4 KiB .. 256 MiB
    python benchmarks/allreduce.py --ranks 2 --max-bytes 64M --reps 5
    python benchmarks/allreduce.py --horovod ...         # Horovod 0.28.1 in the same job
    python benchmarks/allreduce.py --ranks 2 --breakdown 2000   # where a 4 KiB all-reduce's time goes

--horovod adds Horovod's allreduce_ (its MPI operations) to the same
processes: the ranks then run the Python of the venv that
benchmarks/peers/build_horovod.sh builds (same torch pin, hvdtorch from this
tree on PYTHONPATH).

Prints, per world size and message size, the median time of --reps rounds
(each round runs every implementation once, in a rotating order),
algbw = bytes / time and busbw = algbw * 2(n-1)/n (nccl-tests' definitions),
and each implementation's busbw ratio to Gloo; writes CSV and a PNG plot to
--out. --breakdown N runs N 4 KiB all-reduces (reducer auto, a barrier before each)
and prints, per rank, the median of each hand-off phase the engine stamps
(csrc/core/engine/op_timing.h) next to MPI_Allreduce's time in the same job.

Also prints this machine's memcpy bandwidth, the physical reference:
a shared-memory all-reduce moves about 2(n-1)/n of the buffer through memory
per rank, plus the reduction.
"""

import argparse
import csv
import functools
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def hvd_reducers():
    """The registry's reducers of the standard ops (csrc/core/algorithms/reducer_registry.h), then auto."""
    from hvdtorch import _C

    return [row["name"] for row in _C.reducer_registry() if row["own_op"] is None] + ["auto"]


HOROVOD_PYTHON = os.path.join(ROOT, "build", "horovod-venv", "bin", "python")


def parse_bytes(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def sizes(min_bytes: int, max_bytes: int):
    b = min_bytes
    while b <= max_bytes:
        yield b
        b *= 4


BREAKDOWN_PHASES = [
    "python",  # hvd.allreduce_ up to the binding, and from the binding's return
    "binding",
    "control_wake",
    "negotiate",
    "executor_wake",
    "copy_in",
    "reduce",
    "finish",
    "waiter_wake",
]


def breakdown(hvd, comm, MPI, reps):
    """Median microseconds of every phase of a 4 KiB all-reduce on this rank,
    plus the whole op and MPI_Allreduce of the same buffer (same loop)."""
    import torch

    x = torch.ones(1024, dtype=torch.float32)
    name = "breakdown.4096"
    for _ in range(50):  # warm-up: negotiation, response cache, reducer choice
        hvd.allreduce_(x, op=hvd.Sum, name=name)
    hvd.runtime.state().engine.latency_phases(clear=True)
    totals = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter_ns()
        hvd.allreduce_(x, op=hvd.Sum, name=name)
        totals.append(time.perf_counter_ns() - t0)
    phases = hvd.runtime.state().engine.latency_phases(clear=True)
    engine_ns = [sum(v[i] for k, v in phases.items()) for i in range(len(totals))]
    phases["python"] = [t - e for t, e in zip(totals, engine_ns)]
    out = {k: statistics.median(v) / 1e3 for k, v in phases.items()}
    out["total"] = statistics.median(totals) / 1e3
    buf = x.numpy()
    mpi = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter_ns()
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        mpi.append(time.perf_counter_ns() - t0)
    out["mpi_allreduce"] = statistics.median(mpi) / 1e3
    return out


def print_breakdown(per_rank):
    print("\n4 KiB all-reduce, median microseconds per phase")
    print(f"{'phase':>15} " + " ".join(f"{'rank ' + str(r):>9}" for r in range(len(per_rank))))
    for k in BREAKDOWN_PHASES + ["total", "mpi_allreduce"]:
        print(f"{k:>15} " + " ".join(f"{m[k]:9.1f}" for m in per_rank))
    slowest = max(m["total"] for m in per_rank)
    mpi = max(m["mpi_allreduce"] for m in per_rank)
    print(f"slowest rank's total / MPI_Allreduce: {slowest / mpi:.1f}x")


def worker(args):
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import hvdtorch as hvd

    torch.set_num_threads(1)
    hvd.init()
    peer = None
    if args.horovod:
        import horovod.torch as peer  # MPI is already initialised (mpi4py): Horovod uses it

        peer.init()
    comm = MPI.COMM_WORLD
    rank, n = hvd.rank(), hvd.size()
    assert comm.Get_rank() == rank and comm.Get_size() == n
    rows = []
    if args.breakdown:
        per_rank = comm.gather(breakdown(hvd, comm, MPI, args.breakdown), root=0)
        if rank == 0:
            print_breakdown(per_rank)
            print("ROWS []", flush=True)
        hvd.shutdown()
        return

    def timed_interleaved(impls, reps):
        """name -> the op's time: the median over `reps` rounds, each round
        running every implementation once (barrier-aligned) in an order that
        rotates, so a burst of load hits all alike and none always follows
        the same one; the slowest rank's median, where the collective is done."""
        for fn in impls.values():
            fn()  # warm-up (and, for hvdtorch, negotiation + response cache)
        names = list(impls)
        times = {name: [] for name in names}
        for rep in range(reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                comm.Barrier()
                t0 = time.perf_counter()
                impls[name]()
                times[name].append(time.perf_counter() - t0)
        return {name: max(comm.allgather(statistics.median(ts))) for name, ts in times.items()}

    for nbytes in sizes(args.min_bytes, args.max_bytes):
        count = nbytes // 4
        x = torch.ones(count, dtype=torch.float32)
        reps = args.reps if nbytes <= (16 << 20) else max(3, args.reps // 2)
        impls = {
            f"hvdtorch-{r}": functools.partial(hvd.allreduce_, x, op=hvd.Sum, name=f"bench.{r}.{nbytes}", reducer=r)
            for r in hvd_reducers()
        }
        impls["gloo"] = functools.partial(dist.all_reduce, x)
        impls["mpi"] = functools.partial(comm.Allreduce, MPI.IN_PLACE, x.numpy(), op=MPI.SUM)
        if peer is not None:
            impls["horovod"] = functools.partial(peer.allreduce_, x, op=peer.Sum, name=f"horovod.{nbytes}")
        for name, t in timed_interleaved(impls, reps).items():
            algbw = nbytes / t
            rows.append(
                {
                    "ranks": n,
                    "bytes": nbytes,
                    "impl": name,
                    "time_s": t,
                    "algbw_GBps": algbw / 1e9,
                    "busbw_GBps": algbw * 2 * (n - 1) / n / 1e9,
                }
            )
        if rank == 0:
            print(f"  {n} ranks, {nbytes:>10} B done", file=sys.stderr, flush=True)
    if rank == 0:
        print("ROWS " + json.dumps(rows), flush=True)
    if peer is not None:
        peer.shutdown()
    hvd.shutdown()


def memcpy_bandwidth() -> float:
    import torch

    torch.set_num_threads(1)
    a = torch.ones(64 << 18)
    b = torch.empty_like(a)
    ts = []
    for _ in range(7):
        t0 = time.perf_counter()
        b.copy_(a)
        ts.append(time.perf_counter() - t0)
    return a.numel() * 4 / statistics.median(ts) / 1e9  # bytes copied per second


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = sorted({r["ranks"] for r in rows})
    fig, axes = plt.subplots(1, len(worlds), figsize=(6 * len(worlds), 4.5), squeeze=False)
    for ax, n in zip(axes[0], worlds):
        for impl in sorted({r["impl"] for r in rows}):
            pts = sorted((r["bytes"], r["busbw_GBps"]) for r in rows if r["ranks"] == n and r["impl"] == impl)
            style = "--" if impl in ("gloo", "mpi", "horovod") else "-"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3, label=impl)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"all-reduce, {n} ranks on one host")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--min-bytes", type=parse_bytes, default=4 << 10)
    p.add_argument("--max-bytes", type=parse_bytes, default=256 << 20)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--horovod", action="store_true", help="also Horovod 0.28.1 (benchmarks/peers/build_horovod.sh)")
    p.add_argument("--breakdown", type=int, default=0, metavar="N", help="phases of N 4 KiB all-reduces instead")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    rank_python = sys.executable
    if args.horovod:
        if not os.path.exists(HOROVOD_PYTHON):
            raise SystemExit(f"--horovod needs {HOROVOD_PYTHON}: run benchmarks/peers/build_horovod.sh first")
        rank_python = HOROVOD_PYTHON

    os.makedirs(args.out, exist_ok=True)
    mem = memcpy_bandwidth()
    print(f"memcpy bandwidth (one core, 64 MiB): {mem:.2f} GB/s")
    rows = []
    env = dict(
        os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1", PYTHONPATH=ROOT
    )
    for n in [int(v) for v in args.ranks.split(",")]:
        cmd = (
            [
                "mpirun",
                "--oversubscribe",
                "-np",
                str(n),
                rank_python,
                os.path.abspath(__file__),
                "--worker",
                "--min-bytes",
                str(args.min_bytes),
                "--max-bytes",
                str(args.max_bytes),
                "--reps",
                str(args.reps),
            ]
            + (["--horovod"] if args.horovod else [])
            + (["--breakdown", str(args.breakdown)] if args.breakdown else [])
        )
        print(f"$ {' '.join(cmd[:4])} python benchmarks/allreduce.py --worker ...", flush=True)
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
        if out.returncode != 0:
            raise SystemExit(f"benchmark with {n} ranks failed (exit {out.returncode})")
        if args.breakdown:
            print(out.stdout[: out.stdout.find("ROWS ")], end="")
            continue
        rows += json.loads(next(line for line in out.stdout.splitlines() if line.startswith("ROWS "))[5:])

    if args.breakdown:
        return
    csv_path = os.path.join(args.out, "allreduce.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    impls = [f"hvdtorch-{r}" for r in hvd_reducers()] + ["gloo", "mpi"] + (["horovod"] if args.horovod else [])
    for n in sorted({r["ranks"] for r in rows}):
        print(f"\n{n} ranks: median time (us) / busbw (GB/s) / busbw ratio to gloo")
        print(f"{'bytes':>10} " + " ".join(f"{i.replace('hvdtorch-', 'hvd-'):>23}" for i in impls))
        for nbytes in sorted({r["bytes"] for r in rows if r["ranks"] == n}):
            cell = {r["impl"]: r for r in rows if r["ranks"] == n and r["bytes"] == nbytes}
            gloo = cell["gloo"]["busbw_GBps"]
            print(
                f"{nbytes:>10} "
                + " ".join(
                    f"{cell[i]['time_s'] * 1e6:10.1f} {cell[i]['busbw_GBps']:5.2f} {cell[i]['busbw_GBps'] / gloo:5.2f}x"
                    for i in impls
                )
            )
    png = os.path.join(args.out, "allreduce.png")
    plot(rows, png)
    print(f"\nwrote {csv_path} and {png}")


if __name__ == "__main__":
    main()
