"""The main job (`make demo`): hvdtorch learns, and scales.

1. A small CNN learns to classify synthetic images (examples/learn.py) with
   1 and then 2 processes through torchrun, on the same global batch: the
   loss falls, the held-out accuracy rises, and the 2-process loss curve
   must match the 1-process one (the demo fails if it does not).
2. GoogLeNet trains on CPU with 1 and 2 processes (examples/train.py): the
   throughput of each and the scaling efficiency of 2 processes against
   twice the 1-process throughput. One thread per process.
3. A plot (loss and accuracy per step for 1 and 2 processes, throughput of
   both jobs) is written to build/demo/demo.png, and its path printed.

    python examples/demo.py            # about a minute on 2 idle cores
    python examples/demo.py --quick    # a short version (also HVDTORCH_DEMO_QUICK=1), for tests
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "build", "demo")

# The curves of 1 and 2 processes differ only by the order of floating-point
# sums; the difference grows slowly with the steps (momentum carries it).
EARLY_STEPS, EARLY_TOLERANCE = 20, 1e-3
ABS_TOLERANCE, REL_TOLERANCE = 0.03, 0.05


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc: int, script: str, args):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        f"--master_port={_free_port()}",
        os.path.join(ROOT, "examples", script),
        *args,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    print(f"$ torchrun --nproc_per_node={nproc} examples/{script} {' '.join(args)}", flush=True)
    return cmd, env


def learn(nproc: int, steps: int, eval_every: int) -> dict:
    result_path = os.path.join(OUT_DIR, f"learn-{nproc}.json")
    if os.path.exists(result_path):
        os.remove(result_path)
    cmd, env = _torchrun(
        nproc, "learn.py", ["--steps", str(steps), "--eval-every", str(eval_every), "--result", result_path]
    )
    proc = subprocess.run(cmd, env=env, timeout=900)  # the progress bar goes straight to the terminal
    if proc.returncode != 0 or not os.path.exists(result_path):
        raise SystemExit(f"demo: learning with {nproc} process(es) failed (exit {proc.returncode})")
    with open(result_path) as f:
        return json.load(f)


def throughput(nproc: int, train_args) -> dict:
    cmd, env = _torchrun(nproc, "train.py", train_args)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
        else:
            # train.py repeats one fixed synthetic batch (a speed measurement): its loss says nothing about learning.
            print("  " + re.sub(r", loss \d+\.\d+$", "", line))
    if proc.returncode != 0 or result is None:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"demo: training with {nproc} process(es) failed (exit {proc.returncode})")
    return result


def compare_curves(one, two):
    """The largest difference of the two loss curves, and the first step outside the tolerance (or None)."""
    worst, bad_step = 0.0, None
    for step, (a, b) in enumerate(zip(one, two), start=1):
        diff = abs(a - b)
        worst = max(worst, diff)
        limit = EARLY_TOLERANCE if step <= EARLY_STEPS else ABS_TOLERANCE + REL_TOLERANCE * abs(a)
        if diff > limit and bad_step is None:
            bad_step = step
    return worst, bad_step


def plot(one, two, googlenet, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curve, bars) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [2.2, 1]})
    for run, style in ((one, "-"), (two, "--")):
        n = run["processes"]
        label = f"{n} process{'es' if n > 1 else ''}"
        curve.plot(range(1, len(run["losses"]) + 1), run["losses"], style, lw=1, label=f"loss, {label}")
    curve.set_xlabel(f"step (global batch {one['global_batch']})")
    curve.set_ylabel("training loss")
    curve.set_yscale("log")
    acc = curve.twinx()
    for run, marker in ((one, "o"), (two, "x")):
        steps, accs = zip(*run["accuracies"])
        acc.plot(
            steps,
            [a * 100 for a in accs],
            marker,
            color="tab:green",
            label=f"held-out accuracy, {run['processes']} proc.",
        )
    acc.set_ylabel("held-out accuracy (%)", color="tab:green")
    acc.set_ylim(0, 100)
    lines = curve.get_legend_handles_labels()
    more = acc.get_legend_handles_labels()
    curve.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper right")
    curve.set_title("small CNN on synthetic images")

    labels = ["CNN\n1 proc", "CNN\n2 proc", "GoogLeNet\n1 proc", "GoogLeNet\n2 proc"]
    values = [one["img_per_s"], two["img_per_s"], googlenet[0]["img_per_s"], googlenet[1]["img_per_s"]]
    colors = ["tab:blue", "tab:orange", "tab:blue", "tab:orange"]
    bars.bar(range(4), values, color=colors)
    bars.set_yscale("log")
    for i, v in enumerate(values):
        bars.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    bars.set_xticks(range(4), labels, fontsize=8)
    bars.set_ylabel("images / s (log)")
    bars.set_title("throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--quick",
        action="store_true",
        default=os.environ.get("HVDTORCH_DEMO_QUICK") == "1",
        help="a short run (fewer steps everywhere)",
    )
    args = p.parse_args(argv)
    os.makedirs(OUT_DIR, exist_ok=True)
    steps, eval_every = (60, 20) if args.quick else (200, 25)
    gn_steps, gn_warmup = (3, 1) if args.quick else (20, 4)
    train_args = [
        "--image-size",
        "64",
        "--batch-size",
        "16",
        "--steps",
        str(gn_steps),
        "--warmup",
        str(gn_warmup),
        "--json",
    ]

    print("== 1. learning: a small CNN, synthetic images of 10 classes, the same global batch of 64", flush=True)
    one = learn(1, steps, eval_every)
    two = learn(2, steps, eval_every)
    worst, bad_step = compare_curves(one["losses"], two["losses"])
    first, last = one["losses"][0], sum(one["losses"][-10:]) / 10
    print(
        f"loss {first:.3f} -> {last:.3f} (mean of the last 10 steps); held-out accuracy "
        f"{one['accuracies'][0][1] * 100:.0f}% at step {one['accuracies'][0][0]} -> "
        f"{one['accuracies'][-1][1] * 100:.0f}% at step {one['accuracies'][-1][0]}"
    )
    if bad_step is not None:
        raise SystemExit(
            f"demo: the 2-process loss curve leaves the 1-process one at step {bad_step} "
            f"({one['losses'][bad_step - 1]:.5f} vs {two['losses'][bad_step - 1]:.5f})"
        )
    print(f"1 and 2 processes follow the same loss curve: largest difference {worst:.2e} over {steps} steps")

    print("\n== 2. throughput: GoogLeNet on CPU", flush=True)
    gn = [throughput(1, train_args), throughput(2, train_args)]
    path = os.path.join(OUT_DIR, "demo.png")
    plot(one, two, gn, path)
    eff = gn[1]["img_per_s"] / (2 * gn[0]["img_per_s"])
    print()
    print("GoogLeNet on CPU, 64x64 synthetic images, batch 16 per process, 1 thread per process")
    print(f"  1 process : {gn[0]['img_per_s']:7.1f} img/s")
    print(f"  2 processes: {gn[1]['img_per_s']:7.1f} img/s")
    print(f"  scaling efficiency: {eff * 100:.0f}% of ideal (2 x 1-process throughput)")
    print(f"small CNN: {one['img_per_s']:.0f} img/s with 1 process, {two['img_per_s']:.0f} img/s with 2")
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
