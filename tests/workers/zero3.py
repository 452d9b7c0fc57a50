"""Rank-side checks of shard=3 (parameters sharded at rest).

Every rank builds the same model (same seed), trains it with shard=3 on its
part of each global batch, and trains a private one-process copy on the
whole batch; in float64 the parameters must match to rtol 1e-9. The model
has a module with a parameter of its own and a child (nested units), a
parameter no forward uses, tied weights (one parameter held by two
modules), a module called twice in one forward, a LayerNorm, a frozen
parameter, a module of a unit called on its own and shapes no number of
ranks divides.
"""

import collections
import contextlib
import copy
import gc
import os
import weakref

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import hvdtorch as hvd
from hvdtorch import runtime
from hvdtorch.collectives import ops
from tests.workers.common import expect, job_process_set

PER_RANK = 3
D = 7


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(D, D)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, D))
        self.rare = torch.nn.Parameter(torch.randn(3))  # local_loss: used on rank 0 only
        self.use_rare = True

    def forward(self, x):
        out = torch.tanh(self.lin(x)) * self.scale
        return out + 0.1 * self.rare.sum() if self.use_rare else out


class Net(torch.nn.Module):
    def __init__(self, checkpointed=False):
        super().__init__()
        self.inp = torch.nn.Linear(5, D)
        self.block = Block()
        self.norm = torch.nn.LayerNorm(D)
        self.mid = torch.nn.Linear(D, D, bias=False)
        self.out = torch.nn.Linear(D, D, bias=False)
        self.out.weight = self.mid.weight  # tied: held by two modules
        self.head = torch.nn.Linear(D, 3)
        self.frozen = torch.nn.Parameter(torch.ones(D), requires_grad=False)
        self.checkpointed = checkpointed

    def forward(self, x):
        h = torch.relu(self.inp(x))
        if self.checkpointed:
            h = checkpoint(self.block, h, use_reentrant=False)
        else:
            h = self.block(h)
        h = self.block(h)  # called twice
        h = h + 0.5 * self.block.lin(h)  # a module of the block's unit called on its own
        h = self.out(torch.relu(self.mid(self.norm(h)))) * self.frozen
        return self.head(h)


def batch(step, n):
    g = torch.Generator().manual_seed(100 + step)
    return (
        torch.randn(PER_RANK * n, 5, dtype=torch.float64, generator=g),
        torch.randn(PER_RANK * n, 3, dtype=torch.float64, generator=g),
    )


def local_loss(model, step, k, n):
    x, y = batch(step, n)
    s = slice(k * PER_RANK, (k + 1) * PER_RANK)
    block = getattr(model, "module", model).block
    block.use_rare = k == 0  # a parameter the other ranks leave unused
    try:
        return F.mse_loss(model(x[s]), y[s])
    finally:
        block.use_rare = True


def make_opt(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01)
    return torch.optim.Adam(params, lr=0.01)


def global_loss(model, step, n):
    """The loss whose gradient is the average of every rank's local gradient."""
    return sum(local_loss(model, step, k, n) for k in range(n)) / n


def trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def sharded(kind, base=None, dm_kw=None, **opt_kw):
    """A DistributedModel over a copy of ``base`` (a fresh base_model() by
    default) and its shard=3 optimizer of ``kind``."""
    dm = hvd.DistributedModel(base_model() if base is None else copy.deepcopy(base), **(dm_kw or {}))
    opt = hvd.DistributedOptimizer(
        make_opt(kind, trainable(dm)), named_parameters=dm.named_parameters(), shard=3, model=dm, **opt_kw
    )
    return dm, opt


def base_model(checkpointed=False):
    torch.manual_seed(0)
    return Net(checkpointed).double()


def assert_equal_to(dm, ref, what, tol=(1e-9, 1e-12)):
    full = dm.state_dict()
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(full[k], v, rtol=tol[0], atol=tol[1], msg=lambda m, k=k: f"{what}: {k}: {m}")


def step_beside_reference(dm, opt, ref, steps, k, n):
    """`steps` Adam steps of shard=3 (`dm`, `opt`: this rank's share `k` of
    `n`) and of the one-process reference `ref` on the global batch."""
    ref_opt = make_opt("adam", trainable(ref))
    for step in range(steps):
        opt.zero_grad()
        local_loss(dm, step, k, n).backward()
        opt.step()
        ref_opt.zero_grad()
        global_loss(ref, step, n).backward()
        ref_opt.step()


def train(
    kind="adam", steps=3, accumulate=1, use_no_sync=False, checkpointed=False, dm_kw=None, tol=(1e-9, 1e-12), **kw
):
    """Trains shard=3 and the one-process reference; checks they match.
    dm_kw's process_set (default the global one) is the job: its ranks'
    batches are the global batch."""
    ps = (dm_kw or {}).get("process_set") or hvd.global_process_set
    n, r = ps.size(), ps.rank()
    base = base_model(checkpointed)
    ref = copy.deepcopy(base)
    ref_opt = make_opt(kind, trainable(ref))
    dm, opt = sharded(
        kind,
        base,
        dict(dm_kw or {}, backward_passes_per_step=1 if use_no_sync else accumulate),
        fusion_bytes=kw.pop("fusion_bytes", 96),
        keep_gathered_below=kw.pop("keep_gathered_below", 0),
        **kw,
    )
    for step in range(steps):
        opt.zero_grad()
        for a in range(accumulate):
            s = step * accumulate + a
            if use_no_sync and a < accumulate - 1:
                with dm.no_sync():
                    (local_loss(dm, s, r, n) / accumulate).backward()
            else:
                (local_loss(dm, s, r, n) / accumulate).backward()
        opt.step()
        ref_opt.zero_grad()
        for a in range(accumulate):
            s = step * accumulate + a
            (global_loss(ref, s, n) / accumulate).backward()
        ref_opt.step()
    assert_equal_to(dm, ref, f"rank {r}: {kind} {kw} {dm_kw}", tol)
    return dm, opt, ref


def _check_host_copy_choice(opt, ps):
    """One gathered copy per host wherever every host holds as many ranks of
    the set, more than one (for a set on several hosts: the global set
    only), in host memory, with shared memory on; decided alike on every
    rank (hosts of different sizes: on none)."""
    if ps is hvd.global_process_set:
        equal_hosts = hvd.local_size() > 1 and runtime.state().homogeneous
    else:
        host_of = runtime.state().engine.topology()["host_of_rank"]
        per_host = collections.Counter(host_of[g] for g in ps.ranks)
        equal_hosts = len(per_host) == 1 and ps.size() > 1
    expected = equal_hosts and os.environ.get("HVDTORCH_SHM") != "0" and opt._shards[0].device.type == "cpu"
    chosen = hvd.allgather_object(opt._units.shares_gathered(), process_set=ps)
    assert chosen == [expected] * ps.size(), f"host copy chosen {chosen} on ranks {ps.ranks}, expected {expected}"


def check_training(which):
    """In the job's set (tests/harness.py's process_set=; the global set by
    default): training equal to one process on the set's global batch."""
    hvd.init()
    ps = job_process_set()
    if hvd.rank() in ps.ranks:
        _check_training(which, {} if ps is hvd.global_process_set else {"process_set": ps})
    hvd.barrier()


def _check_training(which, set_kw):
    ps = set_kw.get("process_set", hvd.global_process_set)
    assert which == "quick" or not set_kw, "in a process set: the quick check"
    _check_host_copy_choice(sharded("sgd", dm_kw=set_kw, fusion_bytes=96)[1], ps)  # before any gather
    _, opt, _ = train("adam", dm_kw=set_kw)
    _check_host_copy_choice(opt, ps)
    if which == "quick":
        return
    train("sgd")
    train("adam", reshard_after_forward=False)
    train("adam", fusion_bytes=0)  # one parameter per bucket
    train("sgd", accumulate=2)
    train("adam", accumulate=3, use_no_sync=True)
    train("adam", checkpointed=True)
    train("sgd", fusion_bytes=25 << 20)  # the whole model is one unit
    train("adam", fusion_bytes=600)  # the block (528 bytes) is one unit with its child
    train("adam", keep_gathered_below=1 << 20)  # every bucket kept gathered between uses
    train("sgd", keep_gathered_below=200, accumulate=2)  # some kept, some not
    # fp16 on the wire: the gradients are rounded, so equal within float16's precision.
    train("sgd", dm_kw={"compression": hvd.Compression.fp16}, tol=(2e-3, 2e-4))


def check_memory_at_rest():
    """Between steps no rank holds a gathered bucket, a full parameter or a
    gradient buffer; the shards are the parameters' 1/N."""
    hvd.init()
    n = hvd.size()
    dm, opt, _ = train("adam", steps=2)
    units = opt._units
    assert all(f is None for f in units._full), "a bucket stays gathered after step()"
    assert not units._gathers, "a gather is left in flight"
    for name, p in dm.named_parameters():
        if p.requires_grad:
            assert p.stride() == (0,) * p.dim() and p.untyped_storage().nbytes() == 8, name
    # The gradient buffers are released once reduced.
    assert all(f is None for f in opt._grads._flats), "gradient buffers kept"
    total = sum(p.numel() for p in dm.parameters() if p.requires_grad)
    held = sum(s.numel() for s in opt._shards)
    assert held == total * 1 // n or abs(held - total / n) <= len(opt._shards), (held, total, n)
    # Built whole, the model's flat buckets were made once, to cut the shards from: each shard holds a storage
    # of its own, its 1/N of the bucket, never a view that keeps the whole bucket alive; and the parameters
    # hold one element each (their stand-ins), nothing of the model they were built with.
    for j, s in enumerate(opt._shards):
        b = opt._buckets[j]
        start, end = b.shard_range(hvd.rank(), n)
        assert s.numel() == end - start, (j, s.numel(), start, end)
        assert s.untyped_storage().nbytes() == s.numel() * s.element_size() < b.numel * s.element_size(), (
            f"bucket {j}: the shard of {s.numel()} elements holds {s.untyped_storage().nbytes()} bytes, the "
            f"bucket {b.numel * s.element_size()}"
        )
    assert sum(s.untyped_storage().nbytes() for s in opt._shards) <= (total // n + len(opt._shards)) * 8
    for name, p in dm.named_parameters():
        if p.requires_grad:
            assert p.untyped_storage().nbytes() == p.element_size(), (name, p.untyped_storage().nbytes())
    # After a forward (reshard_after_forward) nothing is gathered either, and what autograd saved holds no
    # gathered bucket alive (each gathered bucket is watched through a weak reference).
    gathered = []
    finish = units._finish

    def watched(j):
        full = finish(j)
        gathered.append(weakref.ref(full))
        return full

    units._finish = watched
    # While the head's forward starts, only the root's unit (the tied weight) and what is prefetched are
    # gathered: every unit before it was freed after its forward.
    gathered_at = {}

    def count(name):
        gathered_at[name] = sum(f is not None for f in units._full)

    buckets_of = {
        name: len(units._unit_buckets.get(units._unit_of_module[id(m)], []))
        for name, m in dm.module.named_modules()
        if id(m) in units._unit_of_module
    }
    head = dm.module.head.register_forward_pre_hook(lambda *_: count("head"))
    last = dm.module.inp.weight.register_post_accumulate_grad_hook(lambda *_: count("inp.weight"))
    x, y = batch(0, n)
    out = dm(x[:PER_RANK])
    assert gathered, "the forward gathered nothing"
    assert all(f is None for f in units._full)
    gc.collect()
    alive = sum(w() is not None for w in gathered)
    assert alive == 0, f"{alive} of {len(gathered)} gathered buckets outlive the forward"
    F.mse_loss(out, y[:PER_RANK]).backward()
    head.remove()
    last.remove()
    assert all(f is None for f in units._full), "a bucket stays gathered after backward"
    assert gathered_at["head"] <= buckets_of[""] + buckets_of["head"], (gathered_at, buckets_of)
    # In backward, a unit is freed once its gradients are in: at the last gradient only the first layer's is left.
    assert gathered_at["inp.weight"] <= buckets_of["inp"], (gathered_at, buckets_of)
    opt.step()


def check_one_copy_per_host():
    """On one host the ranks read one gathered copy: what rank 0 writes into
    a gathered weight inside its unit's forward is what every rank reads
    there. share_gathered=False gives each rank a copy of its own."""
    hvd.init()
    r = hvd.rank()
    for share in (True, False):
        dm, opt = sharded("sgd", fusion_bytes=96, keep_gathered_below=0, share_gathered=share)
        assert opt._units.shares_gathered() == share
        seen = []

        def probe(module, _args):
            hvd.barrier()
            if r == 0:
                module.weight.data[0, 0] = 12345.0  # by hand, past the check of writes through the parameter
            hvd.barrier()
            seen.append(float(module.weight[0, 0]))
            hvd.barrier()

        hook = dm.module.head.register_forward_pre_hook(probe)
        with torch.no_grad():
            dm(batch(0, hvd.size())[0][:PER_RANK])
        hook.remove()
        assert seen and (seen[0] == 12345.0) == (share or r == 0), (share, seen)
    # A tensor that still holds a unit after it is freed (here a view kept by hand; in training, what a
    # checkpointed recomputation saved) keeps its values while later units take the host's slots.
    dm, opt = sharded("sgd", fusion_bytes=96, keep_gathered_below=0)
    kept = {}

    def grab(module, _args):
        kept["view"] = module.weight.detach()  # shares the gathered memory
        kept["values"] = module.weight.detach().clone()

    hook = dm.module.inp.register_forward_pre_hook(grab)
    with torch.no_grad():
        dm(batch(0, hvd.size())[0][:PER_RANK])  # inp freed first, then every later unit gathered
    hook.remove()
    assert torch.equal(kept["view"], kept["values"]), "a freed unit's late holder reads another unit's values"


def check_secondary_copy():
    """secondary_copy=True across hosts: equal to one process, and after a
    bucket's first gather in a step it is gathered again within the host
    (backward's gathers included): into the host's copy from the ranks'
    secondary parts, or among the host's ranks. Without it, backward
    gathers across the hosts again (every rank's shards, or the column's
    into the host's copy)."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    for share in (True, False):
        train("adam", secondary_copy=True, share_gathered=share)
    train("sgd", accumulate=2, use_no_sync=True, secondary_copy=True)
    train("adam", checkpointed=True, secondary_copy=True)
    host_of = runtime.state().engine.topology()["host_of_rank"]
    start = ops.allgather_async
    for share in (True, False):
        for secondary in (True, False):
            dm, opt = sharded(
                "sgd", fusion_bytes=96, keep_gathered_below=0, secondary_copy=secondary, share_gathered=share
            )
            assert opt._units.shares_gathered() == share
            seen = {"every": [], "column": [], "host": []}

            def counted(tensor, name=None, process_set=None):
                ranks = (process_set or hvd.global_process_set).ranks
                kind = "every" if len(ranks) == n else "host" if len({host_of[g] for g in ranks}) == 1 else "column"
                seen[kind].append(name)
                return start(tensor, name=name, process_set=process_set)

            ops.allgather_async = counted
            try:
                opt.zero_grad()
                local_loss(dm, 0, r, n).backward()
                opt.step()
            finally:
                ops.allgather_async = start
            across = seen["column"] if share else seen["every"]
            assert across and not seen["every" if share else "column"], (share, secondary, seen)
            if secondary:  # each bucket crosses once; then within the host (into its copy, or among its ranks)
                assert len(across) == len(set(across)) and (share or seen["host"]), (share, secondary, seen)
            else:  # backward gathers across the hosts again
                assert len(across) > len(set(across)) and not seen["host"], (share, secondary, seen)
    # A set that is not the job's: its hosts' sets would need every rank of the job, so it is refused.
    pair = hvd.add_process_set([0, 3])  # one rank on each host
    if r in pair.ranks:
        expect(
            ValueError,
            ["secondary_copy=True needs the global process set"],
            lambda: sharded("sgd", dm_kw={"process_set": pair}, secondary_copy=True),
            r,
        )
    hvd.barrier()


def check_kept_buckets():
    """Buckets under keep_gathered_below: one grouped all-gather at the first
    forward after a step, kept through forward and backward, freed by step()."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    dm, opt, _ = train("adam", steps=1, keep_gathered_below=200)
    units = opt._units
    kept = set(units._kept)
    assert kept and len(kept) < len(units._full), (kept, len(units._full))
    assert units.kept_bytes() == sum(opt._buckets[j].numel * 8 for j in kept)
    opt.step()  # frees what the state_dict() of the check left gathered
    x, y = batch(0, n)
    grouped = []
    start = ops.grouped_allgather_async

    def counted(tensors, name=None, process_set=None):
        grouped.append(len(tensors))
        return start(tensors, name=name, process_set=process_set)

    ops.grouped_allgather_async = counted
    try:
        for sync in (False, True):
            with contextlib.nullcontext() if sync else dm.no_sync():
                loss = F.mse_loss(dm(x[r * PER_RANK : (r + 1) * PER_RANK]), y[r * PER_RANK : (r + 1) * PER_RANK])
                assert {j for j, f in enumerate(units._full) if f is not None} == kept
                loss.backward()
                assert {j for j, f in enumerate(units._full) if f is not None} == kept
    finally:
        ops.grouped_allgather_async = start
    assert grouped == [len(kept)], grouped  # one grouped gather for the two forwards
    opt.step()
    assert all(f is None for f in units._full)
    # A write inside gathered_parameters() to a kept bucket's parameter: every rank takes rank 0's value, in
    # the next forward too (the kept bucket is gathered again from the shards, not kept with its own write).
    small = next(p for j in kept for i in opt._buckets[j].params for p in [units._params[i]])
    loss = F.mse_loss(dm(x[r * PER_RANK : (r + 1) * PER_RANK]), y[r * PER_RANK : (r + 1) * PER_RANK])
    loss.backward()  # kept buckets gathered now
    with dm.gathered_parameters():
        with torch.no_grad():
            small.fill_(1.0 if r == 0 else 2.0)
    seen = []
    probe = dm.module.head.register_forward_pre_hook(lambda *_: seen.append(float(small.reshape(-1)[0])))
    dm(x[:PER_RANK])
    probe.remove()
    assert seen and seen[-1] == 1.0, seen
    opt.step()


def check_gathered_parameters_and_state_dicts():
    hvd.init()
    r = hvd.rank()
    dm, opt, ref = train("sgd", steps=2)
    # Writes inside are taken from modifier_rank (0): rank 0 writes 1.0, then the others 2.0 (last, so that a
    # copy the ranks shared would end with 2.0).
    with dm.gathered_parameters():
        torch.testing.assert_close(dm.module.head.weight, ref.head.weight, rtol=1e-9, atol=1e-12)
        for writer in (True, False):
            if (r == 0) == writer:
                with torch.no_grad():
                    dm.module.head.bias.fill_(1.0 if r == 0 else 2.0)
            hvd.barrier()
    with dm.gathered_parameters(modifier_rank=None):
        assert bool((dm.module.head.bias == 1.0).all()), dm.module.head.bias
    expect(
        RuntimeError,
        ["read only"],
        lambda: _write_inside_read_only(dm),
        r,
    )
    # The module's own state_dict() raises; the DistributedModel's is the whole state on `to` only.
    expect(RuntimeError, ["DistributedModel's state_dict()"], lambda: dm.module.state_dict(), r)
    expect(RuntimeError, ["DistributedModel's load_state_dict()"], lambda: dm.module.block.load_state_dict({}), r)
    only0 = dm.state_dict(to=0)
    assert (len(only0) > 0) == (r == 0), sorted(only0)
    full = dm.state_dict()
    assert "out.weight" in full and "mid.weight" in full and "frozen" in full
    path = os.environ["ZERO3_CKPT"]
    mine = dm.sharded_state_dict()
    every = hvd.allgather_object(mine)
    if r == 0:
        torch.save(full, path)
        torch.save(every, path + ".shards")
    hvd.barrier()
    # This rank's own shards load back at this size; another rank's are refused.
    opt.zero_grad()
    local_loss(dm, 5, r, hvd.size()).backward()
    opt.step()
    assert not torch.equal(dm.state_dict()["head.weight"], full["head.weight"])
    dm.load_state_dict(mine)
    for k, v in full.items():
        torch.testing.assert_close(dm.state_dict()[k], v, rtol=0, atol=0, msg=k)
    expect(ValueError, ["shards of rank"], lambda: dm.load_state_dict(every[1 - r]), r)
    # A plain model loads it; a shard=3 model at this size loads it and trains on equally.
    plain = base_model()
    plain.load_state_dict(torch.load(path))
    fresh, _ = sharded("sgd", fusion_bytes=64)
    fresh.load_state_dict(torch.load(path))
    for k, v in plain.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[k], v, rtol=0, atol=0, msg=k)
    expect(
        RuntimeError,
        ["Missing key(s) in state_dict"],
        lambda: fresh.load_state_dict({"head.bias": full["head.bias"]}),
        r,
    )


def _write_inside_read_only(dm):
    with dm.gathered_parameters(modifier_rank=None):
        with torch.no_grad():
            dm.module.head.weight.mul_(2)


def check_load_saved_elsewhere():
    """A full state saved by a job of another size loads here."""
    hvd.init()
    dm, _ = sharded("adam", fusion_bytes=200)
    saved = torch.load(os.environ["ZERO3_CKPT"])
    dm.load_state_dict(saved)
    for k, v in dm.state_dict().items():
        torch.testing.assert_close(v, saved[k], rtol=0, atol=0, msg=k)
    # Every rank's shards from the 2-rank job (buckets of another fusion_bytes are refused).
    every = torch.load(os.environ["ZERO3_CKPT"] + ".shards")
    expect(ValueError, ["other buckets"], lambda: dm.load_state_dict(every), hvd.rank())
    same, _ = sharded("adam", fusion_bytes=96)
    same.load_state_dict(every)
    for k, v in same.state_dict().items():
        torch.testing.assert_close(v, saved[k], rtol=0, atol=0, msg=k)


class UsesWeightOutside(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Linear(4, 4, bias=False)
        self.head = torch.nn.Linear(4, 4)

    def forward(self, x):
        return F.linear(self.head(self.emb(x)), self.emb.weight)  # emb's weight outside emb's forward


def check_errors():
    hvd.init()
    r = hvd.rank()

    def opt_of(net, **kw):
        return hvd.DistributedOptimizer(
            torch.optim.SGD(trainable(net), lr=0.1),
            named_parameters=net.named_parameters(),
            **kw,
        )

    expect(ValueError, ["shard=3 gathers"], lambda: opt_of(torch.nn.Linear(2, 2), shard=3), r)
    expect(
        ValueError,
        ["PowerSGD"],
        lambda: opt_of(
            hvd.DistributedModel(torch.nn.Linear(2, 2)), shard=3, compression=hvd.Compression.powersgd(rank=1)
        ),
        r,
    )
    expect(
        ValueError, ["Adasum"], lambda: opt_of(hvd.DistributedModel(torch.nn.Linear(2, 2)), shard=3, op=hvd.Adasum), r
    )
    expect(
        ValueError,
        ["overlap_gathers"],
        lambda: opt_of(hvd.DistributedModel(torch.nn.Linear(2, 2)), shard=3, overlap_gathers=True),
        r,
    )
    # shard=3's options are refused elsewhere, not ignored.
    only3 = ["reshard_after_forward, keep_gathered_below, share_gathered and secondary_copy apply to shard=3 only"]
    expect(ValueError, only3, lambda: opt_of(torch.nn.Linear(2, 2), reshard_after_forward=False), r)
    expect(ValueError, only3, lambda: opt_of(torch.nn.Linear(2, 2), keep_gathered_below=0), r)
    expect(ValueError, only3, lambda: opt_of(torch.nn.Linear(2, 2), shard=2, reshard_after_forward=False), r)
    expect(ValueError, only3, lambda: opt_of(torch.nn.Linear(2, 2), shard=1, keep_gathered_below=1 << 20), r)
    expect(ValueError, only3, lambda: opt_of(torch.nn.Linear(2, 2), shard=2, share_gathered=False), r)
    expect(ValueError, only3, lambda: opt_of(torch.nn.Linear(2, 2), shard=1, secondary_copy=True), r)
    expect(ValueError, only3, lambda: opt_of(torch.nn.Linear(2, 2), secondary_copy=True), r)
    # A weight written in place in forward (Embedding's max_norm renormalizes its rows) would be lost with the
    # gathered copy, where one process keeps it: refused by name.
    for keep in ({}, {"keep_gathered_below": 0}):  # found at the end of the forward (kept), or at the free
        torch.manual_seed(0)
        emb = torch.nn.Sequential(torch.nn.Embedding(10, 4, max_norm=0.5), torch.nn.Flatten(), torch.nn.Linear(8, 2))
        emb_dm = hvd.DistributedModel(emb.double())
        emb_opt = hvd.DistributedOptimizer(  # noqa: F841 (kept: it holds the parameters sharded)
            torch.optim.SGD(emb_dm.parameters(), lr=0.1),
            named_parameters=emb_dm.named_parameters(),
            shard=3,
            model=emb_dm,
            **keep,
        )
        words = ["0.weight", "written in place while gathered", "gathered_parameters"]
        expect(RuntimeError, words, lambda: emb_dm(torch.tensor([[1, 2]])), r)
    # What a shard=3 model's state dicts cannot honour is refused, not ignored.
    dm, _ = sharded("sgd")
    expect(ValueError, ["prefix= and to= only", "keep_vars"], lambda: dm.state_dict(keep_vars=True), r)
    expect(ValueError, ["positional arguments"], lambda: dm.state_dict({}), r)
    expect(ValueError, ["assign=True"], lambda: dm.load_state_dict(dm.state_dict(), assign=True), r)
    expect(RuntimeError, ["cannot be copied", "gathered_parameters"], lambda: copy.deepcopy(dm), r)
    plain = hvd.DistributedModel(torch.nn.Linear(2, 2))
    expect(ValueError, ["state_dict(to=...) is for shard=3"], lambda: plain.state_dict(to=0), r)
    dm = hvd.DistributedModel(torch.nn.Linear(2, 2))
    stray = torch.nn.Parameter(torch.zeros(3))
    expect(
        ValueError,
        ["not a parameter of the model"],
        lambda: hvd.DistributedOptimizer(torch.optim.SGD(list(dm.parameters()) + [stray], lr=0.1), shard=3, model=dm),
        r,
    )
    # A parameter used outside its module's forward is named, with the fix.
    dm = hvd.DistributedModel(UsesWeightOutside().double())
    opt_of(dm, shard=3, model=dm, keep_gathered_below=0, fusion_bytes=0)
    expect(RuntimeError, ["reshard_after_forward=False"], lambda: dm(torch.ones(2, 4, dtype=torch.float64)), r)
    dm = hvd.DistributedModel(UsesWeightOutside().double())
    opt = opt_of(dm, shard=3, model=dm, reshard_after_forward=False, keep_gathered_below=0, fusion_bytes=0)
    dm(torch.ones(2, 4, dtype=torch.float64)).sum().backward()
    opt.step()
    # A parameter no rank gives a gradient: a sharded step would still move it
    # (its flat shard is stepped whole), so every stage refuses it by name.
    for stage in (1, 2, 3):
        dm = hvd.DistributedModel(base_model())
        dm.module.block.use_rare = False
        opt = opt_of(dm, shard=stage, **({"model": dm} if stage == 3 else {}))
        dm(batch(0, hvd.size())[0][:2]).sum().backward()
        expect(
            RuntimeError,
            ["no gradient on any rank", "block.rare", f"shard={stage}", "requires_grad_(False)"],
            opt.step,
            r,
        )
    # A step() with no gradient on any rank moves nothing, as in one process
    # (Adam's moments would move every parameter).
    for stage in (1, 2, 3):
        dm = hvd.DistributedModel(base_model())
        opt = hvd.DistributedOptimizer(
            torch.optim.Adam(trainable(dm), lr=0.1),
            named_parameters=dm.named_parameters(),
            shard=stage,
            **({"model": dm} if stage == 3 else {}),
        )
        local_loss(dm, 0, r, hvd.size()).backward()
        opt.step()
        opt.zero_grad()
        before = {k: v.clone() for k, v in dm.state_dict().items()}
        opt.step()
        after = dm.state_dict()
        for k, v in before.items():
            torch.testing.assert_close(after[k], v, rtol=0, atol=0, msg=lambda m, k=k: f"shard={stage} {k}: {m}")
    # A write at rest that the stand-in takes without an error (zero_, fill_): refused at the next gather.
    dm, opt = sharded("sgd", fusion_bytes=96)
    with torch.no_grad():
        torch.nn.init.zeros_(dm.module.head.bias)
    expect(
        RuntimeError,
        ["head.bias']", "written while sharded", "gathered_parameters()"],
        lambda: local_loss(dm, 0, r, hvd.size()),
        r,
    )


def check_eval_and_inference():
    hvd.init()
    n = hvd.size()
    dm, opt, ref = train("adam", steps=1)
    x, _ = batch(9, n)
    dm.eval()
    ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(dm(x), ref(x), rtol=1e-9, atol=1e-12)
    with torch.inference_mode():
        torch.testing.assert_close(dm(x), ref(x), rtol=1e-9, atol=1e-12)
    assert all(f is None for f in opt._units._full)


def _elastic_state(commit_dir):
    dm, opt = sharded("adam", fusion_bytes=96)
    return dm, opt, hvd.elastic.TorchState(dm, opt, commit_dir=commit_dir)


def _step(dm, opt, s):
    n, r = hvd.size(), hvd.rank()
    opt.zero_grad()
    local_loss(dm, s, r, n).backward()
    opt.step()


def check_elastic(commit_dir, phase):
    """commit: train, commit, train on, restore() gives the commit back (in
    memory, sharded); then a job of another size loads the commit on rank 0
    and sync() hands every rank the committed model."""
    hvd.init()
    r = hvd.rank()
    dm, opt, state = _elastic_state(commit_dir)
    if phase == "commit":
        for s in range(2):
            _step(dm, opt, s)
        state.commit()
        committed = dm.state_dict()
        _step(dm, opt, 2)
        assert not torch.equal(dm.state_dict()["head.weight"], committed["head.weight"])
        state.restore()
        for k, v in committed.items():
            torch.testing.assert_close(dm.state_dict()[k], v, rtol=0, atol=0, msg=k)
        if r == 0:
            torch.save(committed, os.path.join(commit_dir, "expected.pt"))
        hvd.barrier()
        return
    if r == 0:
        assert state.load_last_commit()
    state.sync()
    expected = torch.load(os.path.join(commit_dir, "expected.pt"))
    for k, v in dm.state_dict().items():
        torch.testing.assert_close(v, expected[k], rtol=0, atol=0, msg=k)
    _step(dm, opt, 3)  # and trains on


def check_compiled_and_amp(mode):
    """torch.compile of the DistributedModel (graph breaks at the gathers),
    equal in float64 to the compiled one-process model; bfloat16 autocast
    within its precision."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    ref = base_model()
    ref_opt = make_opt("adam", trainable(ref))
    dm, opt = sharded("adam", ref, fusion_bytes=96, keep_gathered_below=200)
    forward, ref_forward = (torch.compile(dm), torch.compile(ref)) if mode == "compile" else (dm, ref)
    amp = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if mode == "amp" else contextlib.nullcontext
    for s in range(3):
        opt.zero_grad()
        with amp():
            loss = local_loss(forward, s, r, n)
        loss.backward()
        opt.step()
        ref_opt.zero_grad()
        with amp():
            ref_loss = global_loss(ref_forward, s, n)
        ref_loss.backward()
        ref_opt.step()
    assert_equal_to(dm, ref, mode, (1e-9, 1e-12) if mode == "compile" else (2e-2, 2e-3))


def check_join():
    """Uneven data with shard=3: each rank calls hvd.join() when its batches
    run out and goes on serving the others' gathers (replaying its last
    pass) and stepping its shards; training equals one process that
    averages, at every step, what the ranks with data contribute (over
    every rank, as Horovod's Average does)."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()

    def steps_of(k):
        return n + 1 - k  # distinct, the most on rank 0, every rank at least two

    for kind, kw in (("sgd", {}), ("adam", {"keep_gathered_below": 200}), ("adam", {"reshard_after_forward": False})):
        base = base_model()
        ref = copy.deepcopy(base)
        ref_opt = make_opt(kind, trainable(ref))
        for s in range(steps_of(0)):
            has = [k for k in range(n) if steps_of(k) > s]
            ref_opt.zero_grad()
            (sum(local_loss(ref, s, k, n) for k in has) / n).backward()
            ref_opt.step()
        dm, opt = sharded(kind, base, fusion_bytes=96, **dict({"keep_gathered_below": 0}, **kw))
        for s in range(steps_of(r)):
            opt.zero_grad()
            local_loss(dm, s, r, n).backward()
            opt.step()
        assert hvd.join() == 0
        assert_equal_to(dm, ref, f"rank {r}: join {kind} {kw}")


def check_process_set():
    """shard=3 over a process set of ranks 0 and 2 (the DistributedModel's):
    the members train like one process on their global batch."""
    hvd.init()
    r = hvd.rank()
    pair = hvd.add_process_set([0, 2])
    if r != 1:
        ref = base_model()
        ref_opt = make_opt("sgd", trainable(ref))
        dm, opt = sharded("sgd", ref, {"process_set": pair}, fusion_bytes=96, keep_gathered_below=0)
        k = pair.rank()
        for s in range(2):
            opt.zero_grad()
            local_loss(dm, s, k, 2).backward()
            opt.step()
            ref_opt.zero_grad()
            global_loss(ref, s, 2).backward()
            ref_opt.step()
        assert_equal_to(dm, ref, "process set [0, 2]")
    hvd.barrier()
    hvd.remove_process_set(pair)


# ---- built on the meta device (hvdtorch/zero/meta_init.py) ---------------------------------------------


def _init_like_building(materialized):
    """A param_init_fn that gives Net's modules the values building Net
    gives them, in the same order of random draws; records, at each call,
    which trainable parameters hold full values (``materialized``)."""

    def init(m):
        full = {
            n
            for n, p in m.root.named_parameters()
            if p.requires_grad and not p.is_meta and p.stride() != (0,) * p.dim()  # neither meta nor a stand-in
        }
        materialized.append((type(m).__name__, full))
        if isinstance(m, Block):
            m.scale.copy_(torch.linspace(0.5, 1.5, D))
            m.rare.copy_(torch.randn(3))
        elif isinstance(m, Net):
            m.frozen.fill_(1.0)
        else:
            m.reset_parameters()

    return init


class Attention(torch.nn.Module):
    """torch's layers only, each initialized by its own reset: a
    MultiheadAttention (whose init zeroes its child out_proj's bias), a
    BatchNorm (buffers) and an Embedding with a padding row."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(11, 8, padding_idx=0)
        self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        self.norm = torch.nn.BatchNorm1d(8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, tokens):
        h = self.emb(tokens)
        h, _ = self.attn(h, h, h, need_weights=False)
        return self.head(self.norm(h.mean(1)))


def _on_meta(build):
    with torch.device("meta"):
        return build()


def check_built_on_meta():
    """A model built on the meta device: shard=3 makes each rank's shards
    module by module, with the values building the model gives (the same
    seed), holding one module's full parameters at a time; training equals
    one process on the model built normally. Misuse raises, naming the fix."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()

    # Built in float64 throughout (not built in float32 and converted: an init draws other numbers in float64).
    torch.set_default_dtype(torch.float64)
    # Net: modules without an init of their own (Block, the root) through param_init_fn.
    net = _on_meta(Net)
    for _, m in net.named_modules():
        m.root = net  # what _init_like_building reads the parameters through
    materialized = []
    dm = hvd.DistributedModel(net)
    # Rank 0 draws what building draws below; the others draw otherwise: rank 0's values are broadcast.
    torch.manual_seed(0 if r == 0 else 100 + r)
    opt = hvd.DistributedOptimizer(
        make_opt("adam", trainable(dm)),
        named_parameters=dm.named_parameters(),
        shard=3,
        model=dm,
        fusion_bytes=96,
        keep_gathered_below=0,
        param_init_fn=_init_like_building(materialized),
    )
    for _, m in net.named_modules():
        del m.root
    torch.manual_seed(0)
    ref = Net()
    assert_equal_to(dm, ref, f"rank {r}: Net built on meta, before training", tol=(0, 0))
    # At each init, only the module's own parameters (and the tied one it writes scratch for) hold values.
    for module, full in materialized:
        assert len(full) <= 2, f"rank {r}: {len(full)} parameters materialized at {module}'s init: {sorted(full)}"
    step_beside_reference(dm, opt, ref, 3, r, n)
    assert_equal_to(dm, ref, f"rank {r}: Net built on meta, trained")

    # torch's layers by their own resets: the values of building them with the same seed.
    attn = _on_meta(Attention)
    dm = hvd.DistributedModel(attn)
    torch.manual_seed(5)
    opt = hvd.DistributedOptimizer(make_opt("sgd", trainable(dm)), shard=3, model=dm, fusion_bytes=600)
    torch.manual_seed(5)
    ref = Attention()
    assert_equal_to(dm, ref, f"rank {r}: Attention built on meta", tol=(0, 0))
    assert float(ref.attn.out_proj.bias.abs().sum()) == 0.0  # MultiheadAttention's own init ran last
    ref_opt = make_opt("sgd", trainable(ref))
    tokens = torch.randint(1, 11, (2 * n, 5), generator=torch.Generator().manual_seed(3))
    for _ in range(2):
        opt.zero_grad()
        dm(tokens[2 * r : 2 * r + 2]).pow(2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        sum(ref(tokens[2 * k : 2 * k + 2]).pow(2).mean() for k in range(n)).div(n).backward()
        ref_opt.step()
    # The parameters (BatchNorm's running statistics follow each rank's batches, as under DDP).
    full = dm.state_dict()
    for k, v in ref.named_parameters():
        torch.testing.assert_close(full[k], v, rtol=1e-9, atol=1e-10, msg=lambda m, k=k: f"rank {r}: trained {k}: {m}")
    torch.set_default_dtype(torch.float32)

    def opt_over(model, **kw):
        return hvd.DistributedOptimizer(torch.optim.SGD(trainable(model), lr=0.1), model=model, **kw)

    # init_sync=False: nothing is broadcast, each rank shards its own inits' values, as for a model built whole.
    def small():
        return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))

    got = {}
    for how in ("built", "meta"):
        torch.manual_seed(10 + r)
        net = small() if how == "built" else _on_meta(small)
        dm = hvd.DistributedModel(net, init_sync=False)
        torch.manual_seed(10 + r)
        opt_over(dm, shard=3, fusion_bytes=96)
        got[how] = dm.state_dict()
    torch.manual_seed(10)
    first = small().state_dict()
    for k, v in got["built"].items():
        torch.testing.assert_close(got["meta"][k], v, rtol=0, atol=0, msg=lambda m, k=k: f"init_sync=False {k}: {m}")
    if n > 1:
        assert any(not torch.equal(got["meta"][k], v) for k, v in first.items()), "rank 0's values were broadcast"

    # Block has tensors of its own and no reset_parameters().
    expect(
        ValueError,
        ["module 'block' (Block)", "['scale', 'rare']", "param_init_fn="],
        lambda: opt_over(hvd.DistributedModel(_on_meta(Net)), shard=3),
        r,
    )

    # An init that leaves a tensor as materialized.
    def forgets_rare(m):
        if isinstance(m, Block):
            m.scale.fill_(1.0)
        elif isinstance(m, Net):
            m.frozen.fill_(1.0)
        else:
            m.reset_parameters()

    expect(
        ValueError,
        ["module 'block' (Block)", "'rare'", "uninitialized"],
        lambda: opt_over(hvd.DistributedModel(_on_meta(Net)), shard=3, param_init_fn=forgets_rare),
        r,
    )

    # A param_init_fn that writes a parameter of a module inside its module (sharded already).
    def writes_inside(m):
        if isinstance(m, torch.nn.Sequential):
            m[0].weight.fill_(0.5)
        else:
            m.reset_parameters()

    # A parameter of its own, built on the meta device: the Sequential's init runs after its children's.
    def wide():
        seq = _on_meta(lambda: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)))
        seq.register_parameter("scale", torch.nn.Parameter(torch.empty(2, device="meta")))
        return hvd.DistributedModel(seq)

    # fill_ on a stand-in does not raise: its version tells.
    expect(
        RuntimeError,
        ["module 'the root module' (Sequential)", "its init wrote ['0.weight']", "own parameters and buffers only"],
        lambda: opt_over(wide(), shard=3, param_init_fn=writes_inside),
        r,
    )

    def copies_inside(m):
        if isinstance(m, torch.nn.Sequential):
            m[0].weight.copy_(torch.ones(4, 4))
        else:
            m.reset_parameters()

    # copy_ into a stand-in raises (its elements share one).
    expect(
        RuntimeError,
        ["module 'the root module' (Sequential)", "its init failed", "own parameters and buffers only"],
        lambda: opt_over(wide(), shard=3, param_init_fn=copies_inside),
        r,
    )

    # The other routes, and a forward before the optimizer, say what to do.
    meta_dm = hvd.DistributedModel(_on_meta(lambda: torch.nn.Linear(3, 2)))
    expect(ValueError, ["built on the meta device", "shard=3"], lambda: meta_dm(torch.ones(1, 3)), r)
    expect(ValueError, ["meta device", "to_empty"], lambda: opt_over(meta_dm, shard=2), r)
    expect(ValueError, ["meta device", "to_empty"], lambda: opt_over(meta_dm), r)
    expect(
        ValueError,
        ["init_device and param_init_fn apply to"],
        lambda: opt_over(hvd.DistributedModel(torch.nn.Linear(3, 2)), shard=3, init_device="cpu"),
        r,
    )
    hvd.shutdown()


# ---- edges: a set without rank 0, strict loads, state inside gathered_parameters(), join while evaluating,
# ---- gradient buckets released in backward --------------------------------------------------------------


def check_gathered_parameters_in_a_set():
    """gathered_parameters(modifier_rank=k) in the job's set (run_ranks'
    process_set=[1, 2]: no rank 0): every member takes the values of the
    set's k-th rank (global rank ps.ranks[k]), not global rank k's; the
    frozen parameter (not sharded) too. Before that, training in the set
    equals one process."""
    hvd.init()
    ps = job_process_set()
    g = hvd.rank()
    if g in ps.ranks:
        dm, _, _ = train("sgd", steps=2, dm_kw={"process_set": ps})
        for k in reversed(range(ps.size())):  # modifier_rank=1 first: global rank 2, not 1
            with dm.gathered_parameters(modifier_rank=k):
                with torch.no_grad():
                    dm.module.head.bias.fill_(float(g))  # sharded
                    dm.module.frozen.fill_(float(g))  # not sharded: taken from the modifier too
            full = dm.state_dict()
            want = float(ps.ranks[k])
            for key in ("head.bias", "frozen"):
                assert bool((full[key] == want).all()), f"rank {g}: modifier_rank={k}: {key} = {full[key]}"
        expect(
            ValueError,
            [f"modifier_rank={ps.size()}", f"0..{ps.size() - 1}"],
            lambda: dm.gathered_parameters(modifier_rank=ps.size()).__enter__(),
            g,
        )
    hvd.barrier()


def check_built_on_meta_in_a_set():
    """A model built on the meta device, over the job's set (process_set=
    [1, 2]): the values are the set's first rank's (it draws what building
    draws, the other member otherwise), and training equals one process.
    Frozen parameters (requires_grad=False: Net's, and a backbone frozen in
    its __init__) come out of the materialization frozen, with their
    values, and stay so through training."""
    hvd.init()
    ps = job_process_set()
    g = hvd.rank()
    if g in ps.ranks:
        k, n = ps.rank(), ps.size()
        torch.set_default_dtype(torch.float64)
        try:
            net = _on_meta(Net)
            for _, m in net.named_modules():
                m.root = net
            dm = hvd.DistributedModel(net, process_set=ps)
            torch.manual_seed(0 if k == 0 else 100 + g)
            opt = hvd.DistributedOptimizer(
                make_opt("adam", trainable(dm)),
                named_parameters=dm.named_parameters(),
                shard=3,
                model=dm,
                fusion_bytes=96,
                keep_gathered_below=0,
                param_init_fn=_init_like_building([]),
            )
            for _, m in net.named_modules():
                del m.root
            torch.manual_seed(0)
            ref = Net()
            assert_equal_to(dm, ref, f"rank {g}: Net built on meta in {ps.ranks}", tol=(0, 0))
            assert not dm.module.frozen.requires_grad, "Net's frozen parameter requires grad"
            step_beside_reference(dm, opt, ref, 2, k, n)
            assert_equal_to(dm, ref, f"rank {g}: Net built on meta in {ps.ranks}, trained")
            assert not dm.module.frozen.requires_grad and dm.module.frozen.grad is None

            def backbone():
                seq = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
                seq[0].requires_grad_(False)
                return seq

            dm = hvd.DistributedModel(_on_meta(backbone), process_set=ps)
            torch.manual_seed(3 if k == 0 else 50 + g)
            opt = hvd.DistributedOptimizer(torch.optim.SGD(trainable(dm), lr=0.1), shard=3, model=dm, fusion_bytes=96)
            torch.manual_seed(3)
            ref = backbone()
            assert_equal_to(dm, ref, f"rank {g}: frozen backbone built on meta in {ps.ranks}", tol=(0, 0))
            frozen = dm.module[0]
            assert [p.requires_grad for p in frozen.parameters()] == [False, False], "materialized unfrozen"
            ref_opt = torch.optim.SGD(trainable(ref), lr=0.1)
            x = torch.randn(2 * n, 5, generator=torch.Generator().manual_seed(4))
            for _ in range(2):
                opt.zero_grad()
                dm(x[2 * k : 2 * k + 2]).pow(2).mean().backward()
                opt.step()
                ref_opt.zero_grad()
                sum(ref(x[2 * q : 2 * q + 2]).pow(2).mean() for q in range(n)).div(n).backward()
                ref_opt.step()
            assert [p.requires_grad for p in frozen.parameters()] == [False, False], "unfrozen by training"
            assert all(p.grad is None for p in frozen.parameters()), "a frozen parameter got a gradient"
            assert_equal_to(dm, ref, f"rank {g}: frozen backbone built on meta in {ps.ranks}, trained")
            torch.manual_seed(3)
            torch.testing.assert_close(dm.module[0].weight, backbone()[0].weight, rtol=0, atol=0)  # unchanged
        finally:
            torch.set_default_dtype(torch.float32)
    hvd.barrier()


def check_strict_loading():
    """load_state_dict() of a shard=3 model refuses what torch's refuses, in
    torch's words (the same message as a plain model's): with strict=True
    a checkpoint of another model (missing and unexpected keys) and one with
    a key too many; with either, a tensor of the same number of elements in
    another shape ("size mismatch", never reshaped: the parameter keeps its
    value). strict=False returns the keys torch returns and loads the rest."""
    hvd.init()
    r = hvd.rank()
    dm, _ = sharded("sgd")
    full = dm.state_dict()
    plain = base_model()
    plain.load_state_dict(full)

    def torch_says(sd, strict=True):
        try:
            copy.deepcopy(plain).load_state_dict(sd, strict=strict)
        except RuntimeError as e:
            return str(e)
        raise AssertionError("a plain model loads it")

    other = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3)).double().state_dict()
    extra = dict(full, **{"extra.weight": torch.ones(2, dtype=torch.float64)})
    for sd, words in ((other, ["Missing key(s)", '"inp.weight"', "Unexpected key(s)", '"0.weight"']), (extra, [])):
        msg = expect(RuntimeError, ["Unexpected key(s) in state_dict", *words], lambda sd=sd: dm.load_state_dict(sd), r)
        assert msg == torch_says(sd), f"rank {r}: shard=3 says\n{msg}\ntorch says\n{torch_says(sd)}"
    # strict=False: what torch returns, and what matches is loaded.
    partial = {"head.bias": torch.full((3,), 4.0, dtype=torch.float64), "junk": torch.zeros(1)}
    got = dm.load_state_dict(partial, strict=False)
    want = copy.deepcopy(plain).load_state_dict(partial, strict=False)
    assert (got.missing_keys, got.unexpected_keys) == (want.missing_keys, want.unexpected_keys), (got, want)
    assert bool((dm.state_dict()["head.bias"] == 4.0).all())
    got = dm.load_state_dict(extra, strict=False)
    assert (got.missing_keys, got.unexpected_keys) == ([], ["extra.weight"]), got
    # head.weight is [3, 7]; a [7, 3] tensor has as many elements.
    bad = dict(full, **{"head.weight": torch.arange(21, dtype=torch.float64).reshape(7, 3)})
    for strict in (True, False):
        msg = expect(
            RuntimeError,
            ["size mismatch for head.weight", "torch.Size([7, 3])", "torch.Size([3, 7])"],
            lambda strict=strict: dm.load_state_dict(bad, strict=strict),
            r,
        )
        assert msg == torch_says(bad, strict), f"rank {r}: shard=3 says\n{msg}\ntorch says\n{torch_says(bad, strict)}"
        torch.testing.assert_close(dm.state_dict()["head.weight"], full["head.weight"], rtol=0, atol=0)


def check_module_state_inside_gathered_parameters():
    """Inside `with model.gathered_parameters():` (where the refusals of the
    module's own state dicts send the user) the module's state_dict() and
    load_state_dict() work as on a plain module; a load there with
    modifier_rank=k (each rank loading its own, or the modifier alone) is
    what every rank holds after: parameters, frozen ones and buffers."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    dm, opt, ref = train("sgd", steps=1)
    full = dm.state_dict()
    with dm.gathered_parameters(modifier_rank=None):
        inside = {k: v.clone() for k, v in dm.module.state_dict().items()}
        block = dm.module.block.state_dict()
        assert sorted(block) == ["lin.bias", "lin.weight", "rare", "scale"], sorted(block)
        torch.testing.assert_close(block["lin.weight"], full["block.lin.weight"], rtol=0, atol=0)
    assert list(inside) == list(full), (list(inside), list(full))
    for k, v in full.items():
        torch.testing.assert_close(inside[k], v, rtol=0, atol=0, msg=k)
    modifier = n - 1
    own = {k: v + (1 + r) for k, v in full.items()}  # each rank loads values of its own
    with dm.gathered_parameters(modifier_rank=modifier):
        dm.module.load_state_dict(own)
        torch.testing.assert_close(dm.module.head.weight, own["head.weight"], rtol=0, atol=0)
    after = dm.state_dict()
    for k, v in full.items():
        torch.testing.assert_close(
            after[k], v + (1 + modifier), rtol=0, atol=0, msg=lambda m, k=k: f"rank {r}: {k}: {m}"
        )
    # Training goes on from the modifier's load, equal to one process (with the optimizer's state so far).
    ref.load_state_dict(after)
    ref_opt = make_opt("sgd", trainable(ref))
    ref_opt.load_state_dict(opt.consolidate_state_dict(to=None))
    opt.zero_grad()
    local_loss(dm, 4, r, n).backward()
    opt.step()
    ref_opt.zero_grad()
    global_loss(ref, 4, n).backward()
    ref_opt.step()
    assert_equal_to(dm, ref, f"rank {r}: after a load inside gathered_parameters()")
    # The modifier alone loads (the others read no file); a model with buffers (BatchNorm's statistics).
    torch.manual_seed(1)
    attn = hvd.DistributedModel(Attention().double())
    _kept = hvd.DistributedOptimizer(torch.optim.SGD(trainable(attn), lr=0.1), shard=3, model=attn, fusion_bytes=600)
    saved = {k: v + 1 for k, v in attn.state_dict().items()}
    with attn.gathered_parameters(modifier_rank=0):
        if r == 0:
            attn.module.load_state_dict(saved)
    for k, v in attn.state_dict().items():
        torch.testing.assert_close(v, saved[k], rtol=0, atol=0, msg=lambda m, k=k: f"rank {r}: {k}: {m}")


def check_sharded_states_in_any_order():
    """load_state_dict() of the list of every rank's sharded_state_dict() in
    any order (files globbed as shard-10, shard-2): the same model, into
    the model that saved them and into a fresh one."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    dm, opt, _ = train("sgd", steps=1)
    full = dm.state_dict()
    every = hvd.allgather_object(dm.sharded_state_dict())
    orders = [list(reversed(range(n))), list(range(1, n)) + [0]]
    for order in orders:
        opt.zero_grad()
        local_loss(dm, 6, r, n).backward()
        opt.step()
        assert not torch.equal(dm.state_dict()["head.weight"], full["head.weight"])
        dm.load_state_dict([every[k] for k in order])
        for k, v in dm.state_dict().items():
            torch.testing.assert_close(v, full[k], rtol=0, atol=0, msg=lambda m, k=k: f"order {order}: {k}: {m}")
    fresh, _ = sharded("sgd", fusion_bytes=96)  # train()'s buckets
    fresh.load_state_dict([every[k] for k in orders[0]])
    for k, v in fresh.state_dict().items():
        torch.testing.assert_close(v, full[k], rtol=0, atol=0, msg=k)


def check_join_while_evaluating():
    """hvd.join() while the others evaluate: a joined rank replays its last
    pass without autograd for each forward of theirs without it (never a
    training pass), and its last pass with autograd for a training one.
    The pass without autograd a rank ran last before join() counts (it is
    recorded when its forward ends), and a forward inside
    gathered_parameters() after it is no pass (it gathers nothing). Every
    evaluation equals one process's, and training one process averaging
    what the ranks with data contribute over every rank."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    x = batch(50, n)[0]
    for pinned in (False, True):
        # The reference's trajectory, on every rank: a step of every rank, then one of rank 0 alone.
        base = base_model()
        ref = copy.deepcopy(base)
        ref_opt = make_opt("sgd", trainable(ref))
        evals = []
        ref_opt.zero_grad()
        global_loss(ref, 0, n).backward()
        ref_opt.step()
        with torch.no_grad():
            evals.append(ref(x))
        ref_opt.zero_grad()
        (local_loss(ref, 1, 0, n) / n).backward()
        ref_opt.step()
        with torch.no_grad():
            evals.append(ref(x))

        dm, opt = sharded("sgd", base, fusion_bytes=96, keep_gathered_below=0)
        replayed = []
        replay = opt._units.replay

        def recorded(grad_enabled, replay=replay, replayed=replayed):
            replayed.append(bool(grad_enabled))
            return replay(grad_enabled)

        opt._units.replay = recorded
        opt.zero_grad()
        local_loss(dm, 0, r, n).backward()
        opt.step()
        with torch.no_grad():
            torch.testing.assert_close(dm(x), evals[0], rtol=1e-9, atol=1e-12)
        if pinned:
            with dm.gathered_parameters(modifier_rank=None), torch.no_grad():
                torch.testing.assert_close(dm(x), evals[0], rtol=1e-9, atol=1e-12)
        if r == 0:
            for _ in range(2):
                with torch.no_grad():
                    torch.testing.assert_close(dm(x), evals[0], rtol=1e-9, atol=1e-12)
            opt.zero_grad()
            local_loss(dm, 1, 0, n).backward()
            opt.step()
            with torch.no_grad():
                torch.testing.assert_close(dm(x), evals[1], rtol=1e-9, atol=1e-12)
        assert hvd.join() == 0
        assert replayed == ([] if r == 0 else [False, False, True, False]), f"rank {r}: replayed {replayed}"
        assert_equal_to(dm, ref, f"rank {r}: join while evaluating (pinned={pinned})")


def check_gradient_buckets_released_in_backward():
    """shard=3's gradient buckets during backward: a bucket whose
    reduce-scatter has finished is released at the next bucket's launch,
    in backward, not kept until synchronize(). Four layers, a bucket each;
    once the first layer's gradients come (the last bucket to launch),
    every earlier reduce-scatter is made to have finished (two all-reduces
    after it: the executor runs each cycle's ops in order, and the second
    is negotiated after the first's cycle); after backward only the last
    bucket launched is left. Training equals one process."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(4)]).double()
    ref = copy.deepcopy(net)
    dm = hvd.DistributedModel(net)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(dm.parameters(), lr=0.1), shard=3, model=dm, fusion_bytes=600, keep_gathered_below=0
    )
    assert len(opt._buckets) == 4, [b.params for b in opt._buckets]
    index = {id(p): i for i, p in enumerate(opt._all_params)}
    first = next(j for j, b in enumerate(opt._buckets) if index[id(net[0].weight)] in b.params)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x = torch.randn(2 * n, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def live():
        return [j for j, f in enumerate(opt._grads._flats) if f is not None]

    for step in range(2):
        seen = {}

        def settle(_p, step=step, seen=seen):
            if seen:
                return
            for k in range(2):
                hvd.allreduce(torch.zeros(1), name=f"settle.{step}.{k}")
            seen["live"] = live()

        hooks = [p.register_post_accumulate_grad_hook(settle) for p in net[0].parameters()]
        opt.zero_grad()
        dm(x[2 * r : 2 * r + 2]).pow(2).sum().backward()
        for h in hooks:
            h.remove()
        assert seen["live"] and first not in seen["live"], f"rank {r}: before the last launch: {seen['live']}"
        assert live() == [first], (
            f"rank {r}: step {step}: buckets {live()} hold gradient buffers after backward (finished before the "
            f"launch of bucket {first}, which alone may be left)"
        )
        opt.step()
        assert live() == [], live()
        ref_opt.zero_grad()
        sum(ref(x[2 * k : 2 * k + 2]).pow(2).sum() for k in range(n)).div(n).backward()
        ref_opt.step()
    assert_equal_to(dm, ref, f"rank {r}: released buckets")
