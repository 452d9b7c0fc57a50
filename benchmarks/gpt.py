"""A GPT trained the way the common minimal GPT scripts train it, by torch DDP,
torch FSDP2 and hvdtorch (DistributedModel, shard=2, shard=3), in the same
jobs: tokens/s and peak RSS per rank, each against DDP and FSDP2 measured in
the same run.

    python benchmarks/gpt.py                                   # 2 ranks, --size small, eager
    python benchmarks/gpt.py --compile --rounds 3 --iters 3    # every model torch.compile'd
    python benchmarks/gpt.py --hosts 2x2 --link 1gbit          # 2 emulated hosts x 2 ranks (root)
    python benchmarks/gpt.py --size test --rounds 1 --iters 1 --memory-rounds 1   # a minute: does it run

Workload: benchmarks/workloads/gpt.py's GPT at --size (test, small, medium;
weight-tied embedding and head, GPT-2's init), learnable synthetic tokens
(token_batches: one global batch per micro-step, each rank its --batch
slice), AdamW (lr 6e-4, betas (0.9, 0.95), weight decay 0.1 on the matrices
only: optimizer_groups). Each step is the scripts' loop: --accum micro-steps,
each forward under torch.autocast("cpu", dtype=torch.bfloat16), loss / accum
backward, the gradients exchanged on the last micro-step only (below), then
clip_grad_norm_(1.0), step, zero_grad(set_to_none=True).

Configurations (--configs, comma separated):
  ddp        torch DistributedDataParallel (Gloo); accumulation as the
             scripts: model.require_backward_grad_sync = (micro == accum - 1)
             before each forward; torch's clip_grad_norm_
  fsdp2      torch.distributed.fsdp.fully_shard on every transformer Block,
             then on the root (Gloo); model.set_requires_gradient_sync(last);
             torch's clip_grad_norm_ (on the DTensors)
  fsdp2-mp   fsdp2 with MixedPrecisionPolicy(param_dtype=bfloat16,
             reduce_dtype=float32) and no autocast
  dm         hvd.DistributedModel(model), the plain AdamW; accumulation as
             DDP's (dm.require_backward_grad_sync = last)
  shard2     dm + hvd.DistributedOptimizer(AdamW, shard=2); opt.clip_grad_norm_
  shard3     dm + hvd.DistributedOptimizer(AdamW, shard=3, model=dm);
             opt.clip_grad_norm_
  dm-mp, shard3-mp
             dm and shard3 with hvd.DistributedModel(model, mixed_precision=
             hvd.MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=
             float32)) and no autocast; only where hvdtorch has
             MixedPrecisionPolicy (else skipped, saying so)
Default --configs: ddp,fsdp2,dm,shard2,shard3, and where hvdtorch has
MixedPrecisionPolicy also fsdp2-mp,dm-mp,shard3-mp. --compile: every model
torch.compile'd, before wrapping for DDP and DistributedModel (model =
torch.compile(model), then wrapped, as the scripts do), after fully_shard
for FSDP2.

Method. Throughput: one torchrun job builds every configuration (the same
order on every rank, each from torch.manual_seed(0)), steps each --prime
times (compilation, DDP's bucket rebuild), then runs --rounds rounds of
interleaved windows (A B C D, A B C D, ...), each --warmup untimed steps,
then --iters timed steps between two barriers on a Gloo group of its own;
tokens/s = ranks x batch x block_size x accum x iters / the longest rank's
window; median [min-max] over rounds. Each configuration reads the same token
stream from the same start, so their losses (the mean over ranks and the
last round's timed micro-steps) agree to bf16 rounding: a column that shows
a configuration that trains differently. Memory: one torchrun job per
configuration and round (peak RSS is a process's high-water mark, so
configurations cannot share a process), --memory-rounds rounds interleaved;
the largest rank's ru_maxrss after --prime + --iters steps, median [min-max]
(--memory-only: these jobs alone; --memory-rounds 0: none).
Ratios: the medians' ratio to ddp's, and to fsdp2's (to fsdp2-mp's for the
-mp configurations), from the same run.

Across emulated hosts (--hosts HxR --link RATE, needs root): H network
namespaces of R ranks each, every host's veth cable shaped to RATE in both
directions with tc tbf (tests/netns.py's Hosts, as benchmarks/cluster.py
uses them; removed on every exit), one torchrun agent per host; throughput
only. Bytes each host sent per step: eth0's tx_bytes inside the host, read by
its local rank 0 at the two barriers of every window (headers included),
divided by --iters, the largest host's; compared to an all-reduce's floor
with one rank per host on the wire, 2 (H-1)/H x the fp32 gradient bytes
(sharded-at-rest configurations also gather the parameters each micro-step,
so they may send more).

The ranks share this machine's cores: read ratios between configurations in
one run, not absolute numbers. Output: a markdown table (and --json PATH).
"""

import argparse
import contextlib
import json
import os
import resource
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
from benchmarks.cluster import follow, read_tx  # noqa: E402
from benchmarks.workloads.gpt import GPT, SIZES, optimizer_groups, token_batches  # noqa: E402
from benchmarks.zero import _max_over_ranks, free_port  # noqa: E402

CONFIGS = ["ddp", "fsdp2", "dm", "shard2", "shard3"]
MP_CONFIGS = ["fsdp2-mp", "dm-mp", "shard3-mp"]
LR, BETAS, WEIGHT_DECAY, CLIP = 6e-4, (0.9, 0.95), 0.1, 1.0
BF16 = dict(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)  # the -mp configurations' policy
FIXED_STEPS = 4  # distinct steps of tokens, cycled (made before timing)


def default_configs():
    return CONFIGS + MP_CONFIGS


def peer_of(name):
    """The FSDP2 configuration a configuration is compared with."""
    return "fsdp2-mp" if name.endswith("-mp") else "fsdp2"


class Config:
    """One configuration's model and optimizer, and its training step."""

    def __init__(self, name, gpt_config, args):
        torch.manual_seed(0)  # the same initial weights in every configuration and on every rank
        self.name, self.accum = name, args.accum
        self.kind = "ddp" if name == "ddp" else "fsdp2" if name.startswith("fsdp2") else "hvd"
        mp = name.endswith("-mp")
        self.autocast = not mp  # mixed precision by the policy instead
        model = GPT(gpt_config)
        if args.compile and self.kind != "fsdp2":
            model = torch.compile(model)
        if self.kind == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(model)
        elif self.kind == "fsdp2":
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            policy = MixedPrecisionPolicy(**BF16) if mp else MixedPrecisionPolicy()  # the default: fp32 throughout
            for block in model.transformer.h:
                fully_shard(block, mp_policy=policy)
            fully_shard(model, mp_policy=policy)
            if args.compile:
                model = torch.compile(model)
        else:
            kw = {"mixed_precision": hvd.MixedPrecisionPolicy(**BF16)} if mp else {}
            model = hvd.DistributedModel(model, name=f"gpt.{name}", **kw)
        self.model = model
        self.opt = torch.optim.AdamW(optimizer_groups(model, WEIGHT_DECAY), lr=LR, betas=BETAS)
        self.sharded = name.startswith("shard")
        if self.sharded:
            stage = int(name[5])
            self.opt = hvd.DistributedOptimizer(self.opt, shard=stage, **({"model": model} if stage == 3 else {}))

    def _micro(self, last):
        """The context of one micro-step; sets whether its backward exchanges gradients."""
        if self.kind == "fsdp2":
            self.model.set_requires_gradient_sync(last)
        else:  # DDP and hvdtorch alike
            self.model.require_backward_grad_sync = last
        return contextlib.nullcontext()

    def steps(self, data, n):
        """``n`` optimizer steps; returns the sum of their micro-steps' losses (a tensor)."""
        total = torch.zeros((), dtype=torch.float64)
        for _ in range(n):
            for micro in range(self.accum):
                x, y = next(data)
                with self._micro(micro == self.accum - 1):
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                        _, loss = self.model(x, y)
                    (loss / self.accum).backward()
                total += loss.detach().double()
            if self.sharded:
                self.opt.clip_grad_norm_(CLIP)
            else:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        return total


def token_stream(gpt_config, batch, accum, rank, size):
    """An endless iterator of (x, y) micro-batches: this rank's slice of the
    global batch of each micro-step, FIXED_STEPS x accum of them cycled."""
    micro = []
    for k in range(FIXED_STEPS * accum):
        x, y = token_batches(gpt_config, batch * size, seed=0, step=k)
        micro.append((x[rank * batch : (rank + 1) * batch].clone(), y[rank * batch : (rank + 1) * batch].clone()))

    def cycle():
        while True:
            yield from micro

    return cycle()


def window(cfg, data, args, group, hosts, host, counts):
    """One timed window: (longest rank's seconds, mean loss over ranks and micro-steps, bytes each host sent)."""
    cfg.steps(data, args.warmup)
    dist.barrier(group=group)
    t0 = time.perf_counter()
    tx0 = read_tx() if counts else 0
    loss = cfg.steps(data, args.iters)
    dist.barrier(group=group)
    elapsed = time.perf_counter() - t0
    sent = [0.0] * hosts
    if counts:
        sent[host] = float(read_tx() - tx0)
    (longest, *sent) = _max_over_ranks([elapsed, *sent], group)  # one writer per host: MAX keeps it
    summed = loss.reshape(1).clone()
    dist.all_reduce(summed, group=group)
    return longest, summed.item() / (dist.get_world_size() * args.iters * args.accum), sent


def worker_throughput(args):
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    local_size, host = hvd.local_size(), hvd.cross_rank()
    hosts = size // local_size
    counts = args.count_bytes and hvd.local_rank() == 0
    group = dist.new_group(backend="gloo")  # the window barriers and counters only
    gpt_config = SIZES[args.size]
    configs = args.configs.split(",")
    built = {name: Config(name, gpt_config, args) for name in configs}
    data = {name: token_stream(gpt_config, args.batch, args.accum, rank, size) for name in configs}
    for name in configs:
        t0 = time.perf_counter()
        built[name].steps(data[name], args.prime)
        dist.barrier(group=group)
        if rank == 0:
            print(f"primed {name} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    tokens = size * args.batch * gpt_config.block_size * args.accum * args.iters
    rates = {name: [] for name in configs}
    losses = {name: [] for name in configs}
    sent = {name: [] for name in configs}
    for rnd in range(args.rounds):
        for name in configs:
            elapsed, loss, bytes_by_host = window(built[name], data[name], args, group, hosts, host, counts)
            rates[name].append(tokens / elapsed)
            losses[name].append(loss)
            sent[name].append(max(bytes_by_host) / args.iters)
            if rank == 0:
                line = f"gpt round {rnd + 1} {name}: {rates[name][-1]:.0f} tokens/s, loss {loss:.3f}"
                if args.count_bytes:
                    line += f", {sent[name][-1] / 1e6:.2f} MB/host/step"
                print(line, file=sys.stderr, flush=True)
    if rank == 0:
        with open(args.rows, "w") as f:
            for name in configs:
                r = rates[name]
                row = dict(config=name, tokens_per_s=statistics.median(r), tokens_per_s_min=min(r))
                row.update(tokens_per_s_max=max(r), tokens_per_s_rounds=r, loss=losses[name][-1])
                row.update(loss_rounds=losses[name], hosts=hosts, ranks_per_host=local_size)
                if args.count_bytes:
                    row.update(bytes_per_host_step=statistics.median(sent[name]), bytes_per_host_step_rounds=sent[name])
                f.write(json.dumps(row) + "\n")
    dist.barrier(group=group)
    hvd.shutdown()


def worker_memory(args):
    torch.set_num_threads(1)
    hvd.init()
    group = dist.new_group(backend="gloo")
    gpt_config = SIZES[args.size]
    cfg = Config(args.configs, gpt_config, args)
    cfg.steps(token_stream(gpt_config, args.batch, args.accum, hvd.rank(), hvd.size()), args.prime + args.iters)
    (rss_kib,) = _max_over_ranks([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss], group)
    if hvd.rank() == 0:
        with open(args.rows, "w") as f:
            f.write(json.dumps(dict(config=args.configs, peak_rss_mib=rss_kib / 1024)) + "\n")
    hvd.shutdown()


def worker_args(args, mode, configs, rows):
    out = ["--worker", mode, "--size", args.size, "--configs", configs, "--rows", rows]
    out += ["--batch", str(args.batch), "--accum", str(args.accum), "--rounds", str(args.rounds)]
    out += ["--iters", str(args.iters), "--warmup", str(args.warmup), "--prime", str(args.prime)]
    return out + (["--compile"] if args.compile else []) + (["--count-bytes"] if args.count_bytes else [])


def read_rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def torchrun(args, mode, configs, rows):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.ranks}"]
    cmd += [f"--master_port={free_port()}", os.path.abspath(__file__), *worker_args(args, mode, configs, rows)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("HVDTORCH_TIMEOUT", "300")
    subprocess.run(cmd, check=True, env=env, timeout=args.job_timeout)
    return read_rows(rows)


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through Hosts' context manager: namespaces removed


def run_cluster(args, configs, tmp):
    """The throughput job across emulated hosts; returns its rows."""
    from tests import netns

    reason = netns.unavailable_reason()
    if reason:
        raise SystemExit(f"gpt.py: emulated hosts unavailable: {reason}")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    env = {"HVDTORCH_TIMEOUT": "600", "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    with (
        tempfile.TemporaryDirectory(prefix="hvdt-gpt-") as logdir,
        netns.Hosts(args.n_hosts, logdir) as hosts,
    ):
        hosts.shape(None if args.link == "none" else args.link)
        print(f"== {args.link}: {args.n_hosts} hosts x {args.ranks_per_host} ranks, configs {configs}", flush=True)
        job = hosts.torchrun(
            os.path.abspath(__file__),
            *worker_args(args, "throughput", configs, tmp),
            nproc=args.ranks_per_host,
            env=env,
        )
        try:
            follow(job, args.job_timeout)
        finally:
            if args.verbose:
                print(job.output())
    return read_rows(tmp)


def vs(row, ref, key):
    """row's ``key`` as a multiple of ref's: "1.00" for ref itself, "-" where either lacks it."""
    if ref is None or key not in ref or key not in row:
        return "-"
    return "1.00" if ref is row else f"{row[key] / ref[key]:.2f}x"


def spread(row, key):
    """median [min-max] of ``key`` in row, "-" where it is not measured."""
    if key not in row:
        return "-"
    return f"{row[key]:.0f} [{row[key + '_min']:.0f}-{row[key + '_max']:.0f}]"


def print_table(args, rows, gpt_config, params):
    """The markdown table: tokens/s and peak RSS (across hosts: bytes sent), each against ddp and FSDP2."""
    by = {r["config"]: r for r in rows}
    cluster, throughput = args.hosts is not None, not args.memory_only
    memory = not cluster and args.memory_rounds > 0
    where = f"{args.n_hosts} hosts x {args.ranks_per_host} ranks, {args.link} links" if cluster else None
    parts = [
        f"GPT {args.size} ({params / 1e6:.2f} M parameters, {gpt_config.n_layer} layers, n_embd "
        f"{gpt_config.n_embd}, block {gpt_config.block_size}), {where or f'{args.ranks} ranks'}, batch "
        f"{args.batch}/rank x accum {args.accum}, AdamW, {'compiled' if args.compile else 'eager'}"
    ]
    if throughput:
        parts.append(f"tokens/s median [min-max] of {args.rounds} rounds x {args.iters} steps")
    if memory:
        parts.append(f"peak RSS per rank (the largest rank's) median [min-max] of {args.memory_rounds} jobs")
    if cluster:
        parts.append(f"MB each host sent per step (the largest host's), all-reduce floor {args.floor / 1e6:.2f}")
    parts.append("every configuration accumulates as the scripts do (require_backward_grad_sync, FSDP2's switch)")
    print("\n" + "; ".join(parts) + "\n")
    peer = "fsdp2 (-mp: fsdp2-mp)" if any(r["config"].endswith("-mp") for r in rows) else "fsdp2"
    head = ["config"]
    if throughput:
        head += ["tokens/s", "vs ddp", f"vs {peer}"]
    if cluster:
        head += ["MB/host/step", "x floor"]
    if memory:
        head += ["peak RSS/rank (MiB)", "RSS vs ddp", f"RSS vs {peer}"]
    if throughput:
        head += ["loss"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        ddp, fsdp2 = by.get("ddp"), by.get(peer_of(r["config"]))
        cells = [r["config"]]
        if throughput:
            cells += [spread(r, "tokens_per_s"), vs(r, ddp, "tokens_per_s"), vs(r, fsdp2, "tokens_per_s")]
        if cluster:
            cells += [f"{r['bytes_per_host_step'] / 1e6:.2f}", f"{r['bytes_per_host_step'] / args.floor:.2f}"]
        if memory:
            cells += [spread(r, "peak_rss_mib"), vs(r, ddp, "peak_rss_mib"), vs(r, fsdp2, "peak_rss_mib")]
        if throughput:
            cells += [f"{r['loss']:.3f}"]
        print("| " + " | ".join(cells) + " |")


def measure_here(args, configs, tmp):
    """The throughput job and the memory jobs on this machine; returns the rows."""
    rows = [{"config": name} for name in configs]
    if not args.memory_only:
        rows = torchrun(args, "throughput", ",".join(configs), tmp)
    peaks = {name: [] for name in configs}
    for rnd in range(args.memory_rounds):
        for name in configs:  # interleaved: A B C, A B C, ...
            (m,) = torchrun(args, "memory", name, tmp)
            peaks[name].append(m["peak_rss_mib"])
            print(f"memory round {rnd + 1} {name}: peak RSS {m['peak_rss_mib']:.0f} MiB", file=sys.stderr)
    for r in rows:
        got = peaks[r["config"]]
        if got:
            r.update(peak_rss_mib=statistics.median(got), peak_rss_mib_min=min(got), peak_rss_mib_max=max(got))
            r.update(peak_rss_mib_rounds=got)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2, help="ranks on this machine (without --hosts)")
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--configs", help="comma list (default: see above)")
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and micro-step")
    p.add_argument("--accum", type=int, default=2, help="micro-steps per optimizer step")
    p.add_argument("--compile", action="store_true", help="torch.compile every model")
    p.add_argument("--rounds", type=int, default=5, help="rounds of interleaved windows")
    p.add_argument("--iters", type=int, default=3, help="timed steps per window")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before every window")
    p.add_argument("--prime", type=int, default=2, help="untimed steps of each configuration before the rounds")
    p.add_argument("--memory-rounds", type=int, default=3, help="memory jobs per configuration (0: none)")
    p.add_argument("--memory-only", action="store_true", help="the memory jobs alone, no throughput")
    p.add_argument("--hosts", metavar="HxR", help="emulated hosts x ranks per host (e.g. 2x2; needs root)")
    p.add_argument("--link", default="1gbit", help="tc rate of every host's cable with --hosts ('none': unshaped)")
    p.add_argument("--job-timeout", type=float, default=3600, help="seconds one torchrun job may take")
    p.add_argument("--json", metavar="PATH", help="also write the rows and the run's settings here")
    p.add_argument("--verbose", action="store_true", help="with --hosts: print the agents' output")
    p.add_argument("--worker", choices=["throughput", "memory"], help=argparse.SUPPRESS)
    p.add_argument("--rows", help=argparse.SUPPRESS)
    p.add_argument("--count-bytes", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker == "throughput":
        return worker_throughput(args)
    if args.worker == "memory":
        return worker_memory(args)
    if min(args.rounds, args.iters, args.batch, args.accum) < 1 or min(args.warmup, args.prime, args.memory_rounds) < 0:
        p.error("--rounds, --iters, --batch and --accum must be at least 1; --warmup, --prime, --memory-rounds >= 0")
    if args.memory_only and (args.hosts or args.memory_rounds < 1):
        p.error("--memory-only runs memory jobs on this machine: --memory-rounds at least 1, no --hosts")
    configs = args.configs.split(",") if args.configs else default_configs()
    unknown = [c for c in configs if c not in CONFIGS + MP_CONFIGS]
    if unknown:
        p.error(f"unknown configs {unknown}; choose from {CONFIGS + MP_CONFIGS}")
    args.configs = ",".join(configs)
    gpt_config = SIZES[args.size]
    params = sum(p.numel() for p in GPT(gpt_config).parameters())
    if args.hosts:
        try:
            args.n_hosts, args.ranks_per_host = (int(v) for v in args.hosts.lower().split("x"))
        except ValueError:
            p.error(f"--hosts {args.hosts!r}: expected HOSTSxRANKS, e.g. 2x2")
        args.ranks = args.n_hosts * args.ranks_per_host
        args.count_bytes = True
        args.floor = 2 * (args.n_hosts - 1) / args.n_hosts * params * 4  # fp32 gradients, all-reduced
    fd, tmp = tempfile.mkstemp(prefix="gpt-rows-", suffix=".jsonl")
    os.close(fd)
    try:
        rows = run_cluster(args, args.configs, tmp) if args.hosts else measure_here(args, configs, tmp)
    finally:
        os.remove(tmp)
    print_table(args, rows, gpt_config, params)
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k not in ("worker", "rows", "json")}
        settings.update(parameters=params, cores=os.cpu_count())
        settings.update(torch=torch.__version__, machine_load=os.getloadavg())
        with open(args.json, "w") as f:
            json.dump(dict(settings=settings, rows=rows), f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
