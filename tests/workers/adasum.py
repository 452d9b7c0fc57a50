"""Rank-side checks of Adasum (op=hvd.Adasum, reducer="adasum") against a
reference written here: the pairwise rule applied up the tree of ranks
(ranks past the largest power of two folded into rank r - p' first, then
levels 1, 2, 4, ... with the lower ranks on the left), in float64."""

import torch

import hvdtorch as hvd
from tests.workers.common import expect as _expect


def pair_rule(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ab, aa, bb = float((a * b).sum()), float((a * a).sum()), float((b * b).sum())
    ca = 1 - ab / (2 * aa) if aa > 0 else 1.0
    cb = 1 - ab / (2 * bb) if bb > 0 else 1.0
    return ca * a + cb * b


def reference(inputs):
    v = [t.double().flatten() for t in inputs]
    p = len(v)
    pow2 = 1
    while pow2 * 2 <= p:
        pow2 *= 2
    for r in range(pow2, p):
        v[r - pow2] = pair_rule(v[r - pow2], v[r])
    d = 1
    while d < pow2:
        for i in range(0, pow2, 2 * d):
            v[i] = pair_rule(v[i], v[i + d])
        d *= 2
    return v[0].reshape(inputs[0].shape)


def gradient_of(rank: int, shape, case: int, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(7000 * case + rank)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def values():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for case, (shape, dtype, tol) in enumerate(
        [
            ((17,), torch.float64, 1e-12),
            ((5, 3), torch.float32, 1e-5),
            ((1,), torch.float64, 1e-12),
            ((0,), torch.float32, 0),
            ((64,), torch.bfloat16, 3e-2),
        ]
    ):
        inputs = [gradient_of(k, shape, case, dtype) for k in range(n)]
        want = reference(inputs).to(dtype)
        for how, call in [
            ("op=Adasum", lambda: hvd.allreduce(inputs[r], op=hvd.Adasum, name=f"a{case}")),
            ("reducer=adasum", lambda: hvd.allreduce(inputs[r], reducer="adasum", name=f"b{case}")),
        ]:
            got = call()
            torch.testing.assert_close(got, want, atol=tol, rtol=tol, msg=lambda m: f"{how} {dtype} {shape}: {m}")
    # A group: Adasum per tensor, never over the tensors fused together.
    group = [[gradient_of(k, (9,), 50), gradient_of(k, (4, 2), 51)] for k in range(n)]
    outs = hvd.grouped_allreduce(group[r], op=hvd.Adasum)
    for i, out in enumerate(outs):
        torch.testing.assert_close(out, reference([group[k][i] for k in range(n)]), atol=1e-12, rtol=1e-12)
    # Orthogonal contributions add up; equal ones give themselves (their mean).
    e = torch.zeros(max(n, 1), dtype=torch.float64)
    e[r] = r + 1.0
    assert torch.equal(hvd.allreduce(e, op=hvd.Adasum), torch.arange(1.0, n + 1, dtype=torch.float64))
    same = torch.tensor([3.0, -1.5, 0.25], dtype=torch.float64)
    assert torch.equal(hvd.allreduce(same, op=hvd.Adasum), same)
    # An all-zero vector (a frozen or unused part of a model) contributes nothing and divides by nothing:
    # on one rank, on every rank but the last, and on every rank the result is the reference's, finite.
    for case, zero_ranks in enumerate([{0}, set(range(n - 1)), set(range(n))]):
        inputs = [
            torch.zeros(11, dtype=torch.float64) if k in zero_ranks else gradient_of(k, (11,), 60) for k in range(n)
        ]
        got = hvd.allreduce(inputs[r], op=hvd.Adasum, name=f"zero{case}")
        assert torch.isfinite(got).all(), f"all-zero vectors on ranks {sorted(zero_ranks)}: {got.tolist()}"
        torch.testing.assert_close(got, reference(inputs), atol=1e-12, rtol=1e-12)
    hvd.shutdown()


def errors():
    hvd.init()
    r = hvd.rank()
    _expect(
        ValueError,
        [f"rank {r}: allreduce", "no reducer serves Adasum on int64"],
        lambda: hvd.allreduce(torch.ones(3, dtype=torch.int64), op=hvd.Adasum),
        r,
    )
    _expect(
        ValueError,
        [f"rank {r}: allreduce", "reducer ring does not serve Adasum on float32"],
        lambda: hvd.allreduce(torch.ones(3), op=hvd.Adasum, reducer="ring"),
        r,
    )
    _expect(
        ValueError,
        [f"rank {r}: allreduce", "reducer adasum does not serve Adasum on int32"],
        lambda: hvd.allreduce(torch.ones(3, dtype=torch.int32), reducer="adasum"),
        r,
    )
    _expect(
        ValueError,
        [f"rank {r}: reducescatter", "Adasum has no reduce-scatter"],
        lambda: hvd.reducescatter(torch.ones(4), op=hvd.Adasum),
        r,
    )
    # Still in step.
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(hvd.size())))
    hvd.shutdown()
