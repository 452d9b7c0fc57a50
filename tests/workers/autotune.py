"""Training with HVDTORCH_AUTOTUNE=1 (set by the test, with a small grid).

Every rank trains its shard of each global batch while the tuner walks its
grid, and a private copy on the whole global batch: parameters must match at
the end (tuning changes bucket layouts, never values). Then every rank must
hold the same frozen setting -- engine fusion threshold, cycle time, bucket
layout -- and rank 0's log must list every trial and mark the best.
"""

import copy
import csv
import os
import statistics

import torch
import torch.nn.functional as F

import hvdtorch as hvd
from hvdtorch import autotune
from hvdtorch.training.buckets import plan_buckets
from tests.workers.training import Net, assert_params_close, batch, make_opt, shard, train_reference

# Small enough that each candidate gives this small net a different layout.
FUSION = (0, 400, 1 << 20)
CYCLES_MS = (0.2, 1.0)  # 1.0 is the starting cycle time: phase 2 tries 0.2 only
ROUNDS = 2
TRIALS = (len(FUSION) + 1) * ROUNDS
STEPS = 28  # warm-up 1 + 2 timed steps per trial: frozen after step 25


def _train(kind: str):
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    base = Net()
    ref = train_reference(copy.deepcopy(base), "sgd", n, steps=STEPS)
    module = copy.deepcopy(base)
    if kind == "model":
        model = hvd.DistributedModel(module, fusion_bytes=1 << 20, first_bucket_bytes=300)
        opt = make_opt("sgd", model.parameters())
    else:
        model = module
        opt = hvd.DistributedOptimizer(make_opt("sgd", module.parameters()), named_parameters=module.named_parameters())
    tuner = autotune.current()
    assert tuner is not None, f"rank {r}: HVDTORCH_AUTOTUNE=1 attached no tuner to the {kind}"
    for s in range(STEPS):
        x, y = batch(s, n)
        opt.zero_grad()
        F.cross_entropy(model(shard(x, r)), shard(y, r)).backward()
        opt.step()
    assert_params_close(module, ref, f"rank {r}: {kind} trained under autotune")
    return model, tuner


def _check_agreed(kind, model, tuner):
    r = hvd.rank()
    assert tuner.frozen is not None, f"rank {r}: {kind}: autotune did not freeze after {STEPS} steps"
    tried = [(t.setting.fusion_bytes, t.setting.cycle_time_ms) for t in tuner.search.trials]
    phase1 = {s: v for s, v in tuner.search.scores().items() if s.cycle_time_ms == 1.0}
    best_fusion = max(phase1, key=lambda s: phase1[s]).fusion_bytes
    want = [(f, 1.0) for f in FUSION + FUSION[::-1]] + [(best_fusion, 0.2)] * 2
    assert tried == want, f"rank {r}: {kind}: tried {tried}, want {want}"
    scores = tuner.search.scores()
    assert tuner.frozen == max(scores, key=lambda s: scores[s]), f"rank {r}: froze {tuner.frozen}, scores {scores}"
    engine = hvd.runtime.state().engine
    assert engine.fusion_threshold() == tuner.frozen.fusion_bytes
    assert abs(engine.cycle_time_ms() - tuner.frozen.cycle_time_ms) < 1e-9
    mine = [engine.fusion_threshold(), engine.cycle_time_ms()] + [t.score for t in tuner.search.trials]
    if kind == "model":
        buckets = model.bucket_bytes()
        want = plan_buckets(model._params, model._order, tuner.frozen.fusion_bytes, min(300, tuner.frozen.fusion_bytes))
        assert len(buckets) == len(want), f"rank {r}: {len(buckets)} buckets, the frozen cap plans {len(want)}"
        mine += buckets
    everyone = hvd.allgather_object(mine)
    assert all(x == everyone[0] for x in everyone), f"ranks disagree on the frozen setting or scores: {everyone}"


def _check_log(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == TRIALS, f"log {path}: {len(rows)} rows, want {TRIALS}"
    assert list(rows[0]) == ["trial", "fusion_bytes", "cycle_time_ms", "score", "median_step_s", "chosen"]
    chosen = {(row["fusion_bytes"], row["cycle_time_ms"]) for row in rows if row["chosen"] == "1"}
    assert len(chosen) == 1, f"log {path}: rows of {len(chosen)} settings marked chosen"
    by_setting = {}
    for row in rows:
        by_setting.setdefault((row["fusion_bytes"], row["cycle_time_ms"]), []).append(float(row["score"]))
    medians = {k: statistics.median(v) for k, v in by_setting.items()}
    best = max(medians, key=lambda k: medians[k])
    assert chosen == {best}, f"log {path}: chose {chosen}, best median score {best} ({medians})"
    assert all(float(row["score"]) > 0 for row in rows)


def check_autotuned_training(kind: str):
    autotune.FUSION_CANDIDATES = FUSION
    autotune.CYCLE_CANDIDATES_MS = CYCLES_MS
    hvd.init()
    model, tuner = _train(kind)
    _check_agreed(kind, model, tuner)
    if hvd.rank() == 0:
        _check_log(os.environ["HVDTORCH_AUTOTUNE_LOG"])
    # Only the first model or optimizer of an init() is tuned.
    second = hvd.DistributedModel(Net(), name="second")
    assert second._autotune is None
    hvd.shutdown()


def check_off_by_default():
    hvd.init()
    model = hvd.DistributedModel(Net())
    assert model._autotune is None and autotune.current() is None
    hvd.shutdown()


def check_join_during_tuning():
    """Rank 1 runs out of data in the middle of tuning: rank 0's next
    agreement sees it missing, both keep the setting in effect, join() ends
    tuning on both, and training goes on together afterwards."""
    autotune.FUSION_CANDIDATES = FUSION
    autotune.CYCLE_CANDIDATES_MS = CYCLES_MS
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    model = hvd.DistributedModel(Net(), fusion_bytes=1 << 20, first_bucket_bytes=300)
    opt = make_opt("sgd", model.parameters())
    tuner = autotune.current()
    # Forward 1 agrees the bucket order and starts trial 0; trials end (and
    # switch) at forwards 4 and 7. Rank 1 stops after forward 7, rank 0's
    # agreement at forward 10 finds it gone.
    for s in range(8 if r == 1 else 14):
        x, y = batch(s, n)
        opt.zero_grad()
        F.cross_entropy(model(shard(x, r)), shard(y, r)).backward()
        opt.step()
    assert not tuner.done or r == 0, f"rank {r}: tuning ended before join()"
    hvd.join()
    assert tuner.done, f"rank {r}: join() did not end tuning"
    want = autotune.Setting(FUSION[2], 1.0)  # the third trial's, in effect when rank 1 left
    assert tuner.frozen == want, f"rank {r}: kept {tuner.frozen}, want {want}"
    engine = hvd.runtime.state().engine
    assert engine.fusion_threshold() == want.fusion_bytes and engine.cycle_time_ms() == want.cycle_time_ms
    everyone = hvd.allgather_object(model.bucket_bytes())
    assert everyone[0] == everyone[1], f"bucket layouts differ after join: {everyone}"
    for s in range(3):  # together again: the same averaged gradients everywhere
        x, y = batch(100 + s, n)
        opt.zero_grad()
        F.cross_entropy(model(shard(x, r)), shard(y, r)).backward()
        grads = hvd.allgather_object([float(p.grad.sum()) for p in model.parameters()])
        assert grads[0] == grads[1], f"step {s} after join: gradients differ across ranks: {grads}"
        opt.step()
    hvd.shutdown()
