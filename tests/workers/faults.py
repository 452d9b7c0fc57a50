"""Rank side of the fault tests (tests/test_faults.py), run by torchrun on namespaced hosts.

Every rank prints one line per event, which the test parses:
    SHM-TOKEN <token>                      rank 0, after init
    VICTIM pid=<pid>                       the rank the test will kill or stop, blocked mid-backward
    PROGRESS rank=<r> step=<i>             a rank finished step i
    SURVIVOR rank=<r> at=<unix time> error=<message>
    CLEAN rank=<r> threads=<before>/<after> fds=<before>/<after> children=<n>
    REINIT-OK rank=<r>
"""

import os
import signal
import time

import torch

import hvdtorch as hvd


def _resources():
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def _thread_names():
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:
            pass
    return sorted(names)


def _fd_targets():
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the fd listing itself, closed meanwhile
            pass
    return sorted(out)


def _children():
    kids = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                kids += f.read().split()
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    return kids


def _say(line: str) -> None:
    # One write per line: ranks share the agent's output.
    os.write(1, (line.replace("\n", " | ") + "\n").encode())


def _survive(rank: int, error: BaseException, before) -> None:
    """What every survivor does: report the error, shut down, prove nothing is left, init again."""
    _say(f"SURVIVOR rank={rank} at={time.time():.3f} type={type(error).__name__} error={error}")
    hvd.shutdown()
    after = _resources()
    kids = _children()
    _say(
        f"CLEAN rank={rank} threads={before[0]}/{after[0]} fds={before[1]}/{after[1]} children={len(kids)} "
        f"thread_names={_thread_names()} fd_targets={_fd_targets()}"
    )
    # A fresh single-process job in the same interpreter: the launcher's
    # variables describe the job that just failed.
    for k in [
        k
        for k in os.environ
        if k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
        or k.startswith("TORCHELASTIC_")
    ]:
        del os.environ[k]
    hvd.init()
    assert hvd.size() == 1
    assert torch.equal(hvd.allreduce(torch.arange(5.0), op=hvd.Sum, name="after.reinit"), torch.arange(5.0))
    hvd.shutdown()
    _say(f"REINIT-OK rank={rank}")


def _start():
    # torch's TCPStore keeps a process-wide pipe pair open after its first use
    # (whoever uses it first); open it before counting what hvdtorch leaves.
    import torch.distributed as dist

    dist.TCPStore("127.0.0.1", 0, 1, True)
    before = _resources()
    hvd.init()
    if hvd.rank() == 0:
        _say(f"SHM-TOKEN {hvd.runtime.state().shm_token}")
    return before


def train_until_fault(victim: str, fault_step: str = "5"):
    """DistributedModel training; rank `victim` blocks in the middle of
    backward at step `fault_step` (the test then kills or stops it)."""
    victim, fault_step = int(victim), int(fault_step)
    before = _start()
    r = hvd.rank()
    torch.manual_seed(0)
    layers = [
        torch.nn.Linear(32, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 8),
    ]
    model = hvd.DistributedModel(torch.nn.Sequential(*layers), fusion_bytes=64 << 10, first_bucket_bytes=16 << 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0

    def mid_backward(grad):
        # Runs once the gradients of the last two layers exist (their buckets
        # are already with the engine) and before the first layer's.
        if r == victim and step == fault_step:
            _say(f"VICTIM pid={os.getpid()}")
            time.sleep(600)
        return grad

    try:
        for step in range(100000):
            x = torch.randn(16, 32)
            h = layers[1](layers[0](x))
            h.register_hook(mid_backward)
            out = layers[4](layers[3](layers[2](h)))
            loss = out.square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step < fault_step + 2:
                _say(f"PROGRESS rank={r} step={step}")
    except hvd.HvdError as e:
        _survive(r, e, before)
        return
    raise AssertionError("training went on although a rank was lost")


def large_allreduce_until_fault(mib: str = "16", reducer: str = "auto"):
    """All-reduces of `mib` MiB with `reducer` in a loop, each checked; the test injects a fault meanwhile."""
    before = _start()
    r, n = hvd.rank(), hvd.size()
    count = int(mib) * (1 << 20) // 4
    expected = float(n * (n + 1) // 2)
    try:
        for i in range(100000):
            t = torch.full((count,), float(r + 1))
            _say(f"LARGE-START rank={r} i={i}")
            out = hvd.allreduce(t, op=hvd.Sum, name=f"large.{i}", reducer=reducer)
            assert bool((out == expected).all()), f"rank {r}: wrong all-reduce result in round {i}"
    except hvd.HvdError as e:
        _survive(r, e, before)
        return
    raise AssertionError("all-reduces went on although the link is down")


def _rounds(tag: str, rounds: int, count: int) -> float:
    r, n = hvd.rank(), hvd.size()
    t0 = time.time()
    for i in range(rounds):
        x = torch.arange(count, dtype=torch.float32) * (r + 1) + i
        out = hvd.allreduce(x, op=hvd.Sum, name=f"{tag}.{i}")
        want = torch.arange(count, dtype=torch.float32) * (n * (n + 1) // 2) + n * i
        assert torch.equal(out, want), f"rank {r}: wrong result in round {i} of {tag}"
    return time.time() - t0


def rounds_before_and_after_impairment(rounds: str, kib: str, flag: str):
    """Checked all-reduces on a clean link, then (once the test has impaired
    it and created `flag`) the same on the slow, lossy link."""
    hvd.init()
    r = hvd.rank()
    rounds, count = int(rounds), int(kib) * 1024 // 4
    clean = _rounds("clean", rounds, count)
    _say(f"WAITING rank={r}")
    deadline = time.time() + 120
    while not os.path.exists(flag):
        assert time.time() < deadline, "the test never impaired the link"
        time.sleep(0.05)
    impaired = _rounds("impaired", rounds, count)
    _say(f"ROUNDS-OK rank={r} clean={clean:.3f} impaired={impaired:.3f}")
    hvd.shutdown()


def allreduce_until_killed(mib: str = "16", delay_ms: str = "10"):
    """The kill scenario on one machine, lighter than namespaced hosts: two
    emulated hosts of two ranks (HVDTORCH_HOSTNAME) run all-reduces of `mib`
    MiB with the node reducer (shared memory inside a host, then rank 0
    with rank 2 and rank 1 with rank 3 across hosts). In round 3, rank 3
    submits its part and kills itself `delay_ms` later, in the middle of the
    all-reduce: rank 2 learns of the death first (through shared memory) and
    closes its link to rank 0, which is waiting for it and may see the close
    before rank 2's word. Launched by torchrun or mpirun."""
    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    os.environ["HVDTORCH_HOSTNAME"] = f"emulated-host-{rank // 2}"
    hvd.init()
    r = hvd.rank()
    count = int(mib) * (1 << 20) // 4
    try:
        for i in range(100000):
            t = torch.full((count,), float(r + 1))
            if r == 3 and i == 3:
                hvd.allreduce_async(t, op=hvd.Sum, name=f"until.killed.{i}", reducer="node")
                time.sleep(int(delay_ms) / 1000)
                _say(f"VICTIM pid={os.getpid()} at={time.time():.3f}")
                os.kill(os.getpid(), signal.SIGKILL)
            hvd.allreduce(t, op=hvd.Sum, name=f"until.killed.{i}", reducer="node")
    except hvd.HvdError as e:
        _say(f"SURVIVOR rank={r} at={time.time():.3f} type={type(e).__name__} error={e}")
        hvd.shutdown()
        return
    raise AssertionError(f"rank {r}: all-reduces went on although rank 3 was killed")
