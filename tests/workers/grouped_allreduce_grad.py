"""Gradients of grouped_allreduce against references computed from every
rank's (deterministic) upstream gradients: Horovod's rule is that the
gradient of a grouped all-reduce is the same grouped all-reduce (op, scale
factors, process set) of the upstream gradients, tensor by tensor."""

import torch

import hvdtorch as hvd
from tests.workers.autograd import upstream

SHAPES = [(4, 3), (2, 5), (1, 1)]


def _check(ranks, process_set, tag):
    """Values and gradients of grouped_allreduce over ``ranks`` (global ranks, set order)."""
    r = hvd.rank()
    me = ranks.index(r)
    cases = [(hvd.Average, 1.0, 1.0), (hvd.Sum, 1.0, 1.0), (hvd.Sum, 2.0, 0.5), (hvd.Average, 3.0, 1.0)]
    for op, pre, post in cases:
        xs = [(upstream(r, s) * 0.5).requires_grad_() for s in SHAPES]
        ys = hvd.grouped_allreduce(
            xs, op=op, prescale_factor=pre, postscale_factor=post, process_set=process_set, name=f"{tag}.{op}.{pre}"
        )
        scale = pre * post / (len(ranks) if op == hvd.Average else 1)
        for s, y in zip(SHAPES, ys):
            want = sum(upstream(k, s) * 0.5 for k in ranks) * scale
            torch.testing.assert_close(y, want, msg=lambda m: f"{tag} op={op} value {s}: {m}")
        # Every rank its own upstream gradient, different per tensor (+ 7 i).
        loss = sum((y * (upstream(ranks[me] + 7 * i, s))).sum() for i, (s, y) in enumerate(zip(SHAPES, ys)))
        loss.backward()
        for i, (s, x) in enumerate(zip(SHAPES, xs)):
            want = sum(upstream(k + 7 * i, s) for k in ranks) * scale
            torch.testing.assert_close(x.grad, want, msg=lambda m: f"{tag} op={op} pre={pre} post={post} grad {s}: {m}")
    # Only some outputs used: the others' gradients are zeros, still reduced together.
    xs = [torch.ones(s, dtype=torch.float64, requires_grad=True) for s in SHAPES]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum, process_set=process_set)
    (ys[1] * float(r + 1)).sum().backward()
    assert xs[0].grad is not None and not xs[0].grad.any(), xs[0].grad
    torch.testing.assert_close(xs[1].grad, torch.full(SHAPES[1], float(sum(k + 1 for k in ranks)), dtype=torch.float64))
    # fp16 compression: differentiable through the casts.
    x = torch.full((3,), float(r + 1), requires_grad=True)
    (y,) = hvd.grouped_allreduce([x], op=hvd.Sum, compression=hvd.Compression.fp16, process_set=process_set)
    assert y.dtype == torch.float32
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), float(len(ranks))))


def check_gradients():
    hvd.init()
    n = hvd.size()
    _check(list(range(n)), None, "global")
    hvd.shutdown()


def check_gradients_in_process_set():
    """4 ranks: the set of ranks 1 and 3 reduces within itself (values and gradients)."""
    odd = hvd.ProcessSet([1, 3])
    hvd.init(process_sets=[odd])
    if odd.included():
        _check([1, 3], odd, "odd")
    hvd.barrier()
    hvd.shutdown()
