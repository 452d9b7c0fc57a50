"""The gradient reducer's bucket strategies (csrc/torch/strategies/),
driven directly through _C.GradientReducer: what synchronize() hands back
for each strategy is the average of the ranks' gradients, whole or this
rank's shard range (the one shard rule, _C.shard_range), and what happens
to .grad; an unknown strategy is refused by name."""

import torch

import hvdtorch as hvd
from hvdtorch import _C
from hvdtorch.training.reducer_options import reducer_options
from tests.workers.common import expect

# Two buckets of uneven sizes (7 = 3 + 4 elements, 5): shard ranges of 2 and 3 ranks are uneven too.
SHAPES = [(3,), (2, 2), (5,)]
LAYOUT = [[0, 1], [2]]


def _reducer(params, strategy, name, k=1, counter=None, layout=LAYOUT):
    options = reducer_options(
        name=name,
        reducer="",  # the engine gives registered buckets reduced in place its registered reducer
        op=hvd.Average,
        sync_on_backward=False,
        fuse=strategy != "in_place_shard",
        backward_passes_per_step=k,
        strategy=strategy,
        param_names=[f"p{i}" for i in range(len(params))],
        sparse_refusal="buckets are dense here",
    )
    return _C.GradientReducer(hvd.runtime.state().engine, params, layout, options, counter=counter)


def _backward(params, r):
    """Rank r's gradient of parameter i is (i + 1) * (r + 1) * [1, 2, ...]."""
    loss = sum(
        ((i + 1) * (r + 1) * torch.arange(1.0, p.numel() + 1).view(p.shape) * p).sum() for i, p in enumerate(params)
    )
    loss.backward()


def _in_place_never_fused(r):
    """in_place_shard's all-reduces are never fused: buckets launched
    together (synchronize() with no pass reduced launches them all at once)
    do not go through the engine's fusion buffer, which would grow to their
    size for good. Run first, on a fresh engine."""
    engine = hvd.runtime.state().engine
    # Sixteen one-tensor buckets launched back to back: were they fusable, some would be ready in the same
    # negotiation cycle and fused, whatever the timing.
    params = [torch.zeros(5, requires_grad=True) for _ in range(16)]
    reducer = _reducer(params, "in_place_shard", "strategies.unfused", layout=[[i] for i in range(16)])
    for _ in range(3):
        for p in params:
            p.grad = torch.ones_like(p)
        reducer.synchronize()
    smallest = min(reducer.bucket_bytes())
    assert engine.fusion_buffer_bytes() < smallest, (
        f"rank {r}: the fusion buffer holds {engine.fusion_buffer_bytes()} bytes, buckets {reducer.bucket_bytes()}"
    )


def check_strategies():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    _in_place_never_fused(r)
    mean = sum(k + 1 for k in range(n)) / n
    for strategy in ("allreduce_views", "in_place_shard", "reduce_scatter_shard"):
        params = [torch.zeros(s, requires_grad=True) for s in SHAPES]
        reducer = _reducer(params, strategy, f"strategies.{strategy}")
        want = [
            torch.cat([(i + 1) * mean * torch.arange(1.0, params[i].numel() + 1) for i in members])
            for members in LAYOUT
        ]
        for step in range(2):  # the second step reuses the buckets
            for p in params:
                p.grad = None
            _backward(params, r)
            if strategy == "allreduce_views":
                assert all(p.grad is not None for p in params), f"{strategy}: .grad kept"
            else:
                assert all(p.grad is None for p in params), f"{strategy}: .grad dropped when the bucket launched"
            results = reducer.synchronize()
            for j, (got, whole) in enumerate(zip(results, want)):
                if strategy == "allreduce_views":
                    expected = whole
                else:
                    start, end = _C.shard_range(whole.numel(), r, n)
                    expected = whole[start:end]
                assert torch.equal(got, expected), f"{strategy} step {step} bucket {j}: {got.tolist()} want {expected}"
                if strategy == "in_place_shard":
                    flat = reducer.flats()[j]
                    assert got.data_ptr() == flat[start:end].data_ptr(), f"{strategy}: the result views the bucket"
            if strategy == "allreduce_views":
                assert torch.equal(params[2].grad, want[1]), f"{strategy}: .grad holds the average"
                # .grad was None before backward: the hook made it the view of its slot.
                slot = reducer.flats()[1]
                assert params[2].grad.data_ptr() == slot.data_ptr(), f"{strategy}: .grad is the bucket's slot"
        # view_gradients(): zeroed buckets, every .grad the view of its slot, before any backward.
        for p in params:
            p.grad = None
        reducer.view_gradients()
        for i, offset in zip(LAYOUT[0], (0, 3)):
            flat = reducer.flats()[0]
            g = params[i].grad
            assert g is not None and g.data_ptr() == flat[offset:].data_ptr(), f"{strategy}: parameter {i}'s view"
            assert not g.any(), f"{strategy}: view_gradients() zeroes the buckets"

    # The caller's strict counter decides: the reducer reduces the k-th pass and refuses the (k+1)-th.
    params = [torch.zeros(s, requires_grad=True) for s in SHAPES]
    counter = _C.PassCounter(2, strict=True, rank=r, advice="do something else")
    reducer = _reducer(params, "reduce_scatter_shard", "strategies.counter", k=2, counter=counter)
    assert reducer.counter is counter
    _backward(params, r)
    _backward(params, r)
    assert counter.passes == 2 and counter.due(), f"passes counted once each: {counter.passes}"
    expect(AssertionError, ["backward pass 3", "do something else"], lambda: _backward(params, r), r)
    results = reducer.synchronize()
    start, end = _C.shard_range(5, r, n)
    want = 2 * 3 * mean * torch.arange(1.0, 6)[start:end]  # two passes of parameter 2's gradient
    assert torch.equal(results[1], want), f"accumulated over k passes: {results[1].tolist()} want {want.tolist()}"
    assert not counter.pending(), "synchronize() is the step: the count starts again"

    expect(
        ValueError,
        ["unknown bucket strategy 'nope'", "in_place_shard", "reduce_scatter_shard"],
        lambda: _reducer([torch.zeros(3, requires_grad=True)], "nope", "strategies.nope"),
        r,
    )
    hvd.shutdown()
