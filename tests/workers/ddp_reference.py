"""A training script shaped like the well-known DDP reference scripts, run
once with DistributedDataParallel and once per hvdtorch route on the same
data, for the migration test (tests/test_from_ddp.py): a BatchNorm CNN,
label smoothing, SGD with momentum and weight decay, a linear warm-up then
cosine schedule, gradient clipping between backward and step, an EMA of the
weights through torch's AveragedModel, bfloat16 autocast on the CPU, an
evaluation on every rank between training steps (model.eval() and
torch.no_grad(): DDP's first evaluation forward after a training one takes
rank 0's BatchNorm statistics), and a checkpoint written by rank 0 halfway
and resumed by a fresh model, optimizer, schedule and EMA.

Routes, each with the change a DDP user makes:
  ddp     the reference
  dm      hvd.DistributedModel(model): the rest of the script unchanged
  opt     hvd.DistributedOptimizer(..., model=net): the rest unchanged
          (torch's clipping between backward and step() waits for the
          reduction; model= applies DDP's buffer rule to the module)
  shard1  hvd.DistributedModel + hvd.DistributedOptimizer(shard=1): torch's
          clipping as before; consolidate_state_dict(to=None) before the
          usual checkpoint code (state_dict() on every rank)
  shard2  the same with shard=2 and the optimizer's own clip_grad_norm_
          (shard=2 keeps no whole gradient to clip)
  powersgd hvd.DistributedModel(compression=Compression.powersgd) at full
          rank from the third step (exact: P P^T M = M; equal to DDP within
          the orthogonalization's rounding); the checkpoint holds every
          rank's compressor state (its errors are each rank's own)
  adasum  hvd.DistributedOptimizer(op=hvd.Adasum), clipping the local
          gradients its local step takes (Adasum combines the steps), the
          checkpoint holding every rank's optimizer state (each rank's is
          its own): a different update rule, so only equal across ranks
          and resumable, not equal to DDP
  elastic hvd.DistributedModel, the loop inside hvd.elastic.run with a
          TorchState holding the model, optimizer, schedule and EMA; the
          checkpoint is a commit to disk, the resumed run a fresh state
          that hvd.elastic.run loads it into
  syncbn  hvd.SyncBatchNorm.convert_sync_batchnorm(model), then
          hvd.DistributedModel; compared with "solo" (torch's SyncBatchNorm
          refuses CPU tensors, so DDP cannot run it here)
  solo    the reference of syncbn: one process per rank, each training on
          the whole global batch with plain BatchNorm (what SyncBatchNorm
          with averaged gradients computes); both in float32

Each route saves {parameters, buffers, EMA, evaluation outputs} of rank 0
and of every rank (every rank's are compared with DDP's same rank),
uninterrupted and resumed, to <out>/<route>.pt.
"""

import math
import os

import torch
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import hvdtorch as hvd

STEPS = 6
RESUME_AT = 3
EVAL_AFTER = (1, 4)  # an evaluation after these steps (on every rank)
BATCH = 8
WARMUP = 2


def _net() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 5),
    )


def _shard(rank: int, size: int, step: int, ranks: int = 0):
    """This rank's batch of the global batch of ``step`` (a fixed synthetic
    set of ``ranks`` batches, default ``size``), cut in ``size`` pieces."""
    g = torch.Generator().manual_seed(1000 + step)
    total = BATCH * (ranks or size)
    x = torch.randn(total, 3, 12, 12, generator=g)
    y = torch.randint(0, 5, (total,), generator=g)
    x += y.view(-1, 1, 1, 1).float() * 0.3  # learnable
    per = total // size
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def _lr_factor(step: int) -> float:
    if step < WARMUP:
        return (step + 1) / WARMUP
    return 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (STEPS - WARMUP)))


def _schedule(opt):
    # A module-level factor: the schedule pickles, as a user's usually does.
    return torch.optim.lr_scheduler.LambdaLR(opt, _lr_factor)


class Run:
    """One route's model, optimizer, schedule and EMA."""

    made = 0  # names models the same on every rank

    def __init__(self, route: str, commit_dir: str = ""):
        self.route = route
        Run.made += 1
        net = _net()
        if route == "syncbn":
            net = hvd.SyncBatchNorm.convert_sync_batchnorm(net)
        if route == "ddp":
            self.model = torch.nn.parallel.DistributedDataParallel(net)
        elif route in ("dm", "shard1", "shard2", "elastic", "syncbn"):
            self.model = hvd.DistributedModel(net, name=f"ref.{route}.{Run.made}")
        elif route == "powersgd":
            self.powersgd = hvd.Compression.powersgd(rank=8, start_iter=2, min_compression_rate=0)
            self.model = hvd.DistributedModel(net, name=f"ref.{route}.{Run.made}", compression=self.powersgd)
        else:
            self.model = net
        self.net = net
        inner = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9, weight_decay=1e-3)
        self.schedule = _schedule(inner)
        if route in ("opt", "adasum"):
            op = hvd.Adasum if route == "adasum" else hvd.Average
            self.opt = hvd.DistributedOptimizer(inner, named_parameters=net.named_parameters(), op=op, model=net)
            hvd.broadcast_parameters(net.state_dict(), root_rank=0)
        elif route in ("shard1", "shard2"):
            self.opt = hvd.DistributedOptimizer(inner, shard=int(route[-1]))
        else:
            self.opt = inner
        self.ema = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(0.8), use_buffers=True)
        self.evals = []
        if route == "elastic":
            self.state = hvd.elastic.TorchState(
                net, self.opt, commit_dir=commit_dir, schedule=self.schedule, ema=self.ema, step=0
            )

    def step(self, step: int) -> None:
        x, y = _shard(0, 1, step, hvd.size()) if self.route == "solo" else _shard(hvd.rank(), hvd.size(), step)
        self.opt.zero_grad()
        # syncbn and solo batch the same samples differently (8 per rank, 16 in one): bfloat16 would round
        # them apart by up to 1e-3, hiding what the comparison is for.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.route not in ("syncbn", "solo")):
            loss = F.cross_entropy(self.model(x), y, label_smoothing=0.1)
        loss.float().backward()
        if self.route == "shard2":
            self.opt.clip_grad_norm_(1.0)
        else:
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
        self.opt.step()
        self.schedule.step()
        self.ema.update_parameters(self.net)
        if step in EVAL_AFTER:
            self.evaluate(step)

    @torch.no_grad()
    def evaluate(self, step: int) -> None:
        """The reference scripts' evaluate(): every rank, its own part of a validation set."""
        x, _ = _shard(hvd.rank(), hvd.size(), 500 + step)
        self.model.eval()
        out = self.model(x)
        self.model.train()
        self.evals.append((step, out.float().clone()))

    def checkpoint(self):
        """What rank 0 saves (every rank calls this: a consolidation is collective)."""
        if self.route in ("shard1", "shard2"):
            self.opt.consolidate_state_dict(to=None)  # then state_dict() is the whole state, on every rank
        opt = self.opt.state_dict()
        if self.route == "adasum":  # each rank's state is its own: rank 0 saves every rank's
            opt = hvd.allgather_object(opt, name="ref.adasum.states")
        ckpt = {
            "model": self.net.state_dict(),
            "optimizer": opt,
            "schedule": self.schedule.state_dict(),
            "ema": self.ema.state_dict(),
        }
        if self.route == "powersgd":  # Q factors, pass count and every rank's own errors
            ckpt["powersgd"] = hvd.allgather_object(self.powersgd.state_dict(), name="ref.powersgd.states")
        return ckpt

    def resume(self, ckpt) -> None:
        if self.route == "powersgd":
            self.powersgd.load_state_dict(ckpt["powersgd"])
        self.net.load_state_dict(ckpt["model"])
        self.opt.load_state_dict(ckpt["optimizer"])
        self.schedule.load_state_dict(ckpt["schedule"])
        self.ema.load_state_dict(ckpt["ema"])

    def result(self):
        return {
            "model": {k: v.detach().clone() for k, v in self.net.state_dict().items()},
            "ema": {k: v.detach().clone() for k, v in self.ema.state_dict().items()},
            "evals": list(self.evals),
        }


def _everyone(result) -> list:
    """Every rank's result, on every rank (for the across-ranks check)."""
    return hvd.allgather_object(result, name="ref.results")


def _elastic(run: Run) -> None:
    """The loop as an elastic job writes it: from the state's step to the
    end, committing at RESUME_AT (the commit is the checkpoint)."""

    @hvd.elastic.run
    def loop(state):
        for step in range(state.step, STEPS):
            if step == RESUME_AT and state.commit_count == 0:
                state.step = step
                state.commit()
            run.step(step)

    loop(run.state)


def train(out: str, route: str) -> None:
    hvd.init()
    torch.set_num_threads(1)
    if route == "elastic":
        commit_dir = os.path.join(out, "elastic")
        run = Run(route, commit_dir)
        _elastic(run)
        whole = run.result()
        hvd.barrier()
        resumed = Run(route, commit_dir)  # a restarted job: hvd.elastic.run loads the commit
        _elastic(resumed)
        assert resumed.state.step == RESUME_AT, resumed.state.step
        _save(out, route, whole, resumed.result())
        return
    path = os.path.join(out, f"ckpt.{route}.pt")
    # Uninterrupted, writing the checkpoint at RESUME_AT on the way.
    run = Run(route)
    for step in range(STEPS):
        if step == RESUME_AT:
            ckpt = run.checkpoint()
            if hvd.rank() == 0:
                torch.save(ckpt, path)
        run.step(step)
    whole = run.result()
    hvd.barrier()
    # Resumed: a fresh everything, loaded from rank 0's file.
    resumed = Run(route)
    resumed.resume(torch.load(path, weights_only=False))
    for step in range(RESUME_AT, STEPS):
        resumed.step(step)
    _save(out, route, whole, resumed.result())


def _save(out: str, route: str, whole, again) -> None:
    everyone = _everyone(whole)
    if hvd.rank() == 0:
        torch.save({"whole": whole, "resumed": again, "ranks": everyone}, os.path.join(out, f"{route}.pt"))
