"""Compression.powersgd (csrc/torch/powersgd_strategy.h, hvdtorch/collectives/powersgd.py):

  * after STEPS steps on 1-4 ranks, DistributedModel's and
    DistributedOptimizer's parameters equal a one-process re-implementation
    of the algorithm below (each rank's gradient, error feedback, averaged
    P, Gram-Schmidt, averaged Q, warm start, start_iter), in float64;
  * a state_dict round trip resumes exactly;
  * examples/learn.py reaches the uncompressed accuracy within a point;
  * each refused combination says why.
"""

import json

import pytest
import torch

from tests.harness import run_ranks
from tests.workers.powersgd import LR, MOMENTUM, OPTIONS, STEPS, loss_of, make_net


def orthogonalize(p: torch.Tensor) -> None:
    """Gram-Schmidt over the columns, in place; a zero column stays zero."""
    tiny = torch.finfo(p.dtype).tiny
    for i in range(p.shape[1]):
        col = p[:, i : i + 1]
        col.div_(col.norm().clamp_min(tiny))
        rest = p[:, i + 1 :]
        rest.sub_(col * (col * rest).sum(0, keepdim=True))


def reference(nranks: int, options=OPTIONS, steps: int = STEPS, op_sum: bool = False):
    """The parameters after `steps` steps of `nranks` ranks, simulated in one process (op_sum: hvd.Sum,
    the result `nranks` times the average's; the error is of the average)."""
    scale = nranks if op_sum else 1
    rank, start_iter, rate, seed = options["rank"], options["start_iter"], options["min_compression_rate"], options["seed"]
    net = make_net()
    params = list(net.parameters())
    opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    errors = [dict() for _ in range(nranks)]  # per rank: parameter index -> error
    qs = {}  # parameter index -> Q, the same on every rank
    for step in range(steps):
        grads = []
        for k in range(nranks):
            net.zero_grad()
            loss_of(net, step, k).backward()
            grads.append([p.grad.clone() for p in params])
        for i, p in enumerate(params):
            mine = [g[i] for g in grads]
            average = sum(mine) / nranks
            n = p.shape[0]
            m = p.numel() // n
            r = min(rank, n, m)
            compressed = p.dim() >= 2 and n * m >= rate * r * (n + m)
            # Alone nothing travels; before start_iter the average is exact and no error builds up.
            if nranks == 1 or step < start_iter or not compressed:
                p.grad = average * scale
                continue
            ms = [g.reshape(n, m) + errors[k].get(i, 0) for k, g in enumerate(mine)]
            if i not in qs:
                qs[i] = torch.randn(m, r, generator=torch.Generator().manual_seed(seed + i), dtype=p.dtype)
            pm = sum(M @ qs[i] for M in ms) / nranks
            orthogonalize(pm)
            q = sum(M.t() @ pm for M in ms) / nranks
            approx = pm @ q.t()
            for k, M in enumerate(ms):
                errors[k][i] = M - approx
            qs[i] = q
            p.grad = approx.reshape(p.shape) * scale
        opt.step()
    return [p.detach() for p in params]


def _trained(tmp_path, kind: str, nranks: int, options=None):
    out = tmp_path / f"{kind}{nranks}.pt"
    run_ranks(
        "tests.workers.powersgd:train", nranks, timeout=90, args=[kind, str(out), json.dumps(options or {})]
    )
    return torch.load(out)


def _assert_equal(got, want):
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_distributed_model_matches_the_reference(tmp_path, nranks):
    got = _trained(tmp_path, "model", nranks)
    _assert_equal(got, reference(nranks))
    if nranks > 1:
        # Compression shows: the plain average gives other parameters.
        plain = reference(nranks, {**OPTIONS, "start_iter": STEPS})
        assert any((g - w).abs().max() > 1e-6 for g, w in zip(got, plain))


@pytest.mark.parametrize("nranks", [2, 3])
def test_distributed_optimizer_matches_the_reference(tmp_path, nranks):
    _assert_equal(_trained(tmp_path, "optimizer", nranks), reference(nranks))


def test_rank_one_and_compression_from_the_first_pass(tmp_path):
    options = {**OPTIONS, "rank": 1, "start_iter": 0}
    _assert_equal(_trained(tmp_path, "model", 2, options), reference(2, options))


def test_sum_scales_the_compressed_matrices(tmp_path):
    got = _trained(tmp_path, "model", 3, {"sum": True})
    _assert_equal(got, reference(3, op_sum=True))


def test_fp16_factors_stay_close(tmp_path):
    got = _trained(tmp_path, "model", 2, {"fp16": True})
    for g, w in zip(got, reference(2)):
        torch.testing.assert_close(g, w, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("kind", ["model", "optimizer"])
def test_state_dict_round_trip_resumes_exactly(kind):
    run_ranks("tests.workers.powersgd:round_trip", 2, timeout=90, args=[kind])


def test_refusals_name_the_reason():
    results = run_ranks("tests.workers.powersgd:refusals", 2, timeout=90)
    assert results[0].output.count("refused:") == 12, results[0].output


def test_learn_reaches_the_uncompressed_accuracy(tmp_path):
    common = ["--steps", "120", "--eval-every", "120", "--train-size", "2048", "--val-size", "1000"]
    final = {}
    for name, extra in (("none", []), ("powersgd", ["--compression", "powersgd", "--powersgd-rank", "4"])):
        out = tmp_path / f"{name}.json"
        run_ranks("tests.workers.powersgd:learn", 2, timeout=120, args=[str(out), *common, *extra])
        final[name] = json.loads(out.read_text())["accuracies"][-1][1]
    assert final["none"] > 0.5, final  # the task is learnt at all
    assert final["powersgd"] >= final["none"] - 0.01, final
