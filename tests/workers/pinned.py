"""Rank-side checks for tests/test_pinned_behaviour.py."""
import torch

import hvdtorch as hvd


def allreduce_backward_with_scales():
    """y = post * op_r(pre * x_r): the gradient of x on every rank is the same
    all-reduce (op, pre, post) of the upstream gradients. Upstream gradients
    differ per rank (r + 1), so Sum, Average and the factors all show."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    upstream_sum = float(sum(range(1, n + 1)))
    for op, pre, post in ((hvd.Sum, 2.0, 3.0), (hvd.Average, 1.0, 5.0), (hvd.Average, 4.0, 0.5)):
        x = torch.full((3,), float(r), requires_grad=True)
        y = hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post, name=f"scaled.{op}.{pre}.{post}")
        forward = post * pre * sum(range(n)) / (n if op == hvd.Average else 1)
        torch.testing.assert_close(y.detach(), torch.full((3,), float(forward)))
        (y * (r + 1)).sum().backward()
        want = post * pre * upstream_sum / (n if op == hvd.Average else 1)
        torch.testing.assert_close(x.grad, torch.full((3,), float(want)),
                                   msg=lambda m: f"op {op} prescale {pre} postscale {post}: {m}")
    hvd.shutdown()
