"""Runs another worker's check with every CPU tensor handed to the engine as
simulated-device memory (HVDTORCH_SIM_DEVICE=1, set by the test), then checks
that the device paths were taken and staged through pinned memory only."""

import importlib
import json
import os
import time

import hvdtorch as hvd
from hvdtorch import _C, runtime
from hvdtorch.collectives import process_sets


def through_device(target: str, *args: str) -> None:
    assert _C.sim_device_mode(), "HVDTORCH_SIM_DEVICE=1 did not reach the extension"
    module, function = target.split(":")
    getattr(importlib.import_module(module), function)(*args)
    unpinned = _C.sim_unpinned_engine_copies()
    assert unpinned == 0, f"rank {hvd.rank()}: {unpinned} engine copies went through unregistered host memory"


def device_path(reducer: str) -> None:
    """A device-native all-reduce path runs once per all-reduce unit on
    device tensors, with the CPU results: every op and dtype, a fused group
    with scales, and async handles waited out of order. reducer="ring": the
    device ring (device memory, interprocess links under
    HVDTORCH_SIM_INTERPROCESS=1; unequal chunks, many segments when
    HVDTORCH_DEVICE_RING_SLOT_BYTES is small). reducer="native": the backend's
    device collectives (the device group: Gloo standing in for NCCL), which
    a broadcast, an all-gather, a reduce-scatter and an alltoall take too,
    and a process set through device groups of its own (with "ring": a
    process set's own device ring, torn down with the handshake when the
    set is removed)."""
    import torch

    assert _C.sim_device_mode()
    runs = {"ring": _C.device_ring_runs, "native": _C.device_native_runs}[reducer]
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    before = runs()
    units = 0
    for dtype in (torch.float32, torch.float64, torch.int32, torch.float16, torch.bfloat16):
        for op, name in (
            (hvd.Sum, "Sum"),
            (hvd.Average, "Average"),
            (hvd.Min, "Min"),
            (hvd.Max, "Max"),
            (hvd.Product, "Product"),
        ):

            def val(q):
                return (1 + (q + torch.arange(1111)) % 3).to(dtype)

            got = hvd.allreduce(val(r), op=op, name=f"dr.{dtype}.{name}", reducer=reducer)
            units += 1
            stack = torch.stack([val(q).double() for q in range(n)])
            want = {
                "Sum": stack.sum(0),
                "Average": stack.sum(0) / n if dtype.is_floating_point else (stack.sum(0) / n).trunc(),
                "Min": stack.min(0).values,
                "Max": stack.max(0).values,
                "Product": stack.prod(0),
            }[name]
            tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
            torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol, msg=f"{dtype} {name}")
    xs = [torch.full((k * 37 + 3,), float(r + 1)) for k in range(4)]
    outs = hvd.grouped_allreduce(
        xs, op=hvd.Average, prescale_factor=2.0, postscale_factor=5.0, name="dr.group", reducer=reducer
    )
    units += 1  # one fused unit (the group is far below the fusion threshold)
    for k, out in enumerate(outs):
        torch.testing.assert_close(out, torch.full_like(out, 2.0 * 5.0 * (n + 1) / 2), msg=f"group tensor {k}")
    handles = [
        hvd.allreduce_async(torch.full((1000,), float(k + r)), op=hvd.Sum, name=f"dr.async.{k}", reducer=reducer)
        for k in range(6)
    ]
    for k in reversed(range(6)):
        out = hvd.synchronize(handles[k])
        assert torch.equal(out, torch.full((1000,), float(n * k + n * (n - 1) / 2))), f"async {k}"
    ran = runs() - before
    # Async all-reduces may fuse: at least one more unit, at most six.
    assert units + 1 <= ran <= units + 6, f"rank {r}: {ran} {reducer} device runs for {units} + 1..6 units"
    if reducer == "native":
        # The broadcast takes the device group too.
        before = runs()
        x = torch.arange(50, dtype=torch.float32) + r
        hvd.broadcast_(x, root_rank=n - 1, name="dr.broadcast")
        assert torch.equal(x, torch.arange(50, dtype=torch.float32) + n - 1), f"rank {r}: broadcast {x[:4]}"
        assert runs() == before + 1, f"rank {r}: the broadcast did not take the device group"
        # So do the all-gather (rank q gives q + 1 rows: padded blocks) and the
        # reduce-scatter (7 rows: unequal shares; Average with scales).
        before = runs()
        rows = torch.arange(3 * (r + 1), dtype=torch.float64).reshape(r + 1, 3) + 100 * r
        got = hvd.allgather(rows, name="dr.allgather")
        want = torch.cat([torch.arange(3 * (q + 1), dtype=torch.float64).reshape(q + 1, 3) + 100 * q for q in range(n)])
        assert torch.equal(got, want), f"rank {r}: allgather {got}"
        x = torch.arange(14, dtype=torch.float32).reshape(7, 2) * (r + 1)
        got = hvd.reducescatter(x, op=hvd.Average, prescale_factor=2.0, postscale_factor=3.0, name="dr.rs")
        mine = [7 // n + (1 if q < 7 % n else 0) for q in range(n)]
        first = sum(mine[:r])
        full = torch.arange(14, dtype=torch.float32).reshape(7, 2) * (n + 1) / 2 * 2.0 * 3.0
        torch.testing.assert_close(got, full[first : first + mine[r]], msg=f"rank {r}: reducescatter")
        assert runs() == before + 2, f"rank {r}: {runs() - before} runs for an allgather and a reducescatter"
        # And the alltoall: rank r sends (r + d) % 3 rows to rank d.
        before = runs()
        splits = torch.tensor([(r + d) % 3 for d in range(n)], dtype=torch.int32)
        rows = torch.cat([torch.full((int(splits[d]), 2), 10.0 * r + d) for d in range(n)])
        got, received = hvd.alltoall(rows, splits=splits, name="dr.alltoall")
        want = torch.cat([torch.full(((s + r) % 3, 2), 10.0 * s + r) for s in range(n)])
        assert torch.equal(got, want), f"rank {r}: alltoall {got}"
        assert received.tolist() == [(s + r) % 3 for s in range(n)] and received.dtype == torch.int32
        assert runs() == before + 1, f"rank {r}: the alltoall did not take the device group"
        # A process set has device groups of its own.
        ps = hvd.add_process_set([0, n - 1])
        before = runs()
        if r in (0, n - 1):
            got = hvd.allreduce(
                torch.full((100,), float(r)), op=hvd.Sum, name="dr.set", reducer=reducer, process_set=ps
            )
            assert torch.equal(got, torch.full((100,), float(n - 1))), f"rank {r}: set allreduce {got[:4]}"
            got = hvd.allgather(torch.full((r + 1, 2), float(r)), name="dr.set.ag", process_set=ps)
            want = torch.cat([torch.zeros(1, 2), torch.full((n, 2), float(n - 1))])
            assert torch.equal(got, want), f"rank {r}: set allgather {got}"
            assert runs() == before + 2, f"rank {r}: {runs() - before} device runs for the set's two ops"
        hvd.remove_process_set(ps)
    if reducer == "ring" and n > 2:
        # A process set gets a device ring of its own, closed with the handshake
        # when the set is removed, however late a member comes to remove it:
        # remove_process_set's steps, with the last rank 0.3 s late to the
        # engine's removal (it would line the ranks up with a barrier first).
        ps = hvd.add_process_set([0, n - 1])
        before = runs()
        if r in (0, n - 1):
            got = hvd.allreduce(torch.full((300,), float(r)), op=hvd.Sum, name="dr.set", reducer="ring", process_set=ps)
            assert torch.equal(got, torch.full((300,), float(n - 1))), f"rank {r}: set allreduce {got[:4]}"
            assert runs() == before + 1, f"rank {r}: the set's all-reduce did not take its device ring"
        hvd.barrier()
        if r == n - 1:
            time.sleep(0.3)
        runtime.state().engine.remove_process_set(ps.process_set_id)
        hvd.barrier()
        runtime.drop_set_groups(ps.process_set_id)
        process_sets.forget(ps)
        assert _C.sim_released_while_open() == 0, f"rank {r}: the set's device ring freed an inbox a peer had open"
    hvd.shutdown()
    unpinned = _C.sim_unpinned_engine_copies()
    assert unpinned == 0, f"rank {r}: {unpinned} unpinned engine copies"
    # The device ring's teardown freed each inbox only after its peer had closed it.
    assert _C.sim_released_while_open() == 0, f"rank {r}: freed device memory a peer still had open"


def auto_prefers_the_device_group() -> None:
    """reducer="auto" on device tensors takes the device group (NCCL on
    CUDA) where it serves, though the device ring applies too (interprocess
    devices on one host); reducer="ring" still takes the device ring."""
    import torch

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    ring, native = _C.device_ring_runs(), _C.device_native_runs()
    want = torch.full((1000,), float(n * (n + 1) // 2))
    got = hvd.allreduce(torch.full((1000,), float(r + 1)), op=hvd.Sum, name="auto", reducer="auto")
    assert torch.equal(got, want), f"rank {r}: auto {got[:4]}"
    assert _C.device_native_runs() == native + 1, f"rank {r}: auto did not take the device group"
    assert _C.device_ring_runs() == ring, f"rank {r}: auto took the device ring"
    got = hvd.allreduce(torch.full((1000,), float(r + 1)), op=hvd.Sum, name="ring", reducer="ring")
    assert torch.equal(got, want), f"rank {r}: ring {got[:4]}"
    assert _C.device_ring_runs() == ring + 1, f"rank {r}: reducer='ring' did not take the device ring"
    hvd.shutdown()


def auto_calibrated(expect: str) -> None:
    """reducer="auto" on interprocess devices where the device group, the
    device ring and staging all apply: the first auto all-reduce measures
    the three routes once (HVDTORCH_DEVICE_CALIBRATION_BYTES), and the
    following ones take the route the measurement favours. The test makes
    one route slow through the simulated device's costs: `expect` "ring"
    (host copies slow: the device group and staging both copy through the
    host) or "not-ring" (reduction kernels slow: only the ring runs them)."""
    import torch

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    want = torch.full((1000,), float(n * (n + 1) // 2))
    # The first auto all-reduce on the device calibrates, the others do not.
    got = hvd.allreduce(torch.full((1000,), float(r + 1)), op=hvd.Sum, name="first", reducer="auto")
    assert torch.equal(got, want), f"rank {r}: first {got[:4]}"
    assert _C.device_calibrations() == 1, f"rank {r}: {_C.device_calibrations()} calibrations, want 1"
    described = _C.last_device_calibration()
    for route in ("native", "ring", "staged"):
        assert route in described, f"rank {r}: the calibration did not time {route}: {described}"
    ring, native = _C.device_ring_runs(), _C.device_native_runs()
    got = hvd.allreduce(torch.full((1000,), float(r + 1)), op=hvd.Sum, name="second", reducer="auto")
    assert torch.equal(got, want), f"rank {r}: second {got[:4]}"
    group = hvd.grouped_allreduce([torch.full((k + 5,), float(r + k)) for k in range(3)], op=hvd.Sum, name="group")
    for k, t in enumerate(group):
        assert torch.equal(t, torch.full((k + 5,), float(n * (n - 1) // 2 + n * k))), f"rank {r}: group {k} {t}"
    assert _C.device_calibrations() == 1, f"rank {r}: calibrated again"
    took_ring = _C.device_ring_runs() - ring
    if expect == "ring":
        assert took_ring == 2, f"rank {r}: {took_ring} of 2 auto all-reduces took the device ring ({described})"
        assert _C.device_native_runs() == native, f"rank {r}: auto took the device group ({described})"
        # Adasum's coefficients need whole vectors: staged, although the ring wins for element-wise ops.
        # Orthogonal inputs: Adasum is their sum.
        ring = _C.device_ring_runs()
        x = torch.zeros(1000)
        x[r] = r + 1
        got = hvd.allreduce(x, op=hvd.Adasum, name="adasum")
        want = torch.zeros(1000)
        want[:n] = torch.arange(1, n + 1, dtype=torch.float32)
        torch.testing.assert_close(got, want, msg=lambda m: f"rank {r}: Adasum with the ring calibrated fastest: {m}")
        assert _C.device_ring_runs() == ring, f"rank {r}: auto ran Adasum on the device ring"
    else:
        assert took_ring == 0, f"rank {r}: auto took the device ring with slow kernels ({described})"
    hvd.shutdown()
    # The timeline shows the calibration as a phase of the op that ran it, and of no other.
    events = json.load(open(os.environ["HVDTORCH_TIMELINE"].replace("{rank}", str(r))))
    ops = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    calibrating = sorted({ops[e["pid"]] for e in events if e["name"] == "DEVICE_CALIBRATION" and e["ph"] == "B"})
    assert len(calibrating) == 1 and "first" in calibrating[0], f"rank {r}: calibration phases on {calibrating}"


def _staged_times_at_first_probe(described: str) -> dict:
    """{host reducer: ms} of each staged way at the smallest probe, from
    the calibration's line ("ms at 4 KiB, ...: native 0.9 1.0; staged:node 0.1 0.2; ...")."""
    ways = described.split(": ", 1)[1].split("; ")
    times = {}
    for way in ways:
        name, *ms = way.split()
        if name.startswith("staged:"):
            times[name.split(":", 1)[1]] = float(ms[0])
    return times


def auto_stages_through_the_fastest_host_reducer() -> None:
    """reducer="auto" on device tensors where the device group and staging
    apply (the device ring off): the calibration times staging once per host
    reducer, and every staged all-reduce at the smallest probe's size then
    runs on the host reducer it measured fastest there (not the host cost
    model's pick, which may explore another). The device group goes through
    Gloo over TCP, staging through shared memory: staged wins here."""
    import torch

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    count = 1024  # 4 KiB of float32: the smallest probe
    want = torch.full((count,), float(n * (n + 1) // 2))
    native = _C.device_native_runs()
    for i in range(10):
        got = hvd.allreduce(torch.full((count,), float(r + 1)), op=hvd.Sum, name=f"staged.{i}", reducer="auto")
        assert torch.equal(got, want), f"rank {r}: op {i}: {got[:4]}"
    described = _C.last_device_calibration()
    assert _C.device_calibrations() == 1, f"rank {r}: {_C.device_calibrations()} calibrations"
    staged = _staged_times_at_first_probe(described)
    assert len(staged) >= 2, f"rank {r}: staging timed through {sorted(staged)} only: {described}"
    # The first op calibrated (and may have taken any way); the others ran the model's.
    took_native = _C.device_native_runs() - native - 6 * 2  # the calibration's runs: a warm-up and five, two probes
    assert took_native <= 1, f"rank {r}: auto kept the device group ({took_native} runs) over staging: {described}"
    fastest = min(staged.values())
    allowed = {name for name, ms in staged.items() if ms == fastest}  # equal as printed: either
    hvd.shutdown()
    events = json.load(open(os.environ["HVDTORCH_TIMELINE"].replace("{rank}", str(r))))
    ops = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    ran = {}
    for e in events:
        if e["ph"] == "B" and e["name"].startswith("ALLREDUCE:") and ops.get(e["pid"], "").startswith("staged."):
            ran.setdefault(ops[e["pid"]].split(".", 1)[1], set()).add(e["name"].split(":", 1)[1])
    for i in range(1, 10):
        assert ran.get(str(i)), f"rank {r}: op {i} was not staged ({sorted(ran)}): {described}"
        assert ran[str(i)] <= allowed, f"rank {r}: op {i} staged through {ran[str(i)]}, fastest {allowed}: {described}"


def device_ring_turned_off() -> None:
    """HVDTORCH_DEVICE_RING=0: reducer="ring" on device tensors is staged
    through the host ring although the devices share memory."""
    import torch

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    before = _C.device_ring_runs()
    got = hvd.allreduce(torch.full((1000,), float(r + 1)), op=hvd.Sum, name="off", reducer="ring")
    assert torch.equal(got, torch.full((1000,), float(n * (n + 1) / 2))), f"rank {r}: {got[:4]}"
    assert _C.device_ring_runs() == before, f"rank {r}: the device ring ran with HVDTORCH_DEVICE_RING=0"
    hvd.shutdown()


def back_to_back(units: str, count: str) -> None:
    """`units` device-ring all-reduces submitted at once (fusion off: one
    unit each), so the executor runs them back to back while the host never
    waits for the device: a rank starts writing the next all-reduce into its
    neighbour's slots while that neighbour's stream may still be reading
    the last segments of the one before (the test makes one rank's device
    slow, so that it does). Each all-reduce has values of its own, so a
    slot overwritten before its last read shows as a wrong result, and all
    of them are named."""
    import torch

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    before = _C.device_ring_runs()
    count = int(count)
    handles = [
        hvd.allreduce_async(
            torch.arange(count, dtype=torch.float32) + 1000 * k + r, op=hvd.Sum, name=f"b2b.{k}", reducer="ring"
        )
        for k in range(int(units))
    ]
    wrong = {}
    for k, h in enumerate(handles):
        got = hvd.synchronize(h)
        want = n * (torch.arange(count, dtype=torch.float32) + 1000 * k) + n * (n - 1) / 2
        bad = (got != want).nonzero().flatten()
        if bad.numel():
            wrong[k] = f"{bad.numel()} elements from [{int(bad[0])}] ({got[bad[0]]}, want {want[bad[0]]})"
    assert not wrong, f"rank {r}: wrong all-reduces {wrong}"
    assert _C.device_ring_runs() - before == int(units), f"rank {r}: {_C.device_ring_runs() - before} device ring runs"
    hvd.shutdown()


def seeds_apart() -> None:
    """Every rank's simulated device seeds its streams differently, though
    the job has one HVDTORCH_SIM_SEED: no two ranks sleep the same delays."""
    import torch

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    mine = torch.tensor([_C.sim_stream_seed(s) & ((1 << 62) - 1) for s in range(3)], dtype=torch.int64)
    seeds = hvd.allgather(mine.unsqueeze(0), name="seeds")
    assert len({int(x) for x in seeds.flatten()}) == 3 * n, f"rank {r}: streams of two ranks share a seed: {seeds}"
    hvd.shutdown()


def fails_naming_its_seed() -> None:
    """Prints the HVDTORCH_SIM_SEED this rank was started with, and fails."""
    print(f"started with HVDTORCH_SIM_SEED={os.environ.get('HVDTORCH_SIM_SEED')}", flush=True)
    raise SystemExit(3)
