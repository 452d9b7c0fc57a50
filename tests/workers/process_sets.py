"""Process sets on 4 ranks: membership, every op inside overlapping sets
submitted in rank-dependent orders, gradients, DistributedModel training on
a set, the broadcast helpers, and the errors. References are computed on
each rank from every rank's (deterministic) input."""

import copy

import torch
import torch.nn.functional as F

import hvdtorch as hvd


def expect_value_error(what, call, *fragments):
    try:
        call()
    except ValueError as e:
        for f in fragments:
            assert f in str(e), f"{what}: {e}"
    else:
        raise AssertionError(f"{what}: no ValueError")


def check_process_sets():
    even = hvd.ProcessSet([2, 0])
    assert even.size() is None and even.rank() is None and even.included() is None  # not added yet
    hvd.init(process_sets=[even])
    r, n = hvd.rank(), hvd.size()
    assert n == 4
    tail = hvd.add_process_set([1, 2, 3])
    assert (even.process_set_id, tail.process_set_id) == (1, 2), (even, tail)
    assert even.ranks == [0, 2] and even.size() == 2 and even.included() == (r in (0, 2))
    assert even.rank() == {0: 0, 2: 1}.get(r, -1)
    assert tail.rank() == {1: 0, 2: 1, 3: 2}.get(r, -1)
    assert hvd.global_process_set.size() == 4 and hvd.global_process_set.rank() == r

    # Overlapping sets, rank 2 (in both) submitting in the other order, several rounds.
    for rnd in range(3):
        handles = []
        order = [tail, even] if r == 2 else [even, tail]
        for ps in order:
            if ps.included():
                x = torch.full((3,), float(r + 1 + rnd))
                handles.append((ps, hvd.allreduce_async(x, op=hvd.Sum, name=f"sum.{rnd}", process_set=ps)))
        for ps, h in handles:
            want = float(sum(k + 1 + rnd for k in ps.ranks))
            assert torch.equal(hvd.synchronize(h), torch.full((3,), want)), (r, ps, rnd)
        # A global op between them still matches (unnamed ops are numbered per set).
        assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), 4.0))

    if tail.included():
        # Average divides by the set's size; allgather spans the set in set order.
        avg = hvd.allreduce(torch.full((2,), float(r)), process_set=tail)
        assert torch.allclose(avg, torch.full((2,), 2.0)), avg
        g = hvd.allgather(torch.full((r, 2), float(r)), process_set=tail)  # ranks 1, 2, 3 give 1, 2, 3 rows
        assert torch.equal(g, torch.cat([torch.full((k, 2), float(k)) for k in (1, 2, 3)])), g
        # Broadcast roots are global ranks.
        b = hvd.broadcast(torch.full((2,), float(r)), root_rank=3, process_set=tail)
        assert torch.equal(b, torch.full((2,), 3.0)), b
        outs = hvd.grouped_allreduce(
            [torch.full((2,), float(r)), torch.ones(1, dtype=torch.int64)], op=hvd.Sum, process_set=tail
        )
        assert torch.equal(outs[0], torch.full((2,), 6.0)) and outs[1].item() == 3
        # Gradient of an allgather in a set: the averaged upstream rows of this rank.
        x = torch.zeros(r, 2, dtype=torch.float64, requires_grad=True)
        y = hvd.allgather(x, process_set=tail)
        up = lambda k: torch.arange(12, dtype=torch.float64).reshape(6, 2) * (k + 1)  # noqa: E731
        y.backward(up(r))
        avg_up = sum(up(k) for k in (1, 2, 3)) / 3
        offset = {1: 0, 2: 1, 3: 3}[r]
        torch.testing.assert_close(x.grad, avg_up[offset : offset + r])
        hvd.barrier(process_set=tail)
        # Helpers.
        assert hvd.broadcast_object({"from": r}, root_rank=2, process_set=tail) == {"from": 2}
        assert hvd.allgather_object(r * 10, process_set=tail) == [10, 20, 30]
        p = {"w": torch.full((2,), float(r))}
        hvd.broadcast_parameters(p, root_rank=1, process_set=tail)
        assert torch.equal(p["w"], torch.full((2,), 1.0))

    # DistributedModel averaging over the even set equals one process on the set's batch.
    if even.included():
        torch.manual_seed(0)
        base = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        ref = copy.deepcopy(base)
        model = hvd.DistributedModel(
            copy.deepcopy(base), process_set=even, fusion_bytes=256, first_bucket_bytes=64, name="even.model"
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for step in range(3):
            g = torch.Generator().manual_seed(step)
            xs, ys = torch.randn(4, 4, generator=g), torch.randint(0, 3, (4,), generator=g)
            mine = slice(0, 2) if r == 0 else slice(2, 4)
            opt.zero_grad()
            F.cross_entropy(model(xs[mine]), ys[mine]).backward()
            opt.step()
            ref_opt.zero_grad()
            F.cross_entropy(ref(xs), ys).backward()
            ref_opt.step()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4)

    # Errors, raised locally before anything is sent.
    if not even.included():
        expect_value_error(
            "not a member",
            lambda: hvd.allreduce(torch.ones(1), process_set=even),
            f"rank {r}",
            "process set 1 [0, 2] does not include this rank",
        )
    if tail.included():
        expect_value_error(
            "root outside the set",
            lambda: hvd.broadcast(torch.ones(1), 0, process_set=tail),
            "root_rank 0 is not in process set 2 [1, 2, 3]",
        )
    expect_value_error(
        "not added", lambda: hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([0, 1])), "has not been added"
    )
    expect_value_error("global", lambda: hvd.remove_process_set(hvd.global_process_set), "cannot be removed")
    # A set defined differently on different ranks: an error on every rank.
    expect_value_error(
        "different ranks",
        lambda: hvd.add_process_set([0, 1] if r == 0 else [0, 3]),
        "different ranks on different ranks",
        "rank 0: [0, 1]",
        "rank 1: [0, 3]",
    )

    # Removal, then the id is free again; the removed object no longer works.
    assert hvd.remove_process_set(even)
    expect_value_error("removed", lambda: hvd.allreduce(torch.ones(1), process_set=even), "has not been added")
    again = hvd.add_process_set([0, 3])
    assert again.process_set_id == 1
    if again.included():
        assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=again), torch.full((1,), 2.0))
    # shutdown() on any rank stops every rank's pending ops: meet first.
    hvd.barrier()
    hvd.shutdown()


def check_mismatch_in_set():
    """A shape mismatch inside a set fails on the set's members only, naming
    the set and the members' global ranks; the job goes on."""
    hvd.init()
    r = hvd.rank()
    ps = hvd.add_process_set([0, 2, 3])
    if ps.included():
        try:
            hvd.allreduce(torch.ones(4 if r == 3 else 3), name="bad", process_set=ps)
        except hvd.HvdError as e:
            msg = str(e)
            assert "mismatched allreduce 'bad' across ranks of process set 1 [0, 2, 3]" in msg, msg
            assert "ranks [0, 2] submitted" in msg and "ranks [3] submitted" in msg, msg
        else:
            raise AssertionError("mismatch in a set did not raise")
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), 4.0))
    hvd.shutdown()


class _TwoWays(torch.nn.Module):
    """Layers a and b applied in an order each rank chooses: the order their gradients become
    ready in backward (DistributedModel's observed order) differs between ranks."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)
        self.c = torch.nn.Linear(4, 2)

    def forward(self, x, a_first):
        h = self.b(torch.relu(self.a(x))) if a_first else self.a(torch.relu(self.b(x)))
        return self.c(h)


def check_bucket_order_in_a_set_without_rank_0():
    """DistributedModel in the set [1, 2] of 3 ranks: after the first pass
    every member rebuilds its buckets in the order the set's first rank
    (global rank 1) observed, although the two members observed different
    orders, and gradients still average right in the rebuilt buckets. Rank 0,
    outside the set, takes no part."""
    hvd.init()
    r = hvd.rank()
    assert hvd.size() == 3
    tail = hvd.add_process_set([1, 2])
    if tail.included():
        torch.manual_seed(0)
        base = _TwoWays()
        net = copy.deepcopy(base)
        # One parameter per bucket (beyond the first): the layout is the order.
        model = hvd.DistributedModel(net, process_set=tail, fusion_bytes=64, first_bucket_bytes=64)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        a_first = r == 1

        def batch(step):
            g = torch.Generator().manual_seed(10 * step + r)
            return torch.randn(3, 4, generator=g)

        opt.zero_grad()
        model(batch(0), a_first).sum().backward()
        opt.step()
        observed = model._reducer.ready_order()
        orders = hvd.allgather_object(list(observed), process_set=tail)
        assert orders[0] != orders[1], f"the members observed the same order {orders[0]}: nothing is tested"
        from hvdtorch.training.buckets import complete_order

        want = complete_order(orders[0], len(list(net.parameters())))
        # The next forward rebuilds the buckets in the agreed order.
        opt.zero_grad()
        x = batch(1)
        model(x, a_first).sum().backward()
        assert not model._rebuild_pending, f"rank {r}: the buckets were never rebuilt"
        assert model._order == want, f"rank {r}: buckets in order {model._order}, the set's first rank saw {want}"
        layouts = hvd.allgather_object(model._reducer.bucket_params(), process_set=tail)
        assert layouts[0] == layouts[1], f"the members' buckets differ: {layouts}"
        # The gradients of this pass average the members' own, bucket by bucket.
        local = copy.deepcopy(base)
        with torch.no_grad():
            for p, q in zip(local.parameters(), net.parameters()):
                p.copy_(q)
        local(x, a_first).sum().backward()
        grads = hvd.allgather_object([p.grad for p in local.parameters()], process_set=tail)
        for (name, p), g0, g1 in zip(net.named_parameters(), *grads):
            torch.testing.assert_close(p.grad, (g0 + g1) / 2, msg=lambda m, name=name: f"rank {r}, {name}: {m}")
        opt.step()
    hvd.barrier()
    hvd.shutdown()


def check_module_state_and_shards_in_a_set_without_rank_0():
    """In the set [1, 2] of 3 ranks: DistributedModel's wrap-time broadcast
    and its buffer broadcast take global rank 1's (the set's first rank's)
    parameters and running statistics, not global rank 0's; a shard=2
    optimizer over the set steps equal to the set's average (its members'
    parameters equal after training). Rank 0, outside the set, takes part in
    nothing and keeps its own."""
    hvd.init()
    r = hvd.rank()
    assert hvd.size() == 3
    tail = hvd.add_process_set([1, 2])
    torch.manual_seed(r)  # each rank its own weights: the wrap must replace rank 2's by rank 1's
    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 2))
    mine = {k: v.clone() for k, v in net.state_dict().items()}
    if tail.included():
        model = hvd.DistributedModel(net, process_set=tail)
        every = hvd.allgather_object(net.state_dict(), name="set.wrap", process_set=tail)
        for k, v in every[1].items():
            assert torch.equal(every[0][k], v), f"rank {r}: {k} differs in the set after the wrap"
            if r == 1:
                assert torch.equal(v, mine[k]), f"rank 1: {k} is not its own after the wrap"
        opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), shard=2, model=model)
        for step in range(3):
            x = torch.randn(5, 4, generator=torch.Generator().manual_seed(10 * step + r)) + r
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        # Before a forward the members hold rank 1's running statistics (the last forward updated each its own).
        model(torch.zeros(2, 4))
        every = hvd.allgather_object(
            {k: v.clone() for k, v in net.state_dict().items()}, name="set.trained", process_set=tail
        )
        for k, v in every[1].items():
            if "running" not in k and "num_batches" not in k:
                assert torch.equal(every[0][k], v), f"rank {r}: {k} differs in the set after training"
        hvd.barrier(process_set=tail)
    else:
        for k, v in net.state_dict().items():
            assert torch.equal(v, mine[k]), f"rank 0 (outside the set): {k} changed"
    hvd.barrier()
    hvd.shutdown()
