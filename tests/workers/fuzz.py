"""Seeded fuzzing of multi-rank op sequences (tests/test_fuzz.py, `make fuzz`).

Every rank draws the same plan from the seed: steps of ops, each a random
collective (allreduce in and out of place, grouped_allreduce, allgather,
grouped_allgather, broadcast in and out of place, alltoall, reducescatter,
grouped_reducescatter, barrier) with a random dtype, shape (empty, scalar,
odd), reduce op, scale factors, root, splits and process set (the global set
or a subset), named from a small pool so names are reused. A step is either
one blocking call or a batch of asynchronous calls submitted in a different
order on every rank and synchronized in yet another order. Some ops are
deliberately wrong: one rank submits another shape, dtype, reduce op, root or
scale factor (every rank of the op's set must raise HvdError naming the
mismatch), or every rank passes an argument that is invalid (ValueError
before anything is sent).

Every input is a deterministic function of (seed, op, rank), so each rank
computes the reference result of every op from every rank's inputs, in
float64/int64, independently of hvdtorch. A call must return the reference
or raise the documented error; a hang is cut by HVDTORCH_TIMEOUT and the
harness deadline. Each rank prints one summary line:
    FUZZ rank=<r> planned=<ops in the plan> ops=<this rank's> checked=<n> mismatches=<n> invalid=<n>
"""

import random
import time

import torch

import hvdtorch as hvd

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int32,
    torch.int64,
    torch.int8,
    torch.uint8,
    torch.bool,
]
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
KINDS = [
    "allreduce",
    "allreduce_",
    "grouped_allreduce",
    "allgather",
    "grouped_allgather",
    "broadcast",
    "broadcast_",
    "alltoall",
    "reducescatter",
    "grouped_reducescatter",
    "barrier",
]


def _shape(rng, allow_scalar=True):
    r = rng.random()
    if r < 0.1 and allow_scalar:
        return []
    if r < 0.2:
        return [0] + ([rng.randint(1, 3)] if rng.random() < 0.5 else [])
    if r < 0.25:
        return [rng.randint(1000, 5000)]  # large enough to be cut into several ring segments' worth of work
    return [rng.randint(1, 7) for _ in range(rng.randint(1, 3))]


def _value_range(dtype):
    if dtype == torch.bool:
        return 0, 2
    if dtype == torch.uint8:
        return 0, 3
    return -3, 4


def _input(seed, op_index, rank, shape, dtype, tensor_index=0):
    g = torch.Generator().manual_seed((seed * 1000003 + op_index * 131 + rank * 7 + tensor_index) % (2**62))
    lo, hi = _value_range(dtype)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def _reduce(xs, op, dtype, prescale=1.0, postscale=1.0):
    """Reference reduction over ranks in float64 (floats) or int64 (integers), cast back."""
    if dtype == torch.bool:
        stacked = torch.stack([x.to(torch.int64) for x in xs])
        out = stacked.amax(0) if op in ("Sum", "Max") else stacked.amin(0)
        return out.to(torch.bool)
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    stacked = torch.stack([x.to(wide) * prescale if prescale != 1.0 else x.to(wide) for x in xs])
    if op in ("Sum", "Average"):
        out = stacked.sum(0)
        if op == "Average":
            out = out / len(xs) if dtype.is_floating_point else torch.div(out, len(xs), rounding_mode="trunc")
    elif op == "Min":
        out = stacked.amin(0)
    elif op == "Max":
        out = stacked.amax(0)
    else:
        out = stacked.prod(0)
    if postscale != 1.0:
        out = out * postscale
    return out.to(dtype)


def _close(got, want, what):
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} vs {want.dtype}"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
    if want.dtype.is_floating_point:
        tol = {torch.float16: 1e-3, torch.bfloat16: 1e-2}.get(want.dtype, 1e-6)
        torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(got, want), f"{what}: {got.tolist()} vs {want.tolist()}"


class Op:
    """One planned op: what every rank submits (with the deliberate fault, if any) and its reference."""

    def __init__(self, rng, index, seed, sets, name):
        self.index, self.seed, self.name = index, seed, name
        self.kind = rng.choice(KINDS)
        self.set = rng.choice(sets)  # (ProcessSet or None, member ranks)
        self.members = self.set[1]
        self.dtype = rng.choice(DTYPES)
        self.op = rng.choice(list(OPS))
        if self.dtype == torch.bool:
            self.op = rng.choice(["Sum", "Min", "Max", "Product"])
        self.scales = (1.0, 1.0)
        if self.dtype.is_floating_point and rng.random() < 0.3:
            self.scales = (rng.choice([0.5, 2.0]), rng.choice([0.5, 1.0, 4.0]))
        self.shape = _shape(rng, allow_scalar=self.kind not in ("reducescatter", "grouped_reducescatter", "alltoall"))
        self.count = rng.randint(1, 3) if self.kind.startswith("grouped") else 1
        self.rows = [rng.randint(0, 3) for _ in self.members]  # allgather first dims
        self.root = rng.choice(self.members)
        self.splits = [[rng.randint(0, 2) for _ in self.members] for _ in self.members]  # alltoall
        # Faults: one member differs (mismatch), or everyone passes a bad argument.
        self.fault = None
        r = rng.random()
        if r < 0.06 and self.kind != "barrier" and len(self.members) > 1:
            self.fault = "mismatch"
            self.odd = rng.choice(self.members)
            self.odd_field = rng.choice(self._mismatchable())
        elif r < 0.09 and self.kind in ("broadcast", "allreduce", "alltoall"):
            self.fault = "invalid"

    def _mismatchable(self):
        if self.kind in ("allreduce", "allreduce_", "grouped_allreduce"):
            # Scale factors exist for floating types only (elsewhere a local ValueError).
            return ["shape", "dtype", "op"] + (["prescale"] if self.dtype.is_floating_point else [])
        if self.kind in ("reducescatter", "grouped_reducescatter"):
            return ["shape", "dtype", "op"]
        if self.kind in ("broadcast", "broadcast_"):
            return ["root", "shape", "dtype"]
        return ["trailing", "dtype"]  # allgather, alltoall: only the first dimension may differ

    # -- what a rank submits -----------------------------------------------------
    def _fields(self, rank):
        dtype, shape, op, scales, root = self.dtype, list(self.shape), self.op, self.scales, self.root
        if self.fault == "mismatch" and rank == self.odd:
            f = self.odd_field
            if f == "shape":
                shape = shape + [2] if len(shape) < 3 else shape[:-1]
            elif f == "dtype":
                # Another dtype of the same family, valid with the same op and scales.
                if dtype.is_floating_point:
                    dtype = torch.float64 if dtype != torch.float64 else torch.float32
                elif dtype == torch.bool:
                    dtype = torch.uint8
                else:
                    dtype = torch.int64 if dtype != torch.int64 else torch.int32
            elif f == "op":
                op = "Max" if op != "Max" else "Min"
            elif f == "prescale":
                scales = (scales[0] * 2, scales[1])
            elif f == "root":
                root = next(m for m in self.members if m != root)
            elif f == "trailing":
                shape = (shape or [1]) + [3]
        return dtype, shape, op, scales, root

    def inputs(self, rank):
        dtype, shape, _, _, _ = self._fields(rank)
        if self.kind in ("allgather", "grouped_allgather"):
            shape = [self.rows[self.members.index(rank)]] + shape[1:] if shape else []
        if self.kind == "alltoall":
            shape = [sum(self.splits[self.members.index(rank)])] + shape[1:]
        return [_input(self.seed, self.index, rank, shape, dtype, t) for t in range(self.count)]

    def submit(self, rank):
        """Starts the op on `rank`; returns a function that waits and returns the results."""
        dtype, shape, op, (pre, post), root = self._fields(rank)
        ps, name, xs = self.set[0], self.name, self.inputs(rank)
        k = self.kind
        if k in ("allreduce", "allreduce_"):
            f = hvd.allreduce_async if k == "allreduce" else hvd.allreduce_async_
            h = f(xs[0], name=name, op=OPS[op], prescale_factor=pre, postscale_factor=post, process_set=ps)
            return lambda: [hvd.synchronize(h)]
        if k == "grouped_allreduce":
            h = hvd.grouped_allreduce_async(
                xs, name=name, op=OPS[op], prescale_factor=pre, postscale_factor=post, process_set=ps
            )
            return lambda: hvd.synchronize(h)
        if k == "allgather":
            h = hvd.allgather_async(xs[0], name=name, process_set=ps)
            return lambda: [hvd.synchronize(h)]
        if k == "grouped_allgather":
            h = hvd.grouped_allgather_async(xs, name=name, process_set=ps)
            return lambda: hvd.synchronize(h)
        if k in ("broadcast", "broadcast_"):
            f = hvd.broadcast_async if k == "broadcast" else hvd.broadcast_async_
            h = f(xs[0], root_rank=root, name=name, process_set=ps)
            return lambda: [hvd.synchronize(h)]
        if k == "alltoall":
            splits = self.splits[self.members.index(rank)]
            h = hvd.alltoall_async(xs[0], splits=splits, name=name, process_set=ps)
            return lambda: list(hvd.synchronize(h))
        if k in ("reducescatter", "grouped_reducescatter"):
            f = hvd.reducescatter_async if k == "reducescatter" else hvd.grouped_reducescatter_async
            h = f(
                xs[0] if k == "reducescatter" else xs,
                name=name,
                op=OPS[op],
                process_set=ps,
                prescale_factor=pre,
                postscale_factor=post,
            )
            return (lambda: [hvd.synchronize(h)]) if k == "reducescatter" else (lambda: hvd.synchronize(h))
        if k == "barrier":
            hvd.barrier(process_set=ps)
            return lambda: []
        raise AssertionError(k)

    def submit_invalid(self, rank):
        """The same bad argument on every rank: ValueError before anything is sent."""
        ps, xs = self.set[0], self.inputs(rank)
        if self.kind == "broadcast":
            hvd.broadcast_async(xs[0], root_rank=hvd.size() + 3, name=self.name, process_set=ps)
        elif self.kind == "allreduce":
            hvd.allreduce_async(torch.ones(3, dtype=torch.bool), name=self.name, op=hvd.Average, process_set=ps)
        else:
            bad = list(self.splits[self.members.index(rank)])
            bad[0] += 1  # splits no longer sum to the rows
            hvd.alltoall_async(xs[0], splits=bad, name=self.name, process_set=ps)

    # -- what it must return ---------------------------------------------------------
    def expected(self, rank):
        n, me = len(self.members), self.members.index(rank)
        every = [self.inputs(m) for m in self.members]
        out = []
        for t in range(self.count):
            xs = [e[t] for e in every]
            k = self.kind
            if k in ("allreduce", "allreduce_", "grouped_allreduce"):
                out.append(_reduce(xs, self.op, self.dtype, *self.scales))
            elif k in ("allgather", "grouped_allgather"):
                out.append(torch.cat([x.reshape(1) if x.dim() == 0 else x for x in xs]))
            elif k in ("broadcast", "broadcast_"):
                out.append(xs[self.members.index(self.root)])
            elif k == "alltoall":
                blocks = []
                for q, x in enumerate(xs):
                    start = sum(self.splits[q][:me])
                    blocks.append(x[start : start + self.splits[q][me]])
                out += [torch.cat(blocks), torch.tensor([self.splits[q][me] for q in range(n)], dtype=torch.int32)]
            elif k in ("reducescatter", "grouped_reducescatter"):
                full = _reduce(xs, self.op, self.dtype, *self.scales)
                rows = full.shape[0]
                counts = [rows // n + (1 if i < rows % n else 0) for i in range(n)]
                out.append(full[sum(counts[:me]) : sum(counts[:me]) + counts[me]])
        return out

    def describe(self):
        return (
            f"op {self.index} {self.kind} '{self.name}' {self.dtype} {self.shape} {self.op} scales={self.scales} "
            f"set={self.members} fault={self.fault}"
        )


def run(seed: str, steps: str):
    seed, steps = int(seed), int(steps)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    subset = list(range(0, size, 2)) if size > 2 else [0]
    sub = hvd.add_process_set(subset)
    sets = [(None, list(range(size))), (None, list(range(size))), (sub, subset)]
    plan_rng = random.Random(seed)  # identical on every rank
    order_rng = random.Random(seed * 31 + rank)  # this rank's own submission orders
    counts = {"ops": 0, "checked": 0, "mismatches": 0, "invalid": 0}
    index = 0
    t0 = time.time()
    for _ in range(steps):
        batch = plan_rng.random() < 0.7
        ops = []
        names = set()
        for _ in range(plan_rng.randint(2, 8) if batch else 1):
            name = f"fz{plan_rng.randint(0, 40)}"
            while name in names:
                name = f"fz{plan_rng.randint(0, 40)}"
            names.add(name)
            op = Op(plan_rng, index, seed, sets, name)
            index += 1
            if batch and op.kind == "barrier":
                op.kind = "allreduce"  # a barrier blocks; it runs as a step of its own
            ops.append(op)
        mine = [op for op in ops if rank in op.members]
        counts["ops"] += len(mine)
        waits = []
        for op in sorted(mine, key=lambda _: order_rng.random()) if batch else mine:
            if op.fault == "invalid":
                try:
                    op.submit_invalid(rank)
                except ValueError:
                    counts["invalid"] += 1
                    continue
                raise AssertionError(f"rank {rank}: {op.describe()}: invalid argument accepted")
            waits.append((op, op.submit(rank)))
        for op, wait in sorted(waits, key=lambda _: order_rng.random()):
            try:
                got = wait()
            except hvd.HvdError as e:
                assert op.fault == "mismatch", f"rank {rank}: {op.describe()}: unexpected error {e}"
                assert "mismatched" in str(e) and op.name in str(e), f"rank {rank}: {op.describe()}: {e}"
                counts["mismatches"] += 1
                continue
            assert op.fault is None, f"rank {rank}: {op.describe()}: no error although {op.fault}"
            want = op.expected(rank)
            assert len(got) == len(want), f"rank {rank}: {op.describe()}: {len(got)} results, wanted {len(want)}"
            for i, (g, w) in enumerate(zip(got, want)):
                _close(g, w, f"rank {rank}: {op.describe()} result {i}")
            counts["checked"] += 1
    hvd.barrier()  # shutdown() stops every rank: not before the others are done with their sets' ops
    hvd.shutdown()
    print(
        f"FUZZ rank={rank} planned={index} "
        + " ".join(f"{k}={v}" for k, v in counts.items())
        + f" seconds={time.time() - t0:.1f}",
        flush=True,
    )
