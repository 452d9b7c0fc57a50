"""Is reducer `auto` stable and fast? N fresh init()/shutdown() cycles in one
job, or in each of several fresh jobs; per cycle and message size, the reducer
`auto` runs, and `auto`'s time against every fixed reducer's.

    python benchmarks/auto_stability.py                       # 2 ranks under mpirun, 10 cycles, 4 KiB .. 256 MiB
    python benchmarks/auto_stability.py --jobs 5 --runs 2     # 5 fresh jobs of 2 cycles: auto / best per job
    python benchmarks/auto_stability.py --runs 3 --max-bytes 16M
    python benchmarks/auto_stability.py --launcher torchrun
    python benchmarks/auto_stability.py --report a.json b.json  # the cycles of several jobs together

Each cycle: hvd.init() (which calibrates), the choice table right after it
(`init`); then --warmup `auto` all-reduces per size, as a training job's
first steps would run them (the model explores and learns online), and the
choice table again (`learnt`); then interleaved rounds per size of `auto` and
each fixed reducer (200 up to 1 MiB, 100 up to 16 MiB, 30 at 64 MiB, 15
above; a fresh shuffled order every round), each op
barrier-aligned (torch.distributed barrier on the default group hvd.init()
creates) and its time the slowest rank's; then the choice table once more
(`final`) and hvd.shutdown().

Prints the choice per size per cycle for each table, whether every cycle
agreed, and per size the median (min-max over cycles) time of `auto` and of
each fixed reducer, with auto / best-fixed. With --jobs, also per job and
size auto / best-fixed, each the median of every sample of the job's cycles,
and in how many jobs `auto` was within --tolerance of the best at every size.
Writes the rows as JSON to --out.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fixed_reducers():
    """The registry's reducers of the standard ops (csrc/core/algorithms/reducer_registry.h), each timed
    against auto."""
    from hvdtorch import _C

    return [row["name"] for row in _C.reducer_registry() if row["own_op"] is None]


def parse_bytes(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def human(n: int) -> str:
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= div:
            return f"{n // div}{unit}"
    return str(n)


def sizes(lo: int, hi: int):
    b = lo
    while b <= hi:
        yield b
        b *= 4


def rounds(nbytes: int) -> int:
    """Interleaved timing rounds per cycle: more where one op is short."""
    # Single ops range 2-3x on a shared VM at every size, and the fixed
    # reducers are within 5-10% of each other: each median needs tens of
    # samples to settle within a few percent, or "auto within 10% of the
    # best" measures the noise.
    # (60 rounds per cycle at 64 KiB still left one job in five at 1.18x for
    # the very reducer that was best.)
    return 200 if nbytes <= (1 << 20) else 100 if nbytes <= (16 << 20) else 30 if nbytes <= (64 << 20) else 15


def choices(engine, byte_sizes):
    """Size -> the reducer `auto` runs for float32 Sum, per the model's bands."""
    import torch

    return {n: engine.choose_reducer(n, torch.float32) for n in byte_sizes}


def worker(args):
    import torch
    import torch.distributed as dist

    import hvdtorch as hvd

    torch.set_num_threads(1)
    byte_sizes = list(sizes(args.min_bytes, args.max_bytes))
    rows = []
    for run in range(args.runs):
        t0 = time.perf_counter()
        hvd.init()
        init_s = time.perf_counter() - t0
        engine = hvd.runtime.state().engine
        fixed = [r for r in fixed_reducers() if r in engine.cost_model()]
        tables = {"init": choices(engine, byte_sizes)}
        bufs = {n: torch.ones(n // 4) for n in byte_sizes}
        for n in byte_sizes:
            for _ in range(args.warmup):
                hvd.allreduce_(bufs[n], name=f"warm.{n}")
        tables["learnt"] = choices(engine, byte_sizes)

        def timed(buf, name, reducer):
            dist.barrier()
            t = time.perf_counter()
            hvd.allreduce_(buf, name=name, reducer=reducer)
            t = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # done when the slowest rank is done
            return t.item()

        times, all_samples = {}, {}
        impls = ["auto"] + fixed
        for n in byte_sizes:
            samples = {impl: [] for impl in impls}
            for rnd in range(rounds(n)):
                # A fresh order every round (the same on every rank): no
                # implementation always follows the same one (after `native`,
                # a c10d op, the next op is slower).
                order = list(impls)
                random.Random(1000 * run + rnd).shuffle(order)
                for impl in order:
                    name = "warm" if impl == "auto" else f"fixed.{impl}"
                    samples[impl].append(timed(bufs[n], f"{name}.{n}", impl))
            for impl in impls:
                times[(n, impl)] = statistics.median(samples[impl])
                all_samples[(n, impl)] = samples[impl]
        tables["final"] = choices(engine, byte_sizes)
        model = engine.reducer_choices()
        hvd.shutdown()
        rows.append(
            {
                "run": run,
                "init_s": init_s,
                "tables": {t: {str(n): c for n, c in tab.items()} for t, tab in tables.items()},
                "times_s": {f"{n}:{impl}": v for (n, impl), v in times.items()},
                "samples_s": {f"{n}:{impl}": v for (n, impl), v in all_samples.items()},
                "model": model,
            }
        )
        if int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))) == 0:
            print(f"  cycle {run}: init {init_s * 1e3:.0f} ms", file=sys.stderr, flush=True)
    if int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))) == 0:
        print("ROWS " + json.dumps(rows), flush=True)


def timed_impls(rows, byte_sizes):
    """`auto` and the fixed reducers that the saved rows hold times of."""
    return ["auto"] + [i for i in fixed_reducers() if f"{byte_sizes[0]}:{i}" in rows[0]["times_s"]]


def report(rows, byte_sizes):
    runs = len(rows)
    init_ms = " ".join(f"{r['init_s'] * 1e3:.0f}" for r in rows)
    print(f"\ninit() time per cycle (ms): {init_ms}")
    for table in ("init", "learnt", "final"):
        print(f"\n`auto` choice per size, table `{table}`, one column per cycle:")
        stable = 0
        for n in byte_sizes:
            picks = [r["tables"][table][str(n)] for r in rows]
            same = len(set(picks)) == 1
            stable += same
            print(f"  {human(n):>5}  {' '.join(f'{p:<7}' for p in picks)}  {'same' if same else 'DIFFERS'}")
        print(f"  sizes with the same choice in {runs} of {runs} cycles: {stable} of {len(byte_sizes)}")
    impls = timed_impls(rows, byte_sizes)
    print(f"\nms: median (min-max) over {runs} cycles of each cycle's median; auto / best fixed by median:")
    print(f"{'size':>6} " + " ".join(f"{i:>22}" for i in impls) + "   auto/best")
    for n in byte_sizes:
        cells, med = [], {}
        for i in impls:
            ts = [r["times_s"][f"{n}:{i}"] * 1e3 for r in rows]
            med[i] = statistics.median(ts)
            cells.append(f"{med[i]:8.3f} ({min(ts):5.2f}-{max(ts):6.2f})")
        best = min((v, k) for k, v in med.items() if k != "auto")
        print(f"{human(n):>6} " + " ".join(f"{c:>22}" for c in cells) + f"   {med['auto'] / best[0]:.2f} ({best[1]})")


def per_job(rows, byte_sizes, tolerance):
    """auto / best fixed per job and size, from all of a job's samples; the
    jobs where auto was within `tolerance` of the best at every size."""
    jobs = sorted({r.get("job", 0) for r in rows})
    impls = timed_impls(rows, byte_sizes)
    print("\nper job: auto / best fixed (the best's name), medians of every sample of the job's cycles")
    print(f"{'size':>6} " + " ".join(f"{'job ' + str(j):>16}" for j in jobs))
    worst = {j: 0.0 for j in jobs}
    for n in byte_sizes:
        line = f"{human(n):>6} "
        for j in jobs:
            mine = [r for r in rows if r.get("job", 0) == j]
            med = {}
            for i in impls:
                pooled = [t for r in mine for t in r.get("samples_s", {}).get(f"{n}:{i}", [r["times_s"][f"{n}:{i}"]])]
                med[i] = statistics.median(pooled)
            best = min((v, k) for k, v in med.items() if k != "auto")
            ratio = med["auto"] / best[0]
            worst[j] = max(worst[j], ratio)
            line += f"{ratio:>7.2f} ({best[1]:>7})"
        print(line)
    print("  worst size per job: " + "  ".join(f"job {j}: {worst[j]:.2f}" for j in jobs))
    within = sum(w <= 1 + tolerance for w in worst.values())
    print(f"  jobs where auto is within {tolerance:.0%} of the best fixed reducer at every size:", end=" ")
    print(f"{within} of {len(jobs)}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--runs", type=int, default=10, help="fresh init()/shutdown() cycles per job")
    p.add_argument("--jobs", type=int, default=1, help="fresh jobs (launcher invocations)")
    p.add_argument("--tolerance", type=float, default=0.10, help="auto / best - 1 counted as within")
    p.add_argument("--min-bytes", type=parse_bytes, default=4 << 10)
    p.add_argument("--max-bytes", type=parse_bytes, default=256 << 20)
    p.add_argument("--warmup", type=int, default=32, help="auto all-reduces per size before the `learnt` table")
    p.add_argument("--launcher", choices=["mpirun", "torchrun"], default="mpirun")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "perf", "auto_stability.json"))
    p.add_argument("--report", nargs="+", metavar="JSON", help="only report the cycles saved in these --out files")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.report:
        rows = []
        for k, path in enumerate(args.report):
            for row in json.load(open(path)):
                row.setdefault("job", k)  # files saved before --jobs: one job each
                rows.append(row)
        byte_sizes = sorted({int(n) for row in rows for n in row["tables"]["init"]})
        report(rows, byte_sizes)
        return per_job(rows, byte_sizes, args.tolerance)
    passed = ["--worker", "--runs", str(args.runs), "--min-bytes", str(args.min_bytes)]
    passed += ["--max-bytes", str(args.max_bytes), "--warmup", str(args.warmup)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    if args.launcher == "mpirun":
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd = ["mpirun", "--oversubscribe", "-np", str(args.ranks), sys.executable]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.ranks}"]
    cmd += [os.path.abspath(__file__)] + passed
    rows = []
    for job in range(args.jobs):
        print(f"$ {' '.join(cmd)}   # job {job}", flush=True)
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
        if out.returncode != 0:
            raise SystemExit(f"benchmark job {job} failed (exit {out.returncode})")
        got = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("ROWS "))[5:])
        for row in got:
            row["job"] = job
        rows += got
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, separators=(",", ":"))  # every sample: compact
    byte_sizes = list(sizes(args.min_bytes, args.max_bytes))
    report(rows, byte_sizes)
    per_job(rows, byte_sizes, args.tolerance)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
