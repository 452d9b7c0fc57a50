"""Rank-side checks of init/shutdown, topology and autograd-aware ops."""

import torch
import torch.distributed as dist

import hvdtorch as hvd


def topology(expected: str):
    """expected: "rank:local_rank:local_size:cross_rank:cross_size,..." for every rank."""
    hvd.init()
    want = expected.split(",")[hvd.rank()]
    got = f"{hvd.rank()}:{hvd.local_rank()}:{hvd.local_size()}:{hvd.cross_rank()}:{hvd.cross_size()}"
    assert got == want, f"topology {got} != {want}"
    assert hvd.size() == len(expected.split(","))
    hvd.shutdown()


def reinit_and_idempotent_shutdown():
    hvd.init()
    hvd.init()  # second init is a no-op
    a = hvd.allreduce(torch.ones(2), op=hvd.Sum)
    hvd.shutdown()
    hvd.shutdown()  # idempotent
    assert not hvd.is_initialized()
    try:
        hvd.rank()
    except ValueError as e:
        assert "init" in str(e)
    else:
        raise AssertionError("rank() worked after shutdown")
    hvd.init()
    b = hvd.allreduce(torch.ones(2), op=hvd.Sum)
    assert torch.equal(a, b)
    hvd.shutdown()
    assert not dist.is_initialized(), "shutdown left the default group that init created"


def adopt_existing_group():
    dist.init_process_group("gloo")
    hvd.init()
    assert hvd.rank() == dist.get_rank() and hvd.size() == dist.get_world_size()
    assert torch.equal(hvd.allreduce(torch.ones(3), op=hvd.Sum), torch.full((3,), float(hvd.size())))
    hvd.shutdown()
    assert dist.is_initialized(), "shutdown destroyed the user's own process group"
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == dist.get_world_size()
    dist.destroy_process_group()


def autograd():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    # allreduce (Average): y = mean over ranks of x; dL/dx for L = sum(y * w) is allreduce_avg(w).
    x = torch.full((3,), float(r), requires_grad=True)
    w = torch.full((3,), float(r + 1))
    (hvd.allreduce(x) * w).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), sum(range(1, n + 1)) / n))
    # allreduce Sum: gradient is the Sum of the upstream gradients.
    x2 = torch.full((2,), 1.0, requires_grad=True)
    (hvd.allreduce(x2, op=hvd.Sum) * (r + 1)).sum().backward()
    torch.testing.assert_close(x2.grad, torch.full((2,), float(sum(range(1, n + 1)))))
    # allgather: each rank receives the averaged gradient of its own rows.
    x3 = torch.full((r + 1, 2), float(r), requires_grad=True)
    g = hvd.allgather(x3)
    assert g.shape == (sum(range(1, n + 1)), 2)
    (g * (r + 1)).sum().backward()
    torch.testing.assert_close(x3.grad, torch.full((r + 1, 2), sum(range(1, n + 1)) / n))
    # broadcast: only the root receives the (averaged) gradient.
    x4 = torch.full((2,), float(r), requires_grad=True)
    b = hvd.broadcast(x4, root_rank=n - 1)
    torch.testing.assert_close(b.detach(), torch.full((2,), float(n - 1)))
    (b * 2).sum().backward()
    want = torch.full((2,), 2.0) if r == n - 1 else torch.zeros(2)
    torch.testing.assert_close(x4.grad, want)
    # fp16 compression round trip.
    c = hvd.allreduce(torch.full((4,), 0.5 * (r + 1)), compression=hvd.Compression.fp16, op=hvd.Sum)
    assert c.dtype == torch.float32
    torch.testing.assert_close(c, torch.full((4,), 0.5 * sum(range(1, n + 1))))
    hvd.shutdown()


def timeline(path: str):
    hvd.init()
    for _ in range(3):
        hvd.allreduce(torch.ones(10), name="tl.single")
    hvd.grouped_allreduce([torch.ones(5), torch.ones(6)], name="tl.grouped")
    hs = [hvd.allreduce_async(torch.ones(4), name=f"tl.fused.{k}") for k in range(4)]
    for h in hs:
        hvd.synchronize(h)
    hvd.allgather(torch.ones(2, 2), name="tl.gather")
    hvd.shutdown()


def _thread_cpus():
    """name -> [CPU sets] of this process's threads, from /proc."""
    import os

    threads = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            name = open(f"/proc/self/task/{tid}/comm").read().strip()
            cpus = os.sched_getaffinity(int(tid))
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended while we looked
        threads.setdefault(name, []).append(set(cpus))
    return threads


def engine_threads_placed(setting: str):
    """HVDTORCH_THREAD_AFFINITY=setting: the engine's threads on the CPUs the
    rule gives (common/thread_placement.h), the caller's thread untouched."""
    import os

    allowed = sorted(os.sched_getaffinity(0))
    hvd.init()
    # 16 MiB through the ring reducer: more than a shared-memory link holds at
    # once. A link starts its sender thread only when a send finds the ring
    # full (a fast reader may always leave room), so a few ops may be needed.
    x = torch.ones(4 << 20)
    for _ in range(20):
        x.fill_(1.0)
        hvd.allreduce_(x, op=hvd.Sum, reducer="ring")
        assert torch.equal(x, torch.full_like(x, hvd.size()))
        started = torch.tensor(["hvd-shm-send" in _thread_cpus()], dtype=torch.int32)
        if hvd.allreduce(started, op=hvd.Min).item():  # every rank stops together
            break
    lr, ls = hvd.local_rank(), hvd.local_size()
    if setting == "off":
        want = set(allowed)
    elif setting == "auto":
        share = len(allowed) // ls
        placed = len(allowed) == os.cpu_count() and len(allowed) >= ls
        want = set(allowed[lr * share : (lr + 1) * share]) if placed else set(allowed)
    else:
        want = {int(setting.split(",")[lr])}
    threads = _thread_cpus()
    for name in ("hvd-control", "hvd-executor", "hvd-shm-send"):
        assert name in threads, f"rank {hvd.rank()}: no thread named {name} among {sorted(threads)}"
        for cpus in threads[name]:
            assert cpus == want, f"rank {hvd.rank()}: {name} on CPUs {sorted(cpus)}, expected {sorted(want)}"
    assert set(os.sched_getaffinity(0)) == set(allowed), "the caller's own thread was moved"
    hvd.shutdown()


def refuses_thread_affinity(setting: str):
    try:
        hvd.init()
    except ValueError as e:
        assert "HVDTORCH_THREAD_AFFINITY" in str(e), str(e)
    else:
        raise AssertionError(f"init() accepted HVDTORCH_THREAD_AFFINITY={setting}")
    assert not dist.is_initialized(), "the refused init() left its default group behind"
    hvd.init(thread_affinity="off")  # corrected: this init starts clean
    assert torch.equal(hvd.allreduce(torch.ones(3), op=hvd.Sum), torch.full((3,), 2.0))
    hvd.shutdown()
