"""Rank-side checks for tests/test_pinned_behaviour.py."""
import copy

import torch

import hvdtorch as hvd


class _TwoLayers(torch.nn.Module):
    """a feeds b; b is skipped when `use_b` says so for this rank and pass."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 3)
        self.b = torch.nn.Linear(3, 3)

    def forward(self, x, use_b):
        h = self.a(x)
        return (self.b(h) if use_b else h).square().sum()


def _local_grads(base, x, use_b):
    m = copy.deepcopy(base)
    m(x, use_b).backward()
    return {name: p.grad if p.grad is not None else torch.zeros_like(p) for name, p in m.named_parameters()}


def unused_parameter_keeps_accumulated_gradient():
    """Gradients accumulate over backward passes as in one process: after the
    passes of a step every .grad is the sum over passes of the average over
    ranks of that pass's local gradients. A parameter unused on a rank in a
    pass adds nothing there -- what it accumulated before must not be lost,
    whether the earlier passes were reduced (.grad not cleared between
    passes) or local (backward_passes_per_step, no_sync)."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(3)
    base = _TwoLayers()

    def x_of(k, p):
        return torch.full((2, 3), float(k + 1 + p))

    def use_b(k, p):
        return not (p == 2 and k == 0)  # rank 0 skips b in the last pass (the reduced one)

    for how in ("every pass reduced", "backward_passes_per_step=3", "no_sync"):
        net = copy.deepcopy(base)
        model = hvd.DistributedModel(net, fusion_bytes=1 << 20, name=f"accumulate.{how}",
                                     backward_passes_per_step=3 if how.startswith("backward") else 1)
        want = {name: torch.zeros_like(p) for name, p in base.named_parameters()}
        for p in range(3):  # .grad is never cleared
            if how == "no_sync" and p < 2:
                with model.no_sync():
                    model(x_of(r, p), use_b(r, p)).backward()
            else:
                model(x_of(r, p), use_b(r, p)).backward()
            for k in range(n):
                for name, g in _local_grads(base, x_of(k, p), use_b(k, p)).items():
                    want[name] += g / n
            if how == "every pass reduced" or p == 2:
                for name, q in net.named_parameters():
                    torch.testing.assert_close(q.grad, want[name], msg=lambda m: f"{how}, pass {p}, {name}: {m}")
    hvd.shutdown()
