"""hvd.MixedPrecisionPolicy against FSDP2's MixedPrecisionPolicy on the
same GPT and data (tests/test_mixed_precision.py).

Each route trains STEPS iterations of ACCUM micro-steps (the last one
synchronized) with AdamW and the policy param_dtype=bfloat16,
reduce_dtype=float32, and records the losses (averaged over the ranks),
every rank's parameters after training (full precision) and what each
forward computed with:
  fsdp2    torch.distributed.fsdp.fully_shard on every block, then on the
           root, with FSDP2's policy; set_requires_gradient_sync(False) for
           the micro-steps but the last
  dm       hvd.DistributedModel(net, mixed_precision=policy)
  shard2   the same with DistributedOptimizer(shard=2)
  shard3   the same with DistributedOptimizer(shard=3, keep_gathered_below=0)
           (one gathered copy per host, in shared memory); shard3-own with
           share_gathered=False (one gathered copy per rank); shard3-kept
           with the default keep_gathered_below (this GPT's buckets are
           all small: gathered together, kept until the step)
  dm-bf16  reduce_dtype None: gradients reduced in bfloat16 (the codec)
"""

import torch

import hvdtorch as hvd
from benchmarks.workloads.gpt import GPT, SIZES, optimizer_groups, token_batches
from hvdtorch.collectives import ops

STEPS = 6
ACCUM = 2
BATCH = 4
CONFIG = SIZES["test"]


def _policy(route: str):
    if route == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    reduce = None if route == "dm-bf16" else torch.float32
    return hvd.MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce)


def _build(route: str):
    torch.manual_seed(0)
    net = GPT(CONFIG)
    if route == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in net.transformer.h:
            fully_shard(block, mp_policy=_policy(route))
        model = fully_shard(net, mp_policy=_policy(route))
        opt = torch.optim.AdamW(optimizer_groups(net, 0.1), lr=3e-3)
        return net, model, opt
    model = hvd.DistributedModel(net, mixed_precision=_policy(route), name=f"mp.{route}")
    opt = torch.optim.AdamW(optimizer_groups(net, 0.1), lr=3e-3)
    if route.startswith("shard"):
        kw = {"shard3": {"keep_gathered_below": 0}, "shard3-own": {"share_gathered": False, "keep_gathered_below": 0}}
        opt = hvd.DistributedOptimizer(opt, shard=int(route[5]), **kw.get(route, {}))
    return net, model, opt


def train(out: str, route: str) -> None:
    hvd.init()
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    net, model, opt = _build(route)
    computed = set()  # dtypes the Linear layers computed with
    net.transformer.h[0].mlp.c_fc.register_forward_pre_hook(lambda m, _: computed.add(m.weight.dtype))
    gathered = []  # dtypes of the tensors shard=3 all-gathers (its own gathers; the small buckets' grouped one)
    start, start_grouped = ops.allgather_async, ops.grouped_allgather_async

    def recording(tensor, name=None, process_set=None):
        gathered.append(tensor.dtype)
        return start(tensor, name=name, process_set=process_set)

    def recording_grouped(tensors, name=None, process_set=None):
        gathered.extend(t.dtype for t in tensors)
        return start_grouped(tensors, name=name, process_set=process_set)

    ops.allgather_async, ops.grouped_allgather_async = recording, recording_grouped
    losses = []
    try:
        for step in range(STEPS):
            total = 0.0
            for micro in range(ACCUM):
                last = micro == ACCUM - 1
                if route == "fsdp2":
                    model.set_requires_gradient_sync(last)
                else:
                    model.require_backward_grad_sync = last
                x, y = token_batches(CONFIG, BATCH * size, 3, step * ACCUM + micro)
                _, loss = model(x[rank * BATCH : (rank + 1) * BATCH], y[rank * BATCH : (rank + 1) * BATCH])
                (loss / ACCUM).backward()
                total += float(loss) / ACCUM
            opt.step()
            opt.zero_grad()
            losses.append(float(hvd.allreduce(torch.tensor(total), name=f"mp.loss.{route}.{step}")))
    finally:
        ops.allgather_async, ops.grouped_allgather_async = start, start_grouped
    if route == "fsdp2":
        params = {n: p.full_tensor().detach().clone() for n, p in net.named_parameters()}
    elif route.startswith("shard3"):
        params = model.state_dict()
        params = {n: params[n] for n, _ in net.named_parameters()}
    else:
        params = {n: p.detach().clone() for n, p in net.named_parameters()}
    dtypes = {n: p.dtype for n, p in params.items()}
    result = {
        "losses": losses,
        "params": params,
        "param_dtypes": dtypes,
        "computed": sorted(str(d) for d in computed),
        "gathered": sorted({str(d) for d in gathered}),
    }
    everyone = hvd.allgather_object(result, name=f"mp.results.{route}")
    if rank == 0:
        torch.save(everyone, f"{out}/{route}.pt")


def refusals() -> None:
    """What the policy refuses, each naming what is wrong."""
    hvd.init()

    def expect(fn, *words):
        try:
            fn()
        except (TypeError, ValueError) as e:
            text = str(e)
            assert text.startswith("hvdtorch:") and all(w in text for w in words), text
        else:
            raise AssertionError(f"accepted: {words}")

    expect(lambda: hvd.MixedPrecisionPolicy(param_dtype=torch.int8), "param_dtype")
    expect(lambda: hvd.MixedPrecisionPolicy(reduce_dtype=torch.float8_e4m3fn), "reduce")
    net = torch.nn.Linear(4, 4)
    expect(lambda: hvd.DistributedModel(net, mixed_precision="bf16"), "mixed_precision", "MixedPrecisionPolicy")
    expect(
        lambda: hvd.DistributedModel(
            net, mixed_precision=hvd.MixedPrecisionPolicy(param_dtype=torch.bfloat16), compression=hvd.Compression.fp16
        ),
        "compression",
    )
    # DDP's _MixedPrecision: its buffer_dtype casts the buffers at the wrap.
    from torch.nn.parallel.distributed import _MixedPrecision

    bn = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    hvd.DistributedModel(bn, mixed_precision=_MixedPrecision(param_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16))
    assert bn[1].running_mean.dtype == torch.bfloat16, bn[1].running_mean.dtype
    assert bn[0].weight.dtype == torch.float32


def reduce_dtype_on_the_wire() -> None:
    """reduce_dtype=bfloat16 (parameters and gradients float32) reduces in
    bfloat16 itself, float16 in float16: its range, its rounding. Each rank's
    gradient of the weight is its input: [1e6 (rank 0) or 3e6 (rank 1),
    1 + 2**-10]. bfloat16 carries 2e6 (float16's largest is 65504: inf) and
    rounds 1 + 2**-10 to 1 (8 bits of mantissa; float16's 11 keep it);
    float16 keeps 1 + 2**-10 and, with inputs in its range, is exact there."""
    hvd.init()
    r = hvd.rank()
    for dtype, big, small in ((torch.bfloat16, (1e6, 3e6), 1.0), (torch.float16, (1e3, 3e3), 1 + 2**-10)):
        net = torch.nn.Linear(2, 1, bias=False)
        model = hvd.DistributedModel(
            net, mixed_precision=hvd.MixedPrecisionPolicy(reduce_dtype=dtype), name=f"wire.{str(dtype)[6:]}"
        )
        x = torch.tensor([[big[r], 1 + 2**-10]])
        model(x).sum().backward()
        g = net.weight.grad[0]
        assert g.dtype == torch.float32 and torch.isfinite(g).all(), (dtype, g)
        assert abs(g[0].item() - (big[0] + big[1]) / 2) <= 1e-2 * (big[0] + big[1]) / 2, (dtype, g)
        assert g[1].item() == small, f"{dtype}: 1 + 2**-10 reduced to {g[1].item()!r}, expected {small!r}"
    hvd.shutdown()
