"""The same all-reduces under mpirun and under torchrun: how much does the
launcher cost? mpirun binds each rank to a core, torchrun binds nothing, so
under torchrun the ranks' threads float over the machine's cores, except the
engine's own threads, which hvdtorch pins itself (HVDTORCH_THREAD_AFFINITY=auto,
csrc/core/common/thread_placement.h).

    python benchmarks/launchers.py                        # 2 ranks, 1-64 MiB, 3 job pairs
    python benchmarks/launchers.py --pairs 5 --sizes 4M,16M,64M
    python benchmarks/launchers.py --bind                 # also torchrun with each rank bound to its cores
    python benchmarks/launchers.py --unpinned             # also torchrun with HVDTORCH_THREAD_AFFINITY=off

Each pair runs one mpirun job and one torchrun job (then, with --bind, a
torchrun job whose ranks bind themselves to cores as mpirun would: local
rank i to core i mod cores; with --unpinned, a torchrun job whose engine
threads float too), alternating which launcher goes first. Inside a
job, per size: hvd.allreduce_ (in place) and hvd.allreduce (a fresh output
every call, whose pages fault in) with reducer auto, and Gloo's all_reduce,
each --reps times, every op aligned by a barrier, the op's time the slowest
rank's; a job's value is the median over its reps. Prints per size and
operation the median [min-max] over the pairs for each launcher and
torchrun / mpirun of the medians; writes the rows as JSON lines to --out.
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
OPS = ("allreduce_", "allreduce", "gloo")


def parse_bytes(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def worker(args):
    import torch
    import torch.distributed as dist

    import hvdtorch as hvd

    if args.bind:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[int(os.environ["LOCAL_RANK"]) % len(cores)]})
    torch.set_num_threads(1)
    hvd.init()
    rows = []
    for nbytes in [parse_bytes(s) for s in args.sizes.split(",")]:
        x = torch.ones(nbytes // 4)
        ops = {
            "allreduce_": functools.partial(hvd.allreduce_, x, op=hvd.Sum, name=f"launchers.inplace.{nbytes}"),
            "allreduce": functools.partial(hvd.allreduce, x, op=hvd.Sum, name=f"launchers.out.{nbytes}"),
            "gloo": functools.partial(dist.all_reduce, x),
        }
        for op, fn in ops.items():
            fn()  # warm-up: negotiation, the response cache, auto's first choice
            times = []
            for _ in range(args.reps):
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            t = torch.tensor([statistics.median(times)], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the collective is done when the slowest rank is
            rows.append({"bytes": nbytes, "op": op, "time_s": t.item()})
    if hvd.rank() == 0:
        print("ROWS " + json.dumps(rows), flush=True)
    hvd.shutdown()


def run_job(launcher: str, args, port: int):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    script = [os.path.abspath(__file__), "--worker", "--sizes", args.sizes, "--reps", str(args.reps)]
    if launcher == "mpirun":
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        cmd = ["mpirun", "--oversubscribe", "-np", str(args.ranks), sys.executable, *script]
    else:
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        cmd = [torchrun, "--standalone", f"--nproc_per_node={args.ranks}", *script]
        if launcher == "torchrun-bound":
            cmd.append("--bind")
        if launcher == "torchrun-unpinned":
            env["HVDTORCH_THREAD_AFFINITY"] = "off"
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, timeout=args.job_timeout)
    if out.returncode != 0:
        raise SystemExit(f"launchers.py: the {launcher} job failed (exit {out.returncode})")
    rows = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("ROWS "))[5:])
    for r in rows:
        r["launcher"] = launcher
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--sizes", default="1M,4M,16M,64M")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--bind", action="store_true", help="also torchrun with each rank bound to a core")
    p.add_argument("--unpinned", action="store_true", help="also torchrun with the engine threads unpinned")
    p.add_argument("--job-timeout", type=float, default=600)
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "launchers"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    os.makedirs(args.out, exist_ok=True)
    launchers = ["mpirun", "torchrun"] + (["torchrun-bound"] if args.bind else [])
    launchers += ["torchrun-unpinned"] if args.unpinned else []
    rows = []
    for pair in range(args.pairs):
        order = launchers if pair % 2 == 0 else launchers[::-1]
        for launcher in order:
            got = run_job(launcher, args, 29500 + pair)
            for r in got:
                r.update(pair=pair, machine_load=os.getloadavg()[0])
            rows += got
            print(f"pair {pair}: {launcher} done", file=sys.stderr, flush=True)
    with open(os.path.join(args.out, "launchers.jsonl"), "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")

    def cell(launcher, nbytes, op):
        return [r["time_s"] for r in rows if (r["launcher"], r["bytes"], r["op"]) == (launcher, nbytes, op)]

    print(f"\n{args.ranks} ranks, {args.pairs} job pairs: median [min-max] ms over the jobs")
    head = "".join(f"{lname:>26}" for lname in launchers)
    ratios = "".join(f"{lname + ' / mpirun':>28}" for lname in launchers[1:])
    print(f"{'size':>8} {'op':>11}{head}{ratios}")
    for nbytes in [parse_bytes(s) for s in args.sizes.split(",")]:
        for op in OPS:
            med = {lname: statistics.median(cell(lname, nbytes, op)) for lname in launchers}
            line = f"{human(nbytes):>8} {op:>11}"
            for lname in launchers:
                ts = cell(lname, nbytes, op)
                line += f"{med[lname] * 1e3:>11.1f} [{min(ts) * 1e3:.1f}-{max(ts) * 1e3:.1f}]".rjust(26)
            for lname in launchers[1:]:
                line += f"{med[lname] / med['mpirun']:>28.2f}"
            print(line)


if __name__ == "__main__":
    main()
