"""Rank-side checks of the reducers on emulated topologies and of the
shared-memory transport's failure behaviour."""

import os
import time

import torch

import hvdtorch as hvd
from tests.workers.collectives import assert_equal, reference, value
from tests.workers.common import registered_reducers

REDUCERS = (*registered_reducers(), "auto")
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.uint8)


def every_reducer(layout: str):
    """layout: hosts per rank, e.g. "aabb". Checks every reducer, and that
    same-host peers talk through shared memory and other hosts through c10d."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    shm = os.environ.get("HVDTORCH_SHM", "1") != "0"
    if not shm:
        try:
            hvd.allreduce(torch.ones(2), reducer="node")
        except ValueError as e:
            assert "shared memory" in str(e), e
        else:
            raise AssertionError("reducer='node' accepted with HVDTORCH_SHM=0")
    case = 0
    for reducer in REDUCERS if shm else [x for x in REDUCERS if x != "node"]:
        for dtype in DTYPES:
            for count in (0, 1, max(n - 1, 1), 1001, 1_000_007):
                if count > 10_000 and dtype not in (torch.float32, torch.bfloat16):
                    continue
                for op in (hvd.Sum, hvd.Max, hvd.Product):
                    if count > 10_000 and op != hvd.Sum:
                        continue
                    case += 1
                    inputs = [value(k, (count,), dtype, case) for k in range(n)]
                    got = hvd.allreduce(inputs[r], op=op, reducer=reducer, name=f"r.{case}")
                    assert_equal(got, reference(op, inputs), f"{reducer} {dtype} count={count} op={op} layout={layout}")
    kinds = hvd.runtime.state().engine.link_kinds()
    for peer, ks in kinds.items():
        same_host = layout[peer] == layout[r]
        for k in ks:
            want = "shm" if (same_host and shm) else "c10d"
            assert k == want, f"rank {r} -> {peer} ({layout}): link {k}, expected {want} (all: {kinds})"
    if n > 1 and len(set(layout)) > 1:
        assert any("c10d" in ks for ks in kinds.values()), f"no cross-host c10d link used: {kinds}"
    model = hvd.runtime.state().engine.cost_model()
    assert ("node" in model) == shm, model
    auto = hvd.runtime.state().engine.choose_reducer(64 << 20, torch.float32)
    print(f"rank {r}: cost model {model}; auto picks {auto} at 64 MiB", flush=True)
    hvd.shutdown()


def _allreduce_until_error(x, tag):
    """Node all-reduces until the dead or frozen peer is noticed; returns the seconds it took."""
    t0 = time.time()
    try:
        for i in range(1000):
            hvd.allreduce(x, reducer="node", name=f"{tag}.{i}")
    except hvd.HvdError as e:
        print(f"rank {hvd.rank()} raised after {time.time() - t0:.1f}s: {e}", flush=True)
    else:
        raise AssertionError("no error although a peer died or stopped")


def dies_during_node_allreduce():
    hvd.init()
    r = hvd.rank()
    x = torch.ones(3_000_000)
    hvd.allreduce(x, reducer="node", name="warm")
    print(f"SHM-TOKEN {hvd.runtime.state().shm_token}", flush=True)
    print("SHM-IN-USE", flush=True)
    if r == 1:
        time.sleep(60)  # killed here by the harness
    time.sleep(0.5)
    _allreduce_until_error(x, "n")
    hvd.shutdown()


def stopped_peer_hits_deadline():
    hvd.init()
    r = hvd.rank()
    x = torch.ones(2_000_000)
    hvd.allreduce(x, reducer="node", name="warm")
    if r == 1:
        print("STOP-ME", flush=True)
        time.sleep(0.2)
        # SIGSTOPped here, then SIGCONT after the others gave up.
        return
    time.sleep(0.5)
    _allreduce_until_error(x, "s")


def registered_buffers_take_the_registered_reducer(reducer: str) -> None:
    """An in-place all-reduce of a buffer in registered memory (what
    DistributedModel's buckets and the sharded optimizer's parameters are)
    with the job's reducer `reducer`: under `auto` the engine gives it the
    registered reducer, which reduces it in place, and the cost model sees
    only that one at its size; a reducer the job names is kept. Calibration
    is off, so under `auto` alone the model would explore the other
    reducers on these ops (none is measured yet)."""
    hvd.init()
    engine = hvd.runtime.state().engine
    registered = next(row["name"] for row in hvd._C.reducer_registry() if row["registered"])
    buf = engine.registered_zeros(1 << 18, torch.float32)  # 1 MiB
    for i in range(8):
        buf.fill_(float(hvd.rank() + i))
        got = hvd.allreduce_(buf, op=hvd.Sum, name="registered.buf")
        assert got.data_ptr() == buf.data_ptr()
        want = float(sum(r + i for r in range(hvd.size())))
        assert torch.equal(buf, torch.full_like(buf, want)), (i, buf[:4])
    band = next(row for row in engine.reducer_choices() if row["bytes"] >= buf.numel() * 4)
    ran = {name for name, n in band["samples"].items() if n > 0}
    expected = {registered} if reducer == "auto" else {reducer}
    assert ran == expected, f"rank {hvd.rank()}: the {band['bytes']}-byte band was reduced by {ran}, not {expected}"
    hvd.shutdown()
