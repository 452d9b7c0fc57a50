"""Is reducer `auto` stable and fast? N fresh init()/shutdown() cycles in one
job; per cycle and message size, the reducer `auto` runs, and `auto`'s time
against every fixed reducer's.

    python benchmarks/auto_stability.py                       # 2 ranks under mpirun, 10 cycles, 4 KiB .. 256 MiB
    python benchmarks/auto_stability.py --runs 3 --max-bytes 16M
    python benchmarks/auto_stability.py --launcher torchrun
    python benchmarks/auto_stability.py --report a.json b.json  # the cycles of several jobs together

Each cycle: hvd.init() (which calibrates), the choice table right after it
(`init`); then --warmup `auto` all-reduces per size, as a training job's
first steps would run them (the model explores and learns online), and the
choice table again (`learnt`); then interleaved rounds per size of `auto` and
each fixed reducer (5 up to 1 MiB, 3 up to 16 MiB, 1 above; a fresh
shuffled order every round), each op barrier-aligned (torch.distributed barrier on
the default group hvd.init() creates) and its time the slowest rank's; then the choice table once more
(`final`) and hvd.shutdown().

Prints the choice per size per cycle for each table, whether every cycle
agreed, and per size the median (min-max over cycles) time of `auto` and of
each fixed reducer, with auto / best-fixed. Writes the rows as JSON to --out.
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
    return 5 if nbytes <= (1 << 20) else 3 if nbytes <= (16 << 20) else 1


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

        times = {}
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
        tables["final"] = choices(engine, byte_sizes)
        model = engine.reducer_choices()
        hvd.shutdown()
        rows.append(
            {
                "run": run,
                "init_s": init_s,
                "tables": {t: {str(n): c for n, c in tab.items()} for t, tab in tables.items()},
                "times_s": {f"{n}:{impl}": v for (n, impl), v in times.items()},
                "model": model,
            }
        )
        if int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))) == 0:
            print(f"  cycle {run}: init {init_s * 1e3:.0f} ms", file=sys.stderr, flush=True)
    if int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))) == 0:
        print("ROWS " + json.dumps(rows), flush=True)


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
    impls = ["auto"] + [i for i in fixed_reducers() if f"{byte_sizes[0]}:{i}" in rows[0]["times_s"]]
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


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--runs", type=int, default=10, help="fresh init()/shutdown() cycles")
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
        rows = [row for path in args.report for row in json.load(open(path))]
        return report(rows, sorted({int(n) for row in rows for n in row["tables"]["init"]}))
    passed = ["--worker", "--runs", str(args.runs), "--min-bytes", str(args.min_bytes)]
    passed += ["--max-bytes", str(args.max_bytes), "--warmup", str(args.warmup)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    if args.launcher == "mpirun":
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd = ["mpirun", "--oversubscribe", "-np", str(args.ranks), sys.executable]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.ranks}"]
    cmd += [os.path.abspath(__file__)] + passed
    print(f"$ {' '.join(cmd)}", flush=True)
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise SystemExit(f"benchmark failed (exit {out.returncode})")
    rows = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("ROWS "))[5:])
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    report(rows, list(sizes(args.min_bytes, args.max_bytes)))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
