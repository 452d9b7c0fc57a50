"""The optimizer stepped bucket by bucket (training/bucketed_step.py)."""

import pytest
import torch

from hvdtorch.training.bucketed_step import pieces, step_in_pieces, steps_in_pieces
from tests.harness import run_ranks


class _OwnStep(torch.optim.Adam):
    def step(self, closure=None):
        return super().step(closure)


def test_only_per_parameter_optimizers_with_torchs_step_are_stepped_in_pieces():
    assert steps_in_pieces(torch.optim.SGD)
    assert steps_in_pieces(torch.optim.AdamW)
    assert steps_in_pieces(type("Sub", (torch.optim.Adam,), {}))  # a subclass that keeps torch's step
    assert not steps_in_pieces(_OwnStep)
    assert not steps_in_pieces(torch.optim.LBFGS)


def test_pieces_hold_at_least_the_piece_size():
    mib = [torch.zeros(1 << 18)]  # 1 MiB
    half = [torch.zeros(1 << 17)]
    assert pieces([mib, half, half, half, mib]) == [[0], [1, 2], [3, 4]]
    assert pieces([half]) == [[0]]
    assert pieces([half, half, half], piece_bytes=1) == [[0], [1], [2]]


def _model_and_grads():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    return model


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_stepping_in_pieces_equals_one_step(kind, monkeypatch):
    monkeypatch.setattr("hvdtorch.training.bucketed_step.PIECE_BYTES", 1)
    whole, pieced = _model_and_grads(), _model_and_grads()

    def make(m):
        params = list(m.parameters())
        groups = [{"params": params[:2]}, {"params": params[2:], "lr": 0.05}]
        if kind == "sgd":
            return torch.optim.SGD(groups, lr=0.1, momentum=0.9)
        return torch.optim.Adam(groups, lr=0.01)

    a, b = make(whole), make(pieced)
    params = list(pieced.parameters())
    buckets = [params[4:6], params[2:4]]  # the first layer is in no bucket: stepped last
    finished, calls = [], []
    b.register_step_post_hook(lambda *_: calls.append(len(finished)))
    for _ in range(2):
        a.step()
        step_in_pieces(b.step, b.param_groups, buckets, finished.append)
    assert finished == [0, 1, 0, 1]
    assert calls == [1, 2, 2, 3, 4, 4], calls  # after each bucket, then the rest
    assert [len(g["params"]) for g in b.param_groups] == [2, 4]
    for p, q in zip(whole.parameters(), pieced.parameters()):
        torch.testing.assert_close(p, q)


def test_param_groups_are_restored_on_an_error(monkeypatch):
    monkeypatch.setattr("hvdtorch.training.bucketed_step.PIECE_BYTES", 1)
    model = _model_and_grads()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    params = list(model.parameters())
    before = list(opt.param_groups[0]["params"])

    def fail_second(index):
        if index == 1:
            raise RuntimeError(f"bucket {index} failed")

    # The first piece is stepped (the group holds its parameters only), then the second bucket fails.
    with pytest.raises(RuntimeError, match="bucket 1 failed"):
        step_in_pieces(opt.step, opt.param_groups, [params[:2], params[2:]], fail_second)
    assert opt.param_groups[0]["params"] == before


@pytest.mark.parametrize("nranks", [2, 3])
def test_pieces_under_distributed_model_and_optimizer_equal_one_process(nranks):
    run_ranks("tests.workers.bucketed_step:check_stepping_in_pieces", nranks, timeout=180)


def test_whole_steps_where_pieces_do_not_apply():
    run_ranks("tests.workers.bucketed_step:check_whole_steps_where_pieces_do_not_apply", 2, timeout=120)


def test_pieces_with_fp16_wire_and_two_passes_per_step():
    run_ranks("tests.workers.bucketed_step:check_pieces_with_fp16_and_accumulation", 2, timeout=120)
