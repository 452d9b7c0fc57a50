"""Autotune against the fusion sweep, in one job: does HVDTORCH_AUTOTUNE end
near the best fixed setting?

    torchrun --nproc_per_node=2 benchmarks/autotune_sweep.py
    mpirun -np 2 python benchmarks/autotune_sweep.py --steps 10 --rounds 3

Workload: the comm-heavy training setting (FCHeavyNet, 32 px, batch 8 per
rank, synthetic data, SGD), DistributedModel with sync on backward.

1. Autotune: init(autotune=1) and train until the tuner freezes (its trials
   go to --log). The steps this takes are reported as the tuning cost.
2. Sweep: every fixed setting of autotune's grid (fusion sizes x cycle
   times, all 15, not only the ones coordinate search tried) and the frozen
   setting ("autotune") are measured on the same model, put into effect the
   way the tuner does (autotune.apply_setting: bucket cap + engine fusion
   threshold + cycle time), in --rounds rounds whose order rotates, each
   window --steps steps after 2 warm-up steps and aligned by a barrier on
   both ends (every rank times the same interval; img/s from the slowest
   rank's time). Medians over rounds, with min-max.

Prints one row per setting and, last, autotune's median img/s relative to
the best setting's (the target: within 5%). --out appends JSON lines.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import hvdtorch as hvd  # noqa: E402
from hvdtorch import autotune  # noqa: E402

try:  # the benchmark workloads may live outside the library package
    from benchmarks.workloads.fc_heavy import FCHeavyNet  # noqa: E402
except ImportError:
    try:
        from benchmarks.workloads import FCHeavyNet  # noqa: E402
    except ImportError:
        from hvdtorch.models import FCHeavyNet  # noqa: E402

MiB = 1 << 20
IMAGE_SIZE, BATCH, CLASSES = 32, 8, 25


def make_batch(rank):
    g = torch.Generator().manual_seed(rank)
    return torch.randn(BATCH, 3, IMAGE_SIZE, IMAGE_SIZE, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)


def train_step(model, opt, x, y):
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


def barrier(tag):
    hvd.allreduce(torch.zeros(1), name=f"sweep.barrier.{tag}")


def timed_window(model, opt, x, y, steps, tag):
    """img/s of every rank together over `steps` steps, by the slowest rank's clock."""
    for _ in range(2):
        train_step(model, opt, x, y)
    barrier(f"{tag}.start")
    t0 = time.perf_counter()
    for _ in range(steps):
        train_step(model, opt, x, y)
    barrier(f"{tag}.end")
    elapsed = hvd.allreduce(torch.tensor([time.perf_counter() - t0]), op=hvd.Max, name=f"sweep.time.{tag}")
    return steps * BATCH * hvd.size() / float(elapsed)


def label(s):
    size = f"{s.fusion_bytes // MiB} MiB" if s.fusion_bytes >= MiB else f"{s.fusion_bytes} B"
    return f"fusion {size}, cycle {s.cycle_time_ms:g} ms"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per window")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over all settings")
    ap.add_argument("--steps-per-trial", type=int, default=5, help="HVDTORCH_AUTOTUNE_STEPS_PER_TRIAL")
    ap.add_argument("--warmup-steps", type=int, default=1, help="HVDTORCH_AUTOTUNE_WARMUP_STEPS")
    ap.add_argument("--tuning-rounds", type=int, default=2, help="HVDTORCH_AUTOTUNE_ROUNDS")
    ap.add_argument("--max-tuning-steps", type=int, default=200)
    ap.add_argument("--trials-log", default="autotune_sweep_trials.csv", help="HVDTORCH_AUTOTUNE_LOG")
    ap.add_argument("--out", default="", help="append JSON lines here (rank 0)")
    args = ap.parse_args()

    hvd.init(
        autotune=1,
        autotune_log=args.trials_log,
        autotune_steps_per_trial=args.steps_per_trial,
        autotune_warmup_steps=args.warmup_steps,
        autotune_rounds=args.tuning_rounds,
    )
    rank, size = hvd.rank(), hvd.size()
    if size < 2:
        raise SystemExit("autotune_sweep: run with at least 2 ranks (autotune needs communication to tune)")
    torch.manual_seed(0)
    model = hvd.DistributedModel(FCHeavyNet(num_classes=CLASSES, image_size=IMAGE_SIZE), name="sweep")
    opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    x, y = make_batch(rank)
    tuner = autotune.current()
    assert tuner is not None

    # 1. Autotune until frozen.
    t0 = time.perf_counter()
    tuning_steps = 0
    while not tuner.done and tuning_steps < args.max_tuning_steps:
        train_step(model, opt, x, y)
        tuning_steps += 1
    tuning_s = time.perf_counter() - t0
    if tuner.frozen is None:
        raise SystemExit(f"autotune_sweep: no freeze after {tuning_steps} steps")
    frozen = tuner.frozen

    # 2. The full grid and the frozen setting, interleaved.
    grid = [autotune.Setting(f, c) for f in autotune.FUSION_CANDIDATES for c in autotune.CYCLE_CANDIDATES_MS]
    configs = [("autotune", frozen)] + [(label(s), s) for s in grid]
    results = {name: [] for name, _ in configs}
    for r in range(args.rounds):
        shift = r % len(configs)
        for name, setting in configs[shift:] + configs[:shift]:
            autotune.apply_setting(setting, model._set_fusion_bytes)
            results[name].append(timed_window(model, opt, x, y, args.steps, f"{r}.{name}"))

    if rank != 0:
        hvd.shutdown()
        return
    med = {name: statistics.median(v) for name, v in results.items()}
    best_name = max((name for name, _ in configs[1:]), key=lambda n: med[n])
    print(f"# {size} ranks, FCHeavyNet {IMAGE_SIZE}px batch {BATCH}/rank, {args.rounds} rounds x {args.steps} steps")
    print(
        f"# autotune: {len(tuner.search.trials)} trials in {tuning_steps} steps ({tuning_s:.1f} s), "
        f"froze {label(frozen)}"
    )
    for name, _ in configs:
        v = results[name]
        mark = "  <- best fixed" if name == best_name else ""
        print(f"{name:<28} {med[name]:7.1f} img/s  ({min(v):.1f}-{max(v):.1f}){mark}")
    ratio = med["autotune"] / med[best_name]
    print(f"autotune / best fixed ({best_name}): {ratio:.3f}  (target >= 0.95)")
    if args.out:
        with open(args.out, "a") as f:
            for name, setting in configs:
                row = dict(
                    config=name,
                    fusion_bytes=setting.fusion_bytes,
                    cycle_time_ms=setting.cycle_time_ms,
                    size=size,
                    img_s_median=med[name],
                    img_s=results[name],
                )
                f.write(json.dumps(row) + "\n")
            f.write(
                json.dumps(
                    dict(config="summary", ratio=ratio, best=best_name, tuning_steps=tuning_steps, tuning_s=tuning_s)
                )
                + "\n"
            )
    hvd.shutdown()


if __name__ == "__main__":
    main()
