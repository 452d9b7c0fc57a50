"""Sparse reductions: sparse_allreduce_async against densified references, and
nn.Embedding(sparse=True) trained through DistributedOptimizer (all-gather of
sparse gradients, and sparse_as_dense) against one process on the global batch."""

import warnings

import torch
import torch.nn.functional as F

import hvdtorch as hvd

VOCAB, DIM, PER_RANK, STEPS = 12, 3, 4, 4


def rank_sparse(rank, shape, sparse_dim, dtype, nnz):
    """Rank `rank`'s sparse tensor (duplicate indices included), made the same on every rank."""
    g = torch.Generator().manual_seed(50 + rank)
    indices = torch.stack([torch.randint(0, shape[d], (nnz,), generator=g) for d in range(sparse_dim)])
    if dtype.is_floating_point:
        values = torch.randn((nnz,) + tuple(shape[sparse_dim:]), generator=g).to(dtype)
    else:
        values = torch.randint(-9, 10, (nnz,) + tuple(shape[sparse_dim:]), generator=g).to(dtype)
    return torch.sparse_coo_tensor(indices, values, shape)


def check_sparse_allreduce():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    nnz = lambda k: 0 if k == 1 else 3 + 2 * k  # rank 1 has nothing to contribute  # noqa: E731
    cases = [
        ((7, 3), 1, torch.float32),
        ((6, 5), 2, torch.float64),
        ((5, 2, 2), 1, torch.float32),
        ((9, 4), 1, torch.int64),
    ]
    for shape, sparse_dim, dtype in cases:
        for op in (hvd.Average, hvd.Sum):
            mine = rank_sparse(r, shape, sparse_dim, dtype, nnz(r))
            total = sum(rank_sparse(k, shape, sparse_dim, dtype, nnz(k)).to_dense() for k in range(n))
            if op == hvd.Average:
                want = total / n if dtype.is_floating_point else torch.div(total, n, rounding_mode="trunc")
            else:
                want = total
            handle = hvd.sparse_allreduce_async(mine, name=f"sp.{shape}.{op}", op=op)
            got = hvd.synchronize(handle) if op == hvd.Average else handle()  # both ways Horovod offers
            assert hvd.poll(handle)
            what = f"shape {shape} sparse_dim {sparse_dim} {dtype} op {op}"
            assert got.is_sparse and got.is_coalesced() and got.sparse_dim() == sparse_dim, what
            assert got.dtype == dtype and got.shape == shape, what
            torch.testing.assert_close(got.to_dense(), want, msg=lambda m: f"{what}: {m}")
    # Unnamed calls and the default op (Average).
    got = hvd.synchronize(hvd.sparse_allreduce_async(rank_sparse(r, (4, 2), 1, torch.float32, 2)))
    want = sum(rank_sparse(k, (4, 2), 1, torch.float32, 2).to_dense() for k in range(n)) / n
    torch.testing.assert_close(got.to_dense(), want)
    for what, call in [
        ("sparse COO tensor", lambda: hvd.sparse_allreduce_async(torch.ones(3), name="dense")),
        ("Average or Sum", lambda: hvd.sparse_allreduce_async(torch.eye(2).to_sparse(), "m", hvd.Max)),
    ]:
        try:
            call()
        except ValueError as e:
            assert what in str(e), e
        else:
            raise AssertionError(f"{what}: accepted")
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(n)))
    hvd.shutdown()


class EmbeddingNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM, sparse=True)
        self.fc = torch.nn.Linear(DIM, 2)

    def forward(self, tokens, use_embedding=True):
        h = self.emb(tokens) if use_embedding else torch.ones(tokens.shape + (DIM,))
        return self.fc(torch.tanh(h).mean(1))


def tokens_and_labels(step, n):
    g = torch.Generator().manual_seed(300 + step)
    return torch.randint(0, VOCAB, (PER_RANK * n, 5), generator=g), torch.randint(0, 2, (PER_RANK * n,), generator=g)


# The step in which the last rank does not touch the embedding (its gradient
# there is absent); "absent0" makes it the first step, where the ranks agree
# on which gradients are sparse.
SKIP_STEP = {"absent0": 0}


def skips_embedding(step, rank, n, mode=""):
    return n > 1 and step == SKIP_STEP.get(mode, 1) and rank == n - 1


def shard_loss(model, step, rank, n, mode=""):
    x, y = tokens_and_labels(step, n)
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    return F.cross_entropy(model(x[mine], use_embedding=not skips_embedding(step, rank, n, mode)), y[mine])


def train_reference(model, n, passes_per_step=1, mode=""):
    """The global loss is the mean of the ranks' losses, computed here in one process."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(STEPS):
        opt.zero_grad()
        for p in range(passes_per_step):
            (sum(shard_loss(model, step * passes_per_step + p, k, n, mode) for k in range(n)) / n).backward()
        opt.step()
    return model


def count_sparse_gathers():
    """Counts the all-gathers of the sparse path (name '<optimizer>.sparse.<i>.indices')."""
    calls = []
    original = hvd.collectives.ops.allgather_async

    def spy(tensor, name=None, process_set=None):
        if name and ".sparse." in name and name.endswith(".indices"):
            calls.append(name)
        return original(tensor, name=name, process_set=process_set)

    hvd.collectives.ops.allgather_async = spy
    return calls


def check_embedding_training(mode):
    """mode: 'gather' (sparse_as_dense=False) or 'dense' (sparse_as_dense=True); 'gather2': two passes
    per step; 'absent0': gather, with the embedding's gradient absent on the last rank in the first step."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    passes = 2 if mode == "gather2" else 1
    torch.manual_seed(0)
    base = EmbeddingNet()
    reference = EmbeddingNet()
    reference.load_state_dict(base.state_dict())
    train_reference(reference, n, passes, mode)
    model = EmbeddingNet()
    model.load_state_dict(base.state_dict())
    gathers = count_sparse_gathers()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5),
        named_parameters=model.named_parameters(),
        sparse_as_dense=(mode == "dense"),
        backward_passes_per_step=passes,
    )
    for step in range(STEPS):
        opt.zero_grad()
        for p in range(passes):
            shard_loss(model, step * passes + p, r, n, mode).backward()
        opt.synchronize()
        if n > 1:
            assert model.emb.weight.grad.is_sparse, f"{mode}: the embedding's gradient is not sparse after synchronize"
        with opt.skip_synchronize():
            opt.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(
            p.detach(),
            q.detach(),
            atol=1e-6,
            rtol=1e-5,
            msg=lambda m: f"{mode}: parameter {name} after {STEPS} steps: {m}",
        )
    if n > 1:
        if mode == "dense":
            assert not gathers, f"sparse_as_dense=True still all-gathered: {gathers}"
        else:
            assert len(gathers) == STEPS, f"expected one sparse all-gather per step, got {gathers}"
    hvd.shutdown()


def check_sparse_gradient_turning_up_late():
    """A parameter dense in the first step and sparse later: a clear error, no hang."""
    hvd.init()
    emb_dense = torch.nn.Embedding(VOCAB, DIM, sparse=False)
    emb_sparse = torch.nn.Embedding(VOCAB, DIM, sparse=True)
    emb_sparse.weight = emb_dense.weight  # the same parameter, used both ways
    opt = hvd.DistributedOptimizer(torch.optim.SGD([emb_dense.weight], lr=0.1))
    tokens = torch.tensor([[1, 2, 3]])
    emb_dense(tokens).sum().backward()
    opt.step()
    opt.zero_grad()
    try:
        emb_sparse(tokens).sum().backward()
    except ValueError as e:
        assert "got a sparse gradient" in str(e) and "sparse_as_dense" in str(e), e
    else:
        raise AssertionError("a late sparse gradient was accepted")
    hvd.shutdown()


def check_sparse_adam_with_sparse_as_dense():
    """sparse_as_dense hands the optimizer sparse gradients again: SparseAdam works."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(1)
    base = torch.nn.EmbeddingBag(VOCAB, DIM, mode="sum", sparse=True)
    ref = torch.nn.EmbeddingBag(VOCAB, DIM, mode="sum", sparse=True)
    ref.load_state_dict(base.state_dict())
    ref_opt = torch.optim.SparseAdam(ref.parameters(), lr=0.05)
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(base.parameters(), lr=0.05), sparse_as_dense=True)
    for step in range(STEPS):
        x, _ = tokens_and_labels(step, n)
        target = torch.linspace(-1, 1, DIM)
        ref_opt.zero_grad()
        (sum(((ref(x[k * PER_RANK : (k + 1) * PER_RANK]) - target) ** 2).sum() for k in range(n)) / n).backward()
        ref_opt.step()
        opt.zero_grad()
        ((base(x[r * PER_RANK : (r + 1) * PER_RANK]) - target) ** 2).sum().backward()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            opt.step()
    torch.testing.assert_close(base.weight.detach(), ref.weight.detach(), atol=1e-6, rtol=1e-5)
    hvd.shutdown()


def check_distributed_model_rejects_sparse_embeddings():
    hvd.init()
    try:
        hvd.DistributedModel(EmbeddingNet())
    except ValueError as e:
        assert "['emb']" in str(e) and "DistributedOptimizer" in str(e), e
    else:
        raise AssertionError("DistributedModel accepted a sparse embedding")
    hvd.shutdown()


def check_process_set(mode="gather"):
    """Sparse reductions and DistributedOptimizer over the even ranks; the odd
    rank's optimizer is the plain one (as in Horovod). mode: as for
    check_embedding_training ("absent0": the last rank, a member, has no
    embedding gradient in the first step)."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    even = hvd.add_process_set([k for k in range(n) if k % 2 == 0])
    members = even.ranks
    if r in members:
        got = hvd.sparse_allreduce_async(rank_sparse(r, (6, 2), 1, torch.float32, 3 + r), name="ps", process_set=even)
        want = sum(rank_sparse(k, (6, 2), 1, torch.float32, 3 + k).to_dense() for k in members) / len(members)
        torch.testing.assert_close(hvd.synchronize(got).to_dense(), want)
    torch.manual_seed(0)
    base = EmbeddingNet()
    model = EmbeddingNet()
    model.load_state_dict(base.state_dict())
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5), named_parameters=model.named_parameters(), process_set=even
    )
    reference = EmbeddingNet()
    reference.load_state_dict(base.state_dict())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    group = members if r in members else [r]  # whose shards the reference averages
    for step in range(STEPS):
        opt.zero_grad()
        shard_loss(model, step, r, n, mode).backward()
        opt.step()
        ref_opt.zero_grad()
        (sum(shard_loss(reference, step, k, n, mode) for k in group) / len(group)).backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), atol=1e-6, rtol=1e-5, msg=lambda m: f"rank {r}: {name}: {m}")
    hvd.barrier()  # a rank's shutdown stops the others' pending ops
    hvd.shutdown()
