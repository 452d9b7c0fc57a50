"""Training across emulated hosts: hvdtorch's DistributedModel (auto and every
registered reducer) against torch DDP (Gloo), DDP with torch's PowerSGD hook,
Horovod 0.28.1 (Gloo) and the no-communication ceiling, on network
namespaces whose links are shaped to a given rate.

    make bench-cluster          # the defaults: 2 hosts x 2 ranks, 10gbit,1gbit,100mbit, 3 rounds (~20 min on 2 cores)
    python benchmarks/cluster.py --hosts 2 --ranks-per-host 2 --rates 1gbit,100mbit --rounds 3
    python benchmarks/cluster.py --rates 10gbit --rounds 7 --iters 6      # longer
    python benchmarks/cluster.py --plot benchmarks/results/cluster         # only the plot of earlier rows

Needs root (network namespaces, tc). The hosts are tests/netns.py's Hosts:
one namespace per host with eth0 on a bridge in a hub namespace, one torchrun
agent per host; inside a host the ranks share memory, between hosts they talk
TCP through the bridge. Each rate shapes every host's cable in both
directions with a token bucket (Hosts.shape: tc tbf on the host's eth0 and
on the hub's side of it). This kernel may lack netem, so there is no added
delay: the links are narrow, not long.

Configurations (one torchrun job per rate builds them all, then interleaves):
  solo            the same model and optimizer stepped without any gradient
                  exchange: the ceiling (barriers only, between windows)
  dm:<reducer>    hvd.DistributedModel(reducer=..., sync="explicit"),
                  pipelined, 25 MiB fusion, stepped with
                  model.sync_and_step(optimizer) (each bucket's parameters
                  as it arrives): auto and each reducer of the registry that
                  serves the standard ops (hvdtorch._C.reducer_registry())
  dm:sizes        dm:auto with buckets planned by size alone, as before
                  buckets kept layers together (an ablation, not a default)
  dm:whole        dm:auto with sync_gradients() and then one optimizer step,
                  as before sync_and_step (an ablation, not a default)
  dm:powersgd     hvd.DistributedModel(compression=hvd.Compression.powersgd(
                  rank 4, compression from the 3rd step on)), auto reducer:
                  the same compression as ddp-powersgd, in hvdtorch's buckets
  ddp             torch DistributedDataParallel on the Gloo default group
  ddp-powersgd    DDP with torch's PowerSGD communication hook (rank 4,
                  compression from the 3rd step on, error feedback), in one
                  64 MiB bucket: the hook chains its all-reduces in future
                  callbacks, and with several buckets they reach Gloo in a
                  different order on each rank (a collective mismatch)
  horovod         Horovod 0.28.1's DistributedOptimizer, its Gloo controller
                  and Gloo operations (--horovod auto: when
                  build/horovod-venv exists; benchmarks/peers/build_horovod.sh)
  zero3           hvd.DistributedModel + hvd.DistributedOptimizer(shard=3,
                  model=...): parameters sharded at rest, each layer's
                  gathered for its forward and again in backward
  zero3:secondary zero3 with secondary_copy=True (ZeRO++'s hierarchical
                  partitioning): backward gathers each layer again among the
                  host's ranks only
  fsdp2           torch's FSDP2 (fully_shard on every Linear and Conv2d, then
                  the root) on the Gloo default group: the same schedule
  (zero3, zero3:secondary and fsdp2 are not in the defaults; --configs
  names them)

Horovod's own launcher (horovodrun --gloo) starts the ranks of other hosts
through ssh, and no ssh server runs in the namespaces. So the ranks start
under torchrun like the others, and the benchmark does for Horovod what
horovodrun --gloo does: rank 0 starts Horovod's RendezvousServer with the host
assignment of horovod.runner (get_host_assignments), and every rank sets the
environment horovod.runner.gloo_run builds (create_slot_env_vars,
create_run_env_vars) before horovod.torch.init(). With Horovod the ranks run
build/horovod-venv's Python (the same torch pin) with this tree on
PYTHONPATH, which is how benchmarks/googlenet.py runs it under mpirun.
Inside each host the machine's host name resolves to that host's address, as
on a real host (Hosts(own_hostname=True)): Horovod 0.28.1 builds the Gloo
device of its process sets (the global one included) without the interface
it was given (GlooContext::InitializeForProcessSet reads the process set's
own, empty, gloo_iface_), so it binds to the address of the host name.

Model: benchmarks/workloads' FCHeavyNet, 32 px images, 25 classes: 12.7 M
parameters, 51 MB of fp32 gradients per step; a small batch (--batch 4 per
rank, synthetic data) keeps compute short next to communication; SGD with
momentum.

Method: every configuration is built once and stepped --prime times (DDP's
bucket rebuild, PowerSGD's start, auto's first choices); then --rounds rounds
run the configurations in turn (A B C ..., A B C ..., so drift hits all
alike). Each window: --warmup untimed steps, a barrier, --iters timed steps, a
barrier, on a Gloo group of its own; img/s = ranks x batch x iters / the
longest rank's window; median [min-max] over rounds. Bytes each host sent
per step: eth0's tx_bytes counter inside the host (read by the host's local
rank 0 right after the first barrier and right after the second; Ethernet,
IP and TCP headers included, so a little above the payload), divided by
--iters; the largest host's. The floor it is compared to is what a
hierarchical all-reduce must send with one rank per host on the wire: for H
hosts and G gradient bytes, 2 (H-1)/H G per host per step; for zero3 and
fsdp2, (H-1)/H (2 P + G) with P parameter bytes: two all-gathers of the
parameters (forward, backward) and a reduce-scatter of the gradients, each
byte crossing a host's link once (zero3 gathers buckets under 256 KiB once
per step, so it may go a little below); for zero3:secondary, whose backward
gathers stay on the host, (H-1)/H (P + G), the all-reduce's.

The ranks of all hosts share this machine's cores (--host-cpus shared, the
default): compute is slower than on real hosts and rises with the ranks, a
host that computes slows the others, and a 10gbit link is not the limit when
the cores cannot feed it (the unshaped veth pairs carry about 4-6 Gbit/s
here). --host-cpus own gives each host its own share of the CPUs instead
(host h's agent and ranks on the h-th equal run), as real hosts have their
own; on this 2-core machine that leaves a host's 2 ranks one core, so every
wait of one local rank for the other (a barrier of the intra-host phases)
costs a switch between them. Neither is a real cluster: read the ratios
between configurations at one rate and one setting, not absolute numbers.

Output: a table per rate; rows appended as JSON lines to --out/cluster.jsonl
(one per rate and configuration); the plot --out/cluster.png. The namespaces
are removed on every exit (failure, Ctrl-C, SIGTERM); a SIGKILLed run's are
swept by the next one.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import hvdtorch as hvd  # noqa: E402
from benchmarks.googlenet import NUM_CLASSES, train_steps  # noqa: E402
from benchmarks.workloads import FCHeavyNet, image_batches  # noqa: E402

HOROVOD_PYTHON = os.path.join(ROOT, "build", "horovod-venv", "bin", "python")
IMAGE_SIZE = 32
POWERSGD_RANK = 4
PEERS = ("ddp", "ddp-powersgd", "horovod", "fsdp2", "solo")
SHARDED = ("zero3", "fsdp2")  # parameters gathered per layer: their own floor
# dm:auto without one of its parts (not in the defaults; --configs names them).
ABLATIONS = ("dm:sizes", "dm:whole")
TX_BYTES = "/sys/class/net/eth0/statistics/tx_bytes"


def hvdtorch_reducers():
    """The registry's reducers of the standard ops, in its order (all of them run across hosts)."""
    return [r["name"] for r in hvd._C.reducer_registry() if r["own_op"] is None]


def host_cpus(hosts: int):
    """Each host's CPUs: this process's CPUs cut into `hosts` equal runs in
    order (host h gets the h-th). With fewer CPUs than hosts, hosts share
    them round-robin (host h gets CPU h mod count)."""
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < hosts:
        return [[mine[h % len(mine)]] for h in range(hosts)]
    per = len(mine) // hosts
    return [mine[h * per : (h + 1) * per] for h in range(hosts)]


def default_configs(horovod: bool):
    dm = [f"dm:{r}" for r in ["auto", *hvdtorch_reducers()]]
    return ["solo", *dm, "dm:powersgd", "ddp", "ddp-powersgd"] + (["horovod"] if horovod else [])


class Config:
    """One configuration's model, optimizer, sync() after backward and step()."""

    def __init__(self, name, size, horovod):
        self.name = name
        torch.manual_seed(0)  # the same initial weights on every rank
        self.model = FCHeavyNet(num_classes=NUM_CLASSES, image_size=IMAGE_SIZE)
        self.sync = lambda: None  # solo; DDP waits inside backward; DistributedModel in step()
        if name.startswith("ddp") and size > 1:
            from torch.nn.parallel import DistributedDataParallel

            # PowerSGD's all-reduces are chained in future callbacks; with several
            # buckets they reach Gloo in a different order on each rank (a
            # collective mismatch), so that configuration gets one bucket.
            cap = {"bucket_cap_mb": 64} if name == "ddp-powersgd" else {}
            self.model = DistributedDataParallel(self.model, **cap)
            if name == "ddp-powersgd":
                from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

                state = powerSGD_hook.PowerSGDState(
                    process_group=None, matrix_approximation_rank=POWERSGD_RANK, start_powerSGD_iter=2
                )
                self.model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        elif name == "dm:powersgd":
            # start_iter 2, as ddp-powersgd: --prime steps are enough for the timed ones to be compressed.
            compression = hvd.Compression.powersgd(rank=POWERSGD_RANK, start_iter=2)
            self.model = hvd.DistributedModel(
                self.model, compression=compression, sync="explicit", name=f"cluster.{name}"
            )
        elif name.startswith("zero3"):
            self.model = hvd.DistributedModel(self.model, name=f"cluster.{name}")
        elif name == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            for m in self.model.modules():
                if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)):
                    fully_shard(m)
            self.model = fully_shard(self.model)
        elif name.startswith("dm:"):
            reducer = "auto" if name in ABLATIONS else name[3:]
            self.model = hvd.DistributedModel(self.model, reducer=reducer, sync="explicit", name=f"cluster.{name}")
            if name == "dm:sizes":
                self.model._layers = [None] * len(self.model._layers)  # the planner sees no layers
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        if name.startswith("zero3"):
            secondary = name == "zero3:secondary"
            self.opt = hvd.DistributedOptimizer(self.opt, shard=3, model=self.model, secondary_copy=secondary)
        self.step = self.opt.step
        if name == "dm:whole":
            self.sync = self.model.sync_gradients
        elif name.startswith("dm:"):
            # The waits and the step in one: each bucket's parameters are stepped as it arrives (timed as "optim").
            self.step = lambda: self.model.sync_and_step(self.opt)
        if name == "horovod":
            self.opt = horovod.DistributedOptimizer(self.opt, named_parameters=self.model.named_parameters())
            self.sync = self.opt.synchronize
            self.step = self._horovod_step

    def _horovod_step(self):
        with self.opt.skip_synchronize():  # synchronize() already ran, timed as part of the step
            self.opt.step()


def init_horovod(group, hosts, local_size):
    """horovod.torch with its Gloo controller, started as horovodrun --gloo
    starts each rank (see the module's docstring)."""
    import horovod.torch as horovod
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
    from horovod.runner.http.http_server import RendezvousServer

    rank, size = dist.get_rank(), dist.get_world_size()
    plan = get_host_assignments(parse_hosts(",".join(f"host{h}:{local_size}" for h in range(hosts))), size)
    port = [None]
    server = None
    if rank == 0:
        server = RendezvousServer()
        port[0] = server.start()
        server.init(plan)
    dist.broadcast_object_list(port, src=0, group=group)
    os.environ.update(create_slot_env_vars(plan[rank]))
    run_env = create_run_env_vars(os.environ["MASTER_ADDR"], ["eth0"], port[0])
    os.environ.update({k: str(v) for k, v in run_env.items()})
    os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", "600")
    horovod.init()
    if (horovod.rank(), horovod.size()) != (rank, size):
        raise SystemExit(f"cluster.py: Horovod sees rank {horovod.rank()} of {horovod.size()}, torch {rank} of {size}")
    return horovod, server


def read_tx() -> int:
    """Bytes this host's eth0 has sent (inside a host namespace), 0 outside one."""
    try:
        with open(TX_BYTES) as f:
            return int(f.read())
    except OSError:
        return 0


def measure_window(cfg, data, args, group, hosts, host, counts):
    """One window: (longest rank's seconds, bytes each host sent)."""
    train_steps(cfg, data, args.warmup)
    dist.barrier(group=group)
    t0 = time.perf_counter()
    tx0 = read_tx() if counts else 0
    train_steps(cfg, data, args.iters)
    dist.barrier(group=group)
    elapsed = time.perf_counter() - t0
    sent = torch.zeros(1 + hosts, dtype=torch.float64)
    sent[0] = elapsed
    if counts:
        sent[1 + host] = read_tx() - tx0
    dist.all_reduce(sent, op=dist.ReduceOp.MAX, group=group)  # one writer per host: MAX keeps it
    return sent[0].item(), sent[1:].tolist()


def worker(args):
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    local_size, host = hvd.local_size(), hvd.cross_rank()
    hosts = size // local_size
    group = dist.new_group(backend="gloo")  # the window barriers and counters only
    configs = args.configs.split(",")
    horovod, server = init_horovod(group, hosts, local_size) if "horovod" in configs else (None, None)
    built = {name: Config(name, size, horovod) for name in configs}
    model = FCHeavyNet(num_classes=NUM_CLASSES, image_size=IMAGE_SIZE)  # sharded configs hold shards only
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    data = image_batches(None, IMAGE_SIZE, args.batch, NUM_CLASSES, rank, size)
    for name in configs:
        train_steps(built[name], data, args.prime)
        if rank == 0:
            print(f"primed {name}", file=sys.stderr, flush=True)
    windows = {name: [] for name in configs}
    counts = hvd.local_rank() == 0
    for rnd in range(args.rounds):
        for name in configs:
            elapsed, sent = measure_window(built[name], data, args, group, hosts, host, counts)
            windows[name].append((size * args.batch * args.iters / elapsed, [b / args.iters for b in sent]))
            if rank == 0:
                print(
                    f"{args.rate} round {rnd + 1} {name}: {windows[name][-1][0]:.1f} img/s, "
                    f"{max(windows[name][-1][1]) / 1e6:.1f} MB/host/step",
                    file=sys.stderr,
                    flush=True,
                )
    if rank == 0:
        with open(args.rows, "w") as f:
            for name in configs:
                # Sharded: two gathers of the parameters and a reduce-scatter; otherwise an all-reduce.
                floor = (hosts - 1) / hosts * (3 if name in SHARDED else 2) * grad_bytes
                rates = [w[0] for w in windows[name]]
                per_host = [max(w[1]) for w in windows[name]]
                row = dict(rate=args.rate, config=name, hosts=hosts, ranks_per_host=local_size, ranks=size)
                row.update(batch_per_rank=args.batch, rounds=args.rounds, iters=args.iters, warmup=args.warmup)
                row.update(cores=os.cpu_count(), grad_bytes=grad_bytes, floor_bytes_per_host_step=floor)
                row.update(img_per_s=statistics.median(rates), img_per_s_min=min(rates), img_per_s_max=max(rates))
                row.update(img_per_s_rounds=rates, bytes_per_host_step=statistics.median(per_host))
                row.update(bytes_per_host_step_rounds=per_host)
                f.write(json.dumps(row) + "\n")
    dist.barrier(group=group)
    if horovod is not None:
        horovod.shutdown()
    if server is not None:
        server.stop()
    hvd.shutdown()


def print_table(rows):
    first = rows[0]
    by = {r["config"]: r for r in rows}
    print(
        f"\n{first['rate']} links, {first['hosts']} hosts x {first['ranks_per_host']} ranks, FCHeavyNet "
        f"({first['grad_bytes'] / 1e6:.1f} MB of gradients), batch {first['batch_per_rank']}/rank: img/s median "
        f"[min-max] of {first['rounds']} rounds x {first['iters']} steps; MB each host sent per step (the largest "
        f"host's) against the hierarchical floor: {_floors(rows)}"
    )
    print(f"  {'config':<14} {'img/s':>24}  {'MB/host/step':>12}  {'x floor':>7}  ratios")
    for r in rows:
        ratios = [f"{r['img_per_s'] / by[p]['img_per_s']:.2f}x {p}" for p in PEERS if p in by and p != r["config"]]
        floor = r["floor_bytes_per_host_step"]
        of_floor = f"{r['bytes_per_host_step'] / floor:7.2f}" if floor else "      -"
        print(
            f"  {r['config']:<14} {r['img_per_s']:9.1f} [{r['img_per_s_min']:.1f}-{r['img_per_s_max']:.1f}]".ljust(42)
            + f"  {r['bytes_per_host_step'] / 1e6:12.1f}  {of_floor}  "
            + (", ".join(ratios) if r["config"] != "solo" else "")
        )


def _floors(rows):
    """The floors of the rows, each with the configurations it applies to."""
    by = {}
    for r in rows:
        by.setdefault(r["floor_bytes_per_host_step"], []).append(r["config"])
    return "; ".join(f"{b / 1e6:.1f} MB ({', '.join(names)})" for b, names in by.items())


def plot(folder):
    try:
        import matplotlib
    except ImportError as e:
        print(f"no plot: matplotlib does not import ({e})")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(os.path.join(folder, "cluster.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    latest = {}
    for r in rows:  # the last run of each rate and configuration
        latest[(r["rate"], r["config"])] = r
    rates = sorted({k[0] for k in latest}, key=lambda s: -_bits(s))
    configs = list(dict.fromkeys(k[1] for k in latest))
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.6))
    width = 0.8 / max(len(configs), 1)
    for k, c in enumerate(configs):
        xs = [i + k * width for i, rate in enumerate(rates) if (rate, c) in latest]
        got = [latest[(rate, c)] for rate in rates if (rate, c) in latest]
        med = [r["img_per_s"] for r in got]
        err = [[m - r["img_per_s_min"] for m, r in zip(med, got)], [r["img_per_s_max"] - m for m, r in zip(med, got)]]
        axes[0].bar(xs, med, width, yerr=err, capsize=2, label=c)
        axes[1].bar(xs, [r["bytes_per_host_step"] / 1e6 for r in got], width, label=c)
    floors = [next(r for (rate, _), r in latest.items() if rate == x)["floor_bytes_per_host_step"] for x in rates]
    for i, fl in enumerate(floors):
        axes[1].hlines(fl / 1e6, i - width / 2, i + 0.8 - width / 2, colors="k", linestyles="--")
    any_row = next(iter(latest.values()))
    shape = f"{any_row['hosts']} hosts x {any_row['ranks_per_host']} ranks"
    axes[0].set_yscale("log")
    axes[0].set_ylabel(f"images / s ({shape}, median, min-max; log)")
    axes[1].set_ylabel("MB sent per host per step (dashed: hierarchical floor)")
    for ax in axes:
        ax.set_xticks([i + width * (len(configs) - 1) / 2 for i in range(len(rates))], rates)
        ax.set_xlabel("link rate (tc tbf, both directions)")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle("FCHeavyNet across emulated hosts (network namespaces), one machine's cores")
    fig.tight_layout()
    path = os.path.join(folder, "cluster.png")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def _bits(rate):
    from tests.netns import rate_bits

    return rate_bits(rate)


def horovod_python(mode):
    """build/horovod-venv's Python when Horovod is to run (mode auto/on/off), else None."""
    if mode == "off":
        return None
    probe = [HOROVOD_PYTHON, "-c", "import horovod.torch as h; assert h.gloo_built()"]
    ok = os.path.exists(HOROVOD_PYTHON) and subprocess.run(probe, capture_output=True).returncode == 0
    if not ok and mode == "on":
        raise SystemExit(f"--horovod on needs {HOROVOD_PYTHON} with Gloo: run benchmarks/peers/build_horovod.sh")
    if not ok:
        print(f"horovod: left out ({HOROVOD_PYTHON} missing or without Gloo; benchmarks/peers/build_horovod.sh)")
    return HOROVOD_PYTHON if ok else None


def follow(job, timeout):
    """Job.wait, echoing rank 0's progress lines (host 0's agent) as they come."""
    deadline = time.monotonic() + timeout
    shown = 0
    while job.running() and time.monotonic() < deadline:
        lines = job.outputs()[0].split("\n")[:-1]  # whole lines only
        for line in lines[shown:]:
            if line.startswith("primed ") or " round " in line:
                print(f"  {line}", flush=True)
        shown = len(lines)
        time.sleep(1)
    job.wait(timeout=max(1.0, deadline - time.monotonic()))


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through Hosts' context manager


def run(args):
    from tests import netns

    reason = netns.unavailable_reason()
    if reason:
        raise SystemExit(f"cluster.py: emulated hosts unavailable: {reason}")
    python = horovod_python(args.horovod)
    configs = args.configs or ",".join(default_configs(python is not None))
    if "horovod" in configs.split(",") and python is None:
        raise SystemExit("cluster.py: config 'horovod' needs build/horovod-venv (benchmarks/peers/build_horovod.sh)")
    os.makedirs(args.out, exist_ok=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also where a shell started it ignoring SIGINT
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    env = {
        "HVDTORCH_TIMEOUT": "600",  # a 51 MB all-reduce at 100mbit takes seconds
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": ROOT,  # hvdtorch from this tree, also for horovod-venv's Python
    }
    out_rows = []
    with (
        tempfile.TemporaryDirectory(prefix="hvdt-cluster-") as logdir,
        netns.Hosts(args.hosts, logdir, own_hostname=True) as hosts,
    ):
        for rate in args.rates.split(","):
            hosts.shape(None if rate == "none" else rate)
            rows_path = os.path.join(logdir, f"rows-{rate}.jsonl")
            worker_args = ["--worker", "--rate", rate, "--configs", configs, "--rows", rows_path]
            worker_args += ["--batch", str(args.batch), "--rounds", str(args.rounds), "--iters", str(args.iters)]
            worker_args += ["--warmup", str(args.warmup), "--prime", str(args.prime)]
            print(f"== {rate}: {args.hosts} hosts x {args.ranks_per_host} ranks, configs {configs}", flush=True)
            t0 = time.monotonic()
            job = hosts.torchrun(
                os.path.abspath(__file__),
                *worker_args,
                nproc=args.ranks_per_host,
                env=env,
                python=python,
                cpus=host_cpus(args.hosts) if args.host_cpus == "own" else None,
            )
            try:
                follow(job, args.job_timeout)
            finally:
                if args.verbose:
                    print(job.output())
            with open(rows_path) as f:
                rows = [json.loads(line) for line in f if line.strip()]
            for r in rows:
                r.update(
                    job_s=round(time.monotonic() - t0, 1), machine_load=os.getloadavg()[0], host_cpus=args.host_cpus
                )
            print_table(rows)
            with open(os.path.join(args.out, "cluster.jsonl"), "a") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
            out_rows += rows
    plot(args.out)
    return out_rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=2, help="emulated hosts (namespaces)")
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--rates", default="10gbit,1gbit,100mbit", help="comma list of tc rates; 'none' = unshaped")
    p.add_argument("--configs", help="comma list (default: every configuration the docstring lists)")
    p.add_argument("--horovod", choices=["auto", "on", "off"], default="auto")
    p.add_argument("--batch", type=int, default=4, help="images per rank and step")
    p.add_argument("--rounds", type=int, default=3, help="rounds of interleaved windows (A B C ..., A B C ...)")
    p.add_argument("--iters", type=int, default=3, help="timed steps per window")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before every window")
    p.add_argument("--prime", type=int, default=2, help="untimed steps of each configuration before the rounds")
    p.add_argument(
        "--host-cpus",
        choices=["own", "shared"],
        default="shared",
        help="shared: every host's ranks may run on any CPU (one host's compute then slows the others); own: each "
        "host runs on its own share of this machine's CPUs, as real hosts do",
    )
    p.add_argument("--job-timeout", type=float, default=1800, help="seconds one rate's job may take")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "cluster"))
    p.add_argument("--plot", metavar="FOLDER", help="only plot the rows in FOLDER")
    p.add_argument("--verbose", action="store_true", help="print the agents' output")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rate", help=argparse.SUPPRESS)
    p.add_argument("--rows", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.plot:
        return plot(args.plot)
    if min(args.rounds, args.iters, args.batch) < 1 or min(args.warmup, args.prime) < 0:
        p.error("--rounds, --iters and --batch must be at least 1, --warmup and --prime at least 0")
    run(args)


if __name__ == "__main__":
    main()
