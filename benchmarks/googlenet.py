"""Training-throughput benchmark: hvdtorch against Horovod 0.28.1, torch DDP
(Gloo) and `solo`, in the same job, under torchrun or mpirun unchanged.

One job (one world size) per invocation:
    torchrun --nproc_per_node=2 benchmarks/googlenet.py --setting compute --configs auto:P+F,ddp,solo
    mpirun -np 2 build/horovod-venv/bin/python benchmarks/googlenet.py --setting comm \\
        --configs auto:P+F,horovod,ddp,solo          # with PYTHONPATH=<this tree>
benchmarks/run_training.sh runs the headline table (both launchers, both
settings, 2..4 ranks); run_suite.sh the per-reducer suite and plots.

Settings:
  compute  GoogLeNet, 64 px images, batch 16 per rank (compute dominates)
  small    GoogLeNet, 32 px images, batch 8 per rank (communication matters)
  comm     FCHeavyNet (conv trunk + 2x2048 FC head, 12.7 M parameters), 32 px, batch 8
GoogLeNet is torchvision's where torchvision imports, else the identical
benchmarks/workloads/googlenet.py (the output says which). Data: synthetic,
or --data DIR (an ImageFolder, e.g. from make_dataset.py, sharded with
DistributedSampler).

Configurations (--configs):
  <reducer>:<mode>  hvdtorch's DistributedModel; mode none / P (pipeline) /
                    F (25 MiB fusion) / P+F / a fusion size in bytes;
                    "/nobuffers" after it: broadcast_buffers=False (buffers
                    not synced before each forward)
  horovod           Horovod's DistributedOptimizer over its MPI operations;
                    MPI launchers only (Horovod cannot join a torchrun job), and
                    the ranks must run build/horovod-venv's Python
  ddp               torch DistributedDataParallel on the Gloo default group
  solo              the bare model on every rank, no gradient exchange: what
                    N processes reach on this machine without communication
  <any>+compiled    the same, its model torch.compile'd (DDP through torch's
                    DDPOptimizer, hvdtorch through the same graph splits);
                    compared with the same configuration eager and with the
                    peers compiled. Compilation happens in the first warmup.

Method: every configuration's model and optimizer are built once; then
--rounds rounds run the configurations in turn (ABCD ABCD ...), so machine
drift hits all alike. Each window: --warmup untimed steps, a barrier, --iters
timed steps, a barrier; the window is the time between leaving the first
barrier and leaving the second, so every rank times the same interval
(`solo` ranks too: they exchange no gradients, but start and end together).
The barriers run on a Gloo group of their own (not a group DDP or hvdtorch use).
img/s of a window = ranks x batch x iters / the longest window of any rank.
Per configuration: the median over rounds with min and max, and the median
per-step breakdown (data, forward, backward, waiting for gradient sync after
backward, optimizer step; DDP syncs inside backward, Horovod in its
synchronize()). The libraries not being measured stay initialised in the
background (one job for all). Rows are appended as JSON lines to
--out/<setting>.jsonl, one per configuration.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import hvdtorch as hvd  # noqa: E402
from benchmarks.workloads import FCHeavyNet, googlenet, googlenet_source, image_batches  # noqa: E402

SETTINGS = {
    "compute": dict(model="googlenet", image_size=64, batch=16),
    "small": dict(model="googlenet", image_size=32, batch=8),
    "comm": dict(model="fcheavy", image_size=32, batch=8),
}
MODES = {"none": (False, 0), "P": (True, 0), "F": (False, 25 << 20), "P+F": (True, 25 << 20)}
PHASES = ("data", "forward", "backward", "sync", "optim")
NUM_CLASSES = 25
MPI_LAUNCHERS = ("openmpi", "mpich", "single")


def build_model(setting):
    torch.manual_seed(0)  # the same initial weights on every rank, no broadcast needed
    s = SETTINGS[setting]
    if s["model"] == "googlenet":
        return googlenet(NUM_CLASSES)
    return FCHeavyNet(num_classes=NUM_CLASSES, image_size=s["image_size"])


def eager_name(name):
    """The configuration without "+compiled"."""
    return name[: -len("+compiled")] if name.endswith("+compiled") else name


def is_hvdtorch(name):
    return eager_name(name) not in ("solo", "ddp", "horovod")


def hvdtorch_options(name):
    """(reducer, pipeline, fusion bytes, broadcast buffers) of a
    <reducer>:<mode>[/nobuffers] configuration."""
    name = eager_name(name)
    name, nobuffers = (name[: -len("/nobuffers")], True) if name.endswith("/nobuffers") else (name, False)
    reducer, _, mode = name.partition(":")
    if not reducer or not (mode in MODES or mode.isdigit()):
        raise SystemExit(
            f"googlenet.py: unknown config {name!r}: solo, ddp, horovod, or <reducer>:<mode> with a reducer "
            f"(auto, node, ring, ...) and mode one of {', '.join(MODES)} or a fusion size in bytes"
        )
    pipeline, fusion = MODES[mode] if mode in MODES else (True, int(mode))
    return reducer, pipeline, fusion, not nobuffers


class Config:
    """One configuration's model, optimizer and the two calls that differ
    between libraries: sync() after backward, step() after sync."""

    def __init__(self, name, setting, size, horovod):
        self.name = name
        self.model = build_model(setting)
        self.sync = lambda: None  # solo; DDP waits inside backward
        if eager_name(name) == "horovod" and name != "horovod":
            raise SystemExit("googlenet.py: horovod+compiled: Horovod's optimizer is not compiled here")
        if eager_name(name) == "ddp" and size > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.model = DistributedDataParallel(self.model)
        elif is_hvdtorch(name):
            reducer, pipeline, fusion, buffers = hvdtorch_options(name)
            self.model = hvd.DistributedModel(
                self.model,
                reducer=reducer,
                pipeline=pipeline,
                fusion_bytes=fusion,
                sync="explicit",
                name=f"b.{name}",
                broadcast_buffers=buffers,
            )
            self.sync = self.model.sync_gradients
        self.forward = torch.compile(self.model) if name.endswith("+compiled") else self.model
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.step = self.opt.step
        if name == "horovod":
            self.opt = horovod.DistributedOptimizer(self.opt, named_parameters=self.model.named_parameters())
            self.sync = self.opt.synchronize
            self.step = self._horovod_step

    def _horovod_step(self):
        with self.opt.skip_synchronize():  # synchronize() already ran, timed as "sync"
            self.opt.step()


def train_steps(cfg, data, steps, phases=None):
    """``steps`` steps of ``cfg``: a Config, or any object with its model,
    opt, sync and step (benchmarks/cluster.py's, zero.py's); ``forward``,
    where there is one, is the call of the model to train through (the
    model compiled)."""
    forward = getattr(cfg, "forward", cfg.model)
    for _ in range(steps):
        t0 = time.perf_counter()
        x, y = next(data)
        t1 = time.perf_counter()
        loss = F.cross_entropy(forward(x), y)
        t2 = time.perf_counter()
        cfg.opt.zero_grad()
        loss.backward()
        t3 = time.perf_counter()
        cfg.sync()
        t4 = time.perf_counter()
        cfg.step()
        t5 = time.perf_counter()
        if phases is not None:
            for k, v in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                phases[k].append(v)


def measure_window(cfg, data, args, group):
    """One timed window; returns (longest window of any rank, per-phase
    medians, each the largest over ranks)."""
    train_steps(cfg, data, args.warmup)
    phases = {k: [] for k in PHASES}
    dist.barrier(group=group)
    t0 = time.perf_counter()
    train_steps(cfg, data, args.iters, phases)
    dist.barrier(group=group)
    elapsed = time.perf_counter() - t0
    values = torch.tensor([elapsed] + [statistics.median(phases[k]) for k in PHASES], dtype=torch.float64)
    dist.all_reduce(values, op=dist.ReduceOp.MAX, group=group)
    return values[0].item(), dict(zip(PHASES, values[1:].tolist()))


def init_horovod(configs):
    """horovod.torch, initialised, when a configuration needs it (else None)."""
    if "horovod" not in configs:
        return None
    launcher = hvd.runtime.state().launcher
    if launcher not in MPI_LAUNCHERS:
        raise SystemExit(
            f"googlenet.py: config 'horovod' needs an MPI job (mpirun), not {launcher}: under torchrun every "
            "Horovod process initialises MPI as a world of its own (size 1). Leave it out of --configs here."
        )
    try:
        import horovod.torch as horovod
    except ImportError as e:
        raise SystemExit(
            f"googlenet.py: config 'horovod' needs Horovod ({e}); run the ranks with build/horovod-venv/bin/python "
            "(benchmarks/peers/build_horovod.sh) and PYTHONPATH=<this tree>"
        ) from e
    horovod.init()
    if (horovod.rank(), horovod.size()) != (hvd.rank(), hvd.size()):
        raise SystemExit(
            f"googlenet.py: Horovod sees rank {horovod.rank()} of {horovod.size()}, "
            f"hvdtorch {hvd.rank()} of {hvd.size()}"
        )
    return horovod


def summary_row(args, name, size, windows, launcher):
    s = SETTINGS[args.setting]
    rates = [size * s["batch"] * args.iters / w for w, _ in windows]
    median = statistics.median(rates)
    return {
        "setting": args.setting,
        "config": name,
        "ranks": size,
        "launcher": launcher,
        "cores": os.cpu_count(),
        "batch_per_rank": s["batch"],
        "image_size": s["image_size"],
        "model": googlenet_source() if s["model"] == "googlenet" else "FCHeavyNet",
        "data": "jpeg" if args.data else "synthetic",
        "rounds": args.rounds,
        "iters": args.iters,
        "warmup": args.warmup,
        "img_per_s": median,
        "img_per_s_min": min(rates),
        "img_per_s_max": max(rates),
        "img_per_s_rounds": rates,
        "img_per_s_per_rank": median / size,
        "step_s": size * s["batch"] / median,
        **{f"{k}_s": statistics.median(p[k] for _, p in windows) for k in PHASES},
    }


def print_table(rows, size):
    over = " (oversubscribed: more ranks than the machine's cores)" if size > (os.cpu_count() or 1) else ""
    first = rows[0]
    header = f"{first['setting']}, {size} rank(s), {first['launcher']}{over}"
    print(f"\n{header}: img/s, median [min-max] of {first['rounds']} rounds")
    by = {r["config"]: r for r in rows}
    for r in rows:
        ratios = []
        name, compiled = eager_name(r["config"]), r["config"].endswith("+compiled")
        if is_hvdtorch(name):
            for peer in ("horovod", "ddp", "solo"):
                peer = peer + "+compiled" if compiled else peer
                if peer in by:
                    ratios.append(f"{r['img_per_s'] / by[peer]['img_per_s']:.2f}x {peer}")
        if compiled and name in by:
            ratios.append(f"{r['img_per_s'] / by[name]['img_per_s']:.2f}x eager")
        print(
            f"  {r['config']:>23}: {r['img_per_s']:7.1f} [{r['img_per_s_min']:.1f}-{r['img_per_s_max']:.1f}]"
            + (f"  ({', '.join(ratios)})" if ratios else ""),
        )


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=list(SETTINGS), default="compute")
    p.add_argument(
        "--configs",
        default="auto:P+F,ddp,solo",
        help="comma list: solo, ddp, horovod (MPI launchers), or <reducer>:<none|P|F|P+F|fusion bytes>",
    )
    p.add_argument("--rounds", type=int, default=5, help="rounds of interleaved windows (ABCD ABCD ...)")
    p.add_argument("--iters", type=int, default=12, help="timed steps per window")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before every window")
    p.add_argument("--data", help="ImageFolder root (default: synthetic)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args()
    if min(args.rounds, args.iters) < 1 or args.warmup < 0:
        p.error("--rounds and --iters must be at least 1, --warmup at least 0")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    configs = args.configs.split(",")
    for name in filter(is_hvdtorch, configs):
        hvdtorch_options(name)  # refuses a misspelt configuration before any rank starts work
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    launcher = hvd.runtime.state().launcher
    horovod = init_horovod(configs)
    window_group = dist.new_group(backend="gloo")  # used by the window barriers only
    s = SETTINGS[args.setting]
    built = {name: Config(name, args.setting, size, horovod) for name in configs}
    data = {name: image_batches(args.data, s["image_size"], s["batch"], NUM_CLASSES, rank, size) for name in configs}
    if rank == 0 and s["model"] == "googlenet":
        print(f"GoogLeNet: {googlenet_source()}", flush=True)
    windows = {name: [] for name in configs}
    # On rank 0 when stderr is a terminal (disable=None: tqdm decides by that).
    bar = tqdm(total=args.rounds * len(configs), unit="window", leave=False, disable=rank != 0 or None)
    for rnd in range(args.rounds):
        for name in configs:
            elapsed, phases = measure_window(built[name], data[name], args, window_group)
            windows[name].append((elapsed, phases))
            bar.set_postfix_str(f"round {rnd + 1} {name}: {size * s['batch'] * args.iters / elapsed:.1f} img/s", False)
            bar.update()
    bar.close()
    rows = [summary_row(args, name, size, windows[name], launcher) for name in configs]
    if rank == 0:
        print_table(rows, size)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"{args.setting}.jsonl"), "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    if horovod is not None:
        horovod.shutdown()
    hvd.shutdown()


if __name__ == "__main__":
    main()
