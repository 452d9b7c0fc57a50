"""Rank side of tests/test_process_set_paths.py: values and gradients of ops
inside a process set of a larger job, against references each rank computes
from every member's (deterministic) input. The ranks outside the set meet the
members at a global barrier afterwards, so an op that leaks out of its set
turns into an error or a stall, never into a pass."""

import torch

import hvdtorch as hvd

SET = [0, 2]  # a 2-rank set in a 3-rank job: the set's size differs from the job's


def _upstream(k: int, rows: int, cols: int) -> torch.Tensor:
    """Rank k's upstream gradient: different in every row, column and rank."""
    return torch.arange(cols, dtype=torch.float64) + 10 * torch.arange(rows, dtype=torch.float64)[:, None] + 1000 * k


def check_reducescatter_in_set():
    hvd.init()
    r = hvd.rank()
    assert hvd.size() == 3
    ps = hvd.add_process_set(SET)
    if ps.included():
        me = ps.rank()
        shares = [3, 2]  # 5 rows over 2 members
        for op, factor in ((hvd.Sum, 2), (hvd.Average, 1)):
            x = torch.arange(15, dtype=torch.float64).reshape(5, 3).add(100 * r).requires_grad_()
            y = hvd.reducescatter(x, op=op, process_set=ps)
            full = sum(torch.arange(15, dtype=torch.float64).reshape(5, 3).add(100 * k) for k in SET)
            full = full if op == hvd.Sum else full / len(SET)
            start = sum(shares[:me])
            assert torch.equal(y.detach(), full[start : start + shares[me]]), (op, y, full)
            (y * _upstream(me, shares[me], 3)).sum().backward()
            want = torch.cat([_upstream(k, shares[k], 3) for k in range(len(SET))]) * factor
            assert torch.equal(x.grad, want), f"op {op}: grad {x.grad.tolist()} want {want.tolist()}"
    hvd.barrier()
    hvd.shutdown()


def check_alltoall_in_set():
    hvd.init()
    assert hvd.size() == 3
    ps = hvd.add_process_set(SET)
    if ps.included():
        me, n = ps.rank(), ps.size()
        splits = [[1, 2], [3, 1]]  # rows set rank s sends to set rank d, a non-empty block to itself included
        rows = [sum(s) for s in splits]
        inputs = [torch.arange(rows[s] * 2, dtype=torch.float64).reshape(rows[s], 2) + 100 * s for s in range(n)]
        x = inputs[me].clone().requires_grad_()
        out, received = hvd.alltoall(x, torch.tensor(splits[me]), process_set=ps)
        want = torch.cat([inputs[s].narrow(0, sum(splits[s][:me]), splits[s][me]) for s in range(n)])
        assert torch.equal(out.detach(), want), (out, want)
        assert received.tolist() == [splits[s][me] for s in range(n)], received
        out_rows = [sum(splits[s][d] for s in range(n)) for d in range(n)]
        (out * _upstream(me, out_rows[me], 2)).sum().backward()
        # Row i of my block for d became row (rows of lower set ranks for d) + i of d's output.
        grad = torch.empty(rows[me], 2, dtype=torch.float64)
        for d in range(n):
            start, at = sum(splits[me][:d]), sum(splits[s][d] for s in range(me))
            grad[start : start + splits[me][d]] = _upstream(d, out_rows[d], 2)[at : at + splits[me][d]]
        assert torch.equal(x.grad, grad), f"grad {x.grad.tolist()} want {grad.tolist()}"
    hvd.barrier()
    hvd.shutdown()


def _optimizer(r: int):
    """An SGD with momentum state and hyper-parameters that differ per rank."""
    torch.manual_seed(r)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.5 + 0.1 * r)
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    return opt


def _state_of(opt):
    sd = opt.state_dict()
    return (
        [(g["lr"], g["momentum"]) for g in sd["param_groups"]],
        [sd["state"][i]["momentum_buffer"].clone() for i in sorted(sd["state"])],
    )


def check_broadcast_optimizer_state_in_set():
    """Set [1, 2] takes rank 2's state; rank 0, alone in its own set, keeps its own."""
    hvd.init()
    r = hvd.rank()
    assert hvd.size() == 3
    pair = hvd.add_process_set([1, 2])
    alone = hvd.add_process_set([0])
    opt = _optimizer(r)
    mine = _state_of(opt)
    if pair.included():
        hvd.broadcast_optimizer_state(opt, root_rank=2, process_set=pair)
        want = _state_of(_optimizer(2))
    else:
        hvd.broadcast_optimizer_state(opt, root_rank=0, process_set=alone)
        want = mine
    got = _state_of(opt)
    assert got[0] == want[0], f"rank {r}: hyper-parameters {got[0]}, want {want[0]}"
    for a, b in zip(got[1], want[1]):
        assert torch.equal(a, b), f"rank {r}: momentum {a.tolist()}, want {b.tolist()}"
    hvd.barrier()
    hvd.shutdown()
