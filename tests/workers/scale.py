"""Many ranks on a few cores: the collectives, then a steady state of cached
all-reduces whose negotiation must be settled by the decentralized AND."""

import torch

import hvdtorch as hvd
from tests.workers import collectives


def check_many_ranks(steps: str = "60"):
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    collectives.check_allgather()
    for root in sorted({0, n - 1}):
        got = hvd.broadcast(collectives.value(r, (4, 5), torch.float32, 900), root_rank=root)
        collectives.assert_equal(got, collectives.value(root, (4, 5), torch.float32, 900), f"broadcast root {root}")
    for case, op in enumerate((hvd.Sum, hvd.Average, hvd.Min, hvd.Max)):
        inputs = [collectives.value(k, (3, 5), torch.float32, 40 + case) for k in range(n)]
        got = hvd.allreduce(inputs[r], op=op, name=f"scale.op{case}")
        collectives.assert_equal(
            got, collectives.reference(op, inputs), f"allreduce op {case}", exact=op != hvd.Average
        )
    engine = hvd.runtime.state().engine
    # A training-like steady state: the same three named tensors every step.
    for step in range(int(steps)):
        if step == 5:
            before = engine.negotiation_stats()
        handles = [hvd.allreduce_async(torch.full((4,), float(r + k)), op=hvd.Sum, name=f"grad.{k}") for k in range(3)]
        for k, h in enumerate(handles):
            want = float(sum(range(n)) + n * k)
            got = hvd.synchronize(h)
            assert torch.equal(got, torch.full((4,), want)), (step, k, got)
    after = engine.negotiation_stats()
    dec = after["decentralized"] - before["decentralized"]
    star = after["star"] - before["star"]
    print(f"NEGOTIATION rank={r} decentralized={dec} star={star}", flush=True)
    # Oversubscribed, a rank may lag past the grace now and then and call
    # the coordinator in; most rounds must not need it.
    assert dec > star, f"rank {r}: {dec} decentralized vs {star} star rounds in the steady state"
    hvd.barrier()
    hvd.shutdown()
