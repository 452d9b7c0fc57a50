"""A GPT training script in the shape of the common minimal GPT training
scripts that use DDP, run once with DistributedDataParallel and once per
hvdtorch route on the same data, for tests/test_gpt_script.py.

The script (as those scripts write it): each rank seeds torch with its own
rank before building the model (so the wrap's broadcast is what makes the
ranks agree), AdamW with weight-decay groups, a learning-rate schedule set
by hand on param_groups, gradient accumulation through
``model.require_backward_grad_sync = (micro == ACCUM - 1)`` (or through
``no_sync()``), bfloat16 autocast on the CPU, a GradScaler (disabled in
bfloat16, as there) with ``scaler.unscale_`` and clipping before
``scaler.step``, ``raw_model = model.module``, an evaluation every few
iterations (on every rank, or on rank 0 alone: ``if master_process:``), a
checkpoint at RESUME_AT written by rank 0 from ``raw_model.state_dict()``
and ``optimizer.state_dict()``, and a resumed run that loads both into a
fresh model and optimizer *before* wrapping, as those scripts do.

Routes, each with the changes the guide names:
  ddp       the reference
  dm        hvd.DistributedModel(model): nothing else changes
  compiled  torch.compile(model) before hvd.DistributedModel, as before DDP
  opt       hvd.DistributedOptimizer(optimizer, model=model) (Horovod's
            route: hvd.broadcast_parameters and broadcast_optimizer_state
            after it; model= so that the script's require_backward_grad_sync
            and the buffer rule apply)
  shard1    DistributedModel + DistributedOptimizer(shard=1); the
            checkpoint's optimizer state via consolidate_state_dict(to=0),
            called on every rank before rank 0's block
  shard2    the same with shard=2 and the optimizer's own clip_grad_norm_
  shard3    the same with shard=3; the model's state via the
            DistributedModel's state_dict(to=0), on every rank
Options (argv): the route, "flag" or "no_sync" (how accumulation is
written), "every" or "master" (who evaluates).

Each run saves, per rank: the parameters, the optimizer state in torch's
format (consolidated on the sharded routes), every parameter's .grad after
the first micro-step of one iteration (a local one: where it exists), the
evaluation losses and, under DDP, how many times each bucket was reduced in
each iteration (a counting comm hook), for the uninterrupted and the resumed
run, to <out>/<route>-<how>-<who>.pt (rank 0 writes every rank's). An
hvdtorch route's reductions are in its timeline (the test sets one).
"""

import collections
import math
import os
import sys
import time

import torch

import hvdtorch as hvd
from benchmarks.workloads.gpt import GPT, SIZES, optimizer_groups, token_batches

STEPS = 6
RESUME_AT = 3
ACCUM = 2
BATCH = 4  # per rank and micro-step
EVAL_EVERY = 2
GRAD_AT = 1  # the iteration whose first micro-step's .grad is recorded
CONFIG = SIZES["test"]


def _lr(it: int) -> float:
    warmup, top = 2, 3e-3
    if it < warmup:
        return top * (it + 1) / warmup
    return top * 0.5 * (1 + math.cos(math.pi * (it - warmup) / (STEPS - warmup)))


def _batch(it: int, micro: int, rank: int, size: int, split: str = "train"):
    seed = 7 if split == "train" else 11
    x, y = token_batches(CONFIG, BATCH * size, seed, it * ACCUM + micro)
    return x[rank * BATCH : (rank + 1) * BATCH], y[rank * BATCH : (rank + 1) * BATCH]


class Script:
    def __init__(self, route: str, how: str, who: str, ckpt=None):
        self.route, self.how, self.who = route, how, who
        self.reduced = collections.Counter()  # DDP: bucket index -> reductions so far
        self.reductions = []  # DDP: per iteration, bucket index -> reductions in it
        rank = hvd.rank()
        torch.manual_seed(1337 + rank)  # the ranks' models differ until the wrap
        net = GPT(CONFIG)
        if ckpt is not None:
            net.load_state_dict(ckpt["model"])
        optimizer = torch.optim.AdamW(optimizer_groups(net, 0.1), lr=_lr(0), betas=(0.9, 0.95))
        if ckpt is not None:
            optimizer.load_state_dict(ckpt["optimizer"])  # before the wrap, as the scripts do
        if route in ("compiled", "ddp-compiled"):
            net = torch.compile(net)
        self.scaler = torch.amp.GradScaler("cpu", enabled=False)  # bfloat16 needs none
        if route.startswith("ddp"):
            self.model = torch.nn.parallel.DistributedDataParallel(net)
            self.optimizer = optimizer
            self.model.register_comm_hook(self.reduced, _counting_allreduce)
        elif route == "opt":
            self.model = net
            self.optimizer = hvd.DistributedOptimizer(optimizer, model=net)
            hvd.broadcast_parameters(net.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
        else:
            self.model = hvd.DistributedModel(net)
            self.optimizer = optimizer
            if route.startswith("shard"):
                self.optimizer = hvd.DistributedOptimizer(optimizer, shard=int(route[-1]))
        self.raw_model = self.model.module if route not in ("opt",) else self.model
        self.evals = []
        self.grads = None

    def _accumulating(self, micro: int):
        """The script's accumulation switch for this micro-step (a context)."""
        last = micro == ACCUM - 1
        if self.how == "flag":
            self.model.require_backward_grad_sync = last
            return _nothing()
        return _nothing() if last or self.route == "opt" else self.model.no_sync()

    @torch.no_grad()
    def estimate_loss(self, it: int) -> float:
        self.model.eval()
        x, y = _batch(it, 0, 0, 1, "val")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = self.model(x, y)
        self.model.train()
        return float(loss)

    def iteration(self, it: int) -> None:
        before = collections.Counter(self.reduced)
        self._iteration(it)
        self.reductions.append(dict(self.reduced - before))

    def _iteration(self, it: int) -> None:
        rank, size = hvd.rank(), hvd.size()
        for group in self.optimizer.param_groups:
            group["lr"] = _lr(it)
        if it % EVAL_EVERY == 0 and (self.who == "every" or rank == 0):
            self.evals.append((it, self.estimate_loss(it)))
        for micro in range(ACCUM):
            x, y = _batch(it, micro, rank, size)
            with self._accumulating(micro):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    _, loss = self.model(x, y)
                loss = loss / ACCUM
                self.scaler.scale(loss).backward()
            if it == GRAD_AT and micro == 0 and self.route != "shard3":
                self.grads = {n: p.grad.detach().clone() for n, p in self.raw_model.named_parameters()}
        self.scaler.unscale_(self.optimizer)
        if self.route in ("shard2", "shard3"):
            self.optimizer.clip_grad_norm_(1.0)
        else:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def checkpoint(self):
        """What rank 0 saves (every rank calls this on the sharded routes: consolidation is collective)."""
        if self.route.startswith("shard"):
            self.optimizer.consolidate_state_dict(to=0)
        model = self.model.state_dict(to=0) if self.route == "shard3" else self.raw_model.state_dict()
        if hvd.rank() != 0:
            return None
        return {"model": _plain_keys(model), "optimizer": self.optimizer.state_dict()}

    def result(self):
        if self.route == "shard3":
            full = self.model.state_dict()  # collective; tied weights appear under both names
            params = {n: full[n] for n, _ in self.raw_model.named_parameters()}
        else:
            params = {n: p.detach().clone() for n, p in self.raw_model.named_parameters()}
        if self.route.startswith("shard"):
            self.optimizer.consolidate_state_dict(to=None)
        state = self.optimizer.state_dict()
        name_of = {id(p): n for n, p in self.raw_model.named_parameters()}
        order = [name_of[id(p)] for g in self.optimizer.param_groups for p in g["params"]]
        return {
            "order": [n.replace("_orig_mod.", "") for n in order],  # optimizer state index -> parameter name
            "params": {k: v.detach().clone() for k, v in _plain_keys(params).items()},
            "optimizer": state["state"],
            "evals": self.evals,
            "grads": self.grads,
            "reductions": self.reductions if self.route.startswith("ddp") else None,
        }


def _counting_allreduce(counts, bucket):
    """DDP's own all-reduce of a bucket (the default hook's), counted."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    counts[bucket.index()] += 1
    return default_hooks.allreduce_hook(None, bucket)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _plain_keys(state):
    """Without the compiled module's prefix (the scripts strip it too)."""
    return {k.replace("_orig_mod.", ""): v for k, v in state.items()}


def train(out: str, route: str, how: str, who: str) -> None:
    hvd.init()
    torch.set_num_threads(1)
    path = os.path.join(out, f"ckpt-{route}-{how}-{who}.pt")
    script = Script(route, how, who)
    for it in range(STEPS):
        if it == RESUME_AT:
            ckpt = script.checkpoint()
            if ckpt is not None:
                torch.save(ckpt, path)
        script.iteration(it)
    whole = script.result()
    hvd.barrier()
    resumed = Script(route, how, who, ckpt=torch.load(path, weights_only=False))
    for it in range(RESUME_AT, STEPS):
        resumed.iteration(it)
    again = resumed.result()
    everyone = hvd.allgather_object({"whole": whole, "resumed": again}, name="gpt.results")
    if hvd.rank() == 0:
        torch.save(everyone, os.path.join(out, f"{route}-{how}-{who}.pt"))


def master_eval_refused(out: str) -> None:
    """shard=3 and an evaluation on rank 0 alone: every rank raises at once,
    naming rank 0's forward, instead of waiting for the timeout."""
    hvd.init()
    torch.set_num_threads(1)
    script = Script("shard3", "flag", "every")
    script.iteration(0)
    start = time.monotonic()
    try:
        if hvd.rank() == 0:
            script.estimate_loss(1)
        script.iteration(1)
    except RuntimeError as e:
        waited = time.monotonic() - start
        text = str(e)
        assert "rank 0 began a forward without autograd (an evaluation)" in text, text
        assert "rank 1 began a forward with autograd (training)" in text, text
        assert "gathered_parameters" in text and "every rank" in text, text
        timeout = float(os.environ.get("HVDTORCH_TIMEOUT", "20"))
        assert waited < timeout / 2, f"the refusal took {waited:.1f} s (timeout {timeout} s)"
        print(f"rank {hvd.rank()}: refused after {waited:.2f} s: {text[:160]}")
        sys.stdout.flush()
        os._exit(0)  # the other rank may be inside an op that can no longer complete
    raise AssertionError(f"rank {hvd.rank()}: a forward on rank 0 alone was not refused")


def master_eval_inside_gathered_parameters(out: str) -> None:
    """shard=3: rank 0 alone evaluates inside gathered_parameters() (entered on every rank)."""
    hvd.init()
    torch.set_num_threads(1)
    script = Script("shard3", "flag", "every")
    script.iteration(0)
    with script.model.gathered_parameters(modifier_rank=None):
        if hvd.rank() == 0:
            loss = script.estimate_loss(1)
            assert math.isfinite(loss)
    script.iteration(1)
