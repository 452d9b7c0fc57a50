"""A rank of the device ring dies while its peers' streams may be waiting on
flags its stream was to write (algorithms/device_ring.h): the survivors must
fail at once, naming the op, and shut down at once, because the engine
releases those waits when it fails (DeviceRing::releaseWaits). Without the
release a GPU stream would wait forever; the simulated device gives up after
SimOptions::flag_timeout_ms (30 s) and says so, which these bounds catch."""

import time

import torch

import hvdtorch as hvd
from tests.workers.common import device_of


def peer_dies_in_the_ring(device: str) -> None:
    """The test kills the last rank once it printed "looping" (after its first
    loop op)."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    dev = device_of(device)
    x = torch.ones(1 << 16, device=dev)
    for i in range(3):
        hvd.allreduce_(x.fill_(1), op=hvd.Sum, name="warm", reducer="ring")
        assert float(x[0]) == n, f"rank {r}: warm-up {i} gave {float(x[0])}"
    before = hvd._C.device_ring_runs()
    started = time.monotonic()
    failed = None
    try:
        for i in range(1_000_000):
            hvd.allreduce_(x.fill_(1), op=hvd.Sum, name="loop", reducer="ring")
            if i == 0:
                # The word comes after the first loop op: the last rank gets its
                # result only once every rank has entered the ring for it, so the
                # kill cannot land before a survivor took the ring.
                print("looping", flush=True)
    except hvd.HvdError as e:
        failed = time.monotonic()
        print(f"rank {r}: failed after {failed - started:.2f} s: {e}", flush=True)
    assert failed is not None, "unreachable: the loop only ends by an error"
    assert hvd._C.device_ring_runs() > before, "the loop never took the device ring"
    assert failed - started < 15, f"rank {r}: the failure took {failed - started:.1f} s to surface"
    t0 = time.monotonic()
    hvd.shutdown()
    if dev.type == "cuda":
        torch.cuda.synchronize()  # nothing of ours is left waiting on the stream
    took = time.monotonic() - t0
    print(f"rank {r}: shutdown took {took:.2f} s", flush=True)
    assert took < 10, f"rank {r}: shutdown took {took:.1f} s (a stream waited on a flag nobody writes?)"


def run_with_the_last_rank_killed(device: str, env: dict) -> None:
    """The test side: 3 ranks, the last killed once it printed "looping";
    the others must finish well (as peer_dies_in_the_ring checks), and no
    simulated wait may have been left for the simulator to report."""
    from tests.harness import run_ranks

    results = run_ranks(
        "tests.workers.device_ring_faults:peer_dies_in_the_ring",
        3,
        args=[device],
        timeout=120,
        env={**env, "HVDTORCH_TIMEOUT": "20"},
        expect_success=False,
        kill_rank=2,
        kill_after="looping",
    )
    for r in results[:2]:
        assert r.returncode == 0, f"rank {r.rank} failed:\n{r.output}"
        assert "shutdown took" in r.output and "nothing writes" not in r.output, r.output
