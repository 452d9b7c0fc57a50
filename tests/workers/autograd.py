"""Gradients of the collectives, with upstream gradients that differ in every
row and on every rank, so that taking the wrong rows or the wrong rank's
values shows. References follow Horovod's rules: allreduce's gradient is the
same allreduce of the gradient; allgather's is the average of the upstream
gradients, this rank's rows; broadcast's is the average, on the root only."""

import torch

import hvdtorch as hvd


def upstream(k: int, shape) -> torch.Tensor:
    """Rank k's upstream gradient: element (i, j) is 100 k + 10 i + j + 1."""
    rows, cols = shape
    i = torch.arange(rows, dtype=torch.float64).unsqueeze(1)
    j = torch.arange(cols, dtype=torch.float64).unsqueeze(0)
    return 100.0 * k + 10.0 * i + j + 1.0


def check_gradients():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    ups = lambda shape: [upstream(k, shape) for k in range(n)]  # noqa: E731

    # allgather: rank k contributes k + 1 rows.
    rows = [k + 1 for k in range(n)]
    x = torch.zeros(rows[r], 3, dtype=torch.float64, requires_grad=True)
    y = hvd.allgather(x, name="ag")
    assert y.shape == (sum(rows), 3)
    y.backward(ups((sum(rows), 3))[r])
    avg = sum(ups((sum(rows), 3))) / n
    offset = sum(rows[:r])
    torch.testing.assert_close(x.grad, avg[offset : offset + rows[r]], msg=lambda m: f"allgather grad: {m}")

    # broadcast from each root: the average reaches the root, zeros elsewhere.
    for root in sorted({0, n - 1}):
        x = torch.zeros(4, 3, dtype=torch.float64, requires_grad=True)
        hvd.broadcast(x, root_rank=root, name=f"bc.{root}").backward(ups((4, 3))[r])
        want = sum(ups((4, 3))) / n if r == root else torch.zeros(4, 3, dtype=torch.float64)
        torch.testing.assert_close(x.grad, want, msg=lambda m: f"broadcast root {root} grad: {m}")

    # allreduce: Average, Sum, and Sum with scale factors (the same scaling
    # applies to the gradient).
    for op, pre, post in ((hvd.Average, 1.0, 1.0), (hvd.Sum, 1.0, 1.0), (hvd.Sum, 2.0, 0.5), (hvd.Average, 3.0, 1.0)):
        x = torch.zeros(4, 3, dtype=torch.float64, requires_grad=True)
        hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post).backward(ups((4, 3))[r])
        total = sum(ups((4, 3))) * pre * post
        want = total / n if op == hvd.Average else total
        torch.testing.assert_close(x.grad, want, msg=lambda m: f"allreduce op={op} pre={pre} post={post} grad: {m}")
    hvd.shutdown()
