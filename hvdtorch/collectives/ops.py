"""Collective operations with Horovod's names and semantics.

Every op is asynchronous underneath: ``*_async`` returns a handle, ``poll``
tells whether it finished, ``synchronize`` waits and returns the result. The
blocking forms are ``synchronize(op_async(...))``. Ops are matched across
ranks by name; unnamed ops get ``<op>.noname.<n>``, so ranks must issue them
in the same order. Ops are negotiated by the engine's background thread, so
ranks may submit *named* ops in different orders.

Failures raise ``hvdtorch.HvdError`` (a RuntimeError) on every rank involved,
naming the op and the ranks; bad arguments raise
``hvdtorch.InvalidArgumentError`` (a ValueError and a RuntimeError, see
exceptions.py) before anything is sent.
"""

import warnings
from typing import List, Optional, Sequence

import torch

from .. import _C, runtime
from .._C import HvdError  # noqa: F401  (re-exported)
from ..exceptions import InvalidArgumentError
from .compression import Compression
from .handles import (  # noqa: F401
    check_process_set,
    contiguous,
    fresh_output,
    op_name,
    poll,
    register,
    submit,
    synchronize,
)
from .process_sets import ProcessSet, global_process_set, set_id  # noqa: F401  (re-exported)

# Reduce ops, with Horovod's values.
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5


def _resolve_op(average: Optional[bool], op: Optional[int]) -> int:
    """Horovod's deprecated ``average=`` mapped onto ``op`` (the core checks the op itself)."""
    if op is not None and average is not None:
        raise InvalidArgumentError("hvdtorch: pass either op= or the deprecated average=, not both")
    if average is not None:
        warnings.warn(
            "hvdtorch: average= is deprecated (as in Horovod); pass op=hvd.Average or op=hvd.Sum",
            DeprecationWarning,
            stacklevel=3,
        )
    if op is None:
        op = Average if average is None or average else Sum
    return op


# ---- allreduce ----------------------------------------------------------------


def _allreduce_submit(
    inputs: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
    name: str,
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    reducer: Optional[str],
    psid: int = 0,
    fuse: bool = True,
) -> int:
    return submit(
        _C.AllreduceOptions(),
        inputs,
        outputs,
        name=name,
        op=op,
        prescale=float(prescale_factor),
        postscale=float(postscale_factor),
        reducer=reducer or "",
        process_set_id=psid,
        fuse=fuse,
    )


def allreduce_async(
    tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None, reducer=None
) -> int:
    """Starts an out-of-place all-reduce; synchronize() returns the result."""
    psid = check_process_set(process_set)
    op = _resolve_op(average, op)
    src = contiguous(tensor, "allreduce")
    out = fresh_output(src)
    name = op_name("allreduce", name, psid)
    h = _allreduce_submit([src], [out], name, op, prescale_factor, postscale_factor, reducer, psid)
    return register(h, lambda _outs: out)


def allreduce_async_(
    tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None, reducer=None
) -> int:
    """Starts an in-place all-reduce of ``tensor``."""
    psid = check_process_set(process_set)
    op = _resolve_op(average, op)
    name = op_name("allreduce", name, psid)
    buf = contiguous(tensor, "allreduce_")
    h = _allreduce_submit([buf], [buf], name, op, prescale_factor, postscale_factor, reducer, psid)
    if buf is tensor:
        return register(h, lambda _outs: tensor)
    return register(h, lambda _outs: tensor.copy_(buf))


def registered_allreduce_async_(tensor, name, op, process_set=None, prescale_factor=1.0, postscale_factor=1.0) -> int:
    """Starts an in-place all-reduce of a tensor in registered memory
    (engine.registered_zeros), never fused. The engine sees the registered
    buffer and reduces it with its registered reducer (node) unless the job
    names another (ReducerSet::forRequest), which reads the peers'
    registered buffers and writes each reduced slice straight into them, so
    no byte goes through a buffer of the engine's (a fused unit would be
    packed into the fusion buffer, which grows to the size of the largest
    unit and stays). What the sharded optimizer's parameters are gathered
    with (the gradient reducer's in_place_shard strategy submits the same op
    in C++)."""
    psid = check_process_set(process_set)
    name = op_name("allreduce", name, psid)
    buf = contiguous(tensor, "registered_allreduce_async_")
    if buf is not tensor:
        raise ValueError("hvdtorch: registered_allreduce_async_ needs a contiguous tensor (one in registered memory)")
    h = _allreduce_submit([buf], [buf], name, op, prescale_factor, postscale_factor, None, psid, False)
    return register(h, lambda _outs: tensor)


def allreduce_(
    tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None, reducer=None
) -> torch.Tensor:
    return synchronize(
        allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set, reducer)
    )


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, reducer, process_set):
        ctx.op, ctx.prescale, ctx.postscale, ctx.reducer = op, prescale_factor, postscale_factor, reducer
        ctx.process_set = process_set
        return synchronize(
            allreduce_async(
                tensor,
                name=name,
                op=op,
                prescale_factor=prescale_factor,
                postscale_factor=postscale_factor,
                reducer=reducer,
                process_set=process_set,
            )
        )

    @staticmethod
    def backward(ctx, grad):
        # The gradient of an all-reduce is the same all-reduce of the gradient.
        g = synchronize(
            allreduce_async(
                grad,
                op=ctx.op,
                prescale_factor=ctx.prescale,
                postscale_factor=ctx.postscale,
                reducer=ctx.reducer,
                process_set=ctx.process_set,
            )
        )
        return g, None, None, None, None, None, None


def allreduce(
    tensor,
    average=None,
    name=None,
    compression=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
    reducer=None,
) -> torch.Tensor:
    """All-reduces ``tensor`` across ranks (Average by default); differentiable."""
    psid = check_process_set(process_set)
    op = _resolve_op(average, op)
    compression = compression or Compression.none
    compressed, cctx = compression.compress(tensor)
    reduced = _AllreduceFn.apply(
        compressed, op_name("allreduce", name, psid), op, prescale_factor, postscale_factor, reducer, process_set
    )
    return compression.decompress(reduced, cctx)


def grouped_allreduce_async(
    tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None, reducer=None
) -> int:
    """All-reduces a list of tensors as one negotiated unit (fused together)."""
    psid = check_process_set(process_set)
    op = _resolve_op(average, op)
    srcs = [contiguous(t, "grouped_allreduce") for t in tensors]
    outs = [fresh_output(t) for t in srcs]
    name = op_name("grouped_allreduce", name, psid)
    h = _allreduce_submit(srcs, outs, name, op, prescale_factor, postscale_factor, reducer, psid)
    return register(h, lambda _outs: outs)


def grouped_allreduce_async_(
    tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None, reducer=None
) -> int:
    psid = check_process_set(process_set)
    op = _resolve_op(average, op)
    bufs = [contiguous(t, "grouped_allreduce_") for t in tensors]
    name = op_name("grouped_allreduce", name, psid)
    h = _allreduce_submit(bufs, bufs, name, op, prescale_factor, postscale_factor, reducer, psid)

    def finish(_outs):
        for t, b in zip(tensors, bufs):
            if b is not t:
                t.copy_(b)
        return list(tensors)

    return register(h, finish)


def grouped_allreduce_compressed_(tensors, compression, name: str, **kwargs) -> None:
    """All-reduces ``tensors`` in place through ``compression`` (compress, reduce, decompress): one
    grouped all-reduce per dtype, named ``<name>.<dtype>``, all submitted before any is waited for.
    ``kwargs``: grouped_allreduce_async_'s op, scale factors, reducer and process_set. What a
    training front reduces outside its buckets: Adasum's update through a compressor of the user's own."""
    by_dtype = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    started = []
    for dtype, group in by_dtype.items():
        packed = [compression.compress(t) for t in group]
        handle = grouped_allreduce_async_([c for c, _ in packed], name=f"{name}.{dtype}", **kwargs)
        started.append((handle, group, packed))
    for handle, group, packed in started:
        synchronize(handle)
        for t, (c, ctx) in zip(group, packed):
            out = compression.decompress(c, ctx)  # always: a compressor may work in place
            if out is not t:
                t.copy_(out)


class _GroupedAllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, reducer, process_set, *tensors):
        # Everything but the name: the backward runs the same grouped all-reduce.
        ctx.group_args = dict(
            op=op,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
            process_set=process_set,
            reducer=reducer,
        )
        return tuple(synchronize(grouped_allreduce_async(list(tensors), name=name, **ctx.group_args)))

    @staticmethod
    def backward(ctx, *grads):
        # As for one tensor: the same grouped all-reduce of the gradients.
        reduced = synchronize(grouped_allreduce_async(list(grads), **ctx.group_args))
        return (None, None, None, None, None, None, *reduced)


def grouped_allreduce(
    tensors,
    average=None,
    name=None,
    compression=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
    reducer=None,
) -> List[torch.Tensor]:
    """All-reduces a list of tensors as one negotiated unit; differentiable (the
    gradients are all-reduced with the same op, scaling and process set)."""
    psid = check_process_set(process_set)
    op = _resolve_op(average, op)
    compression = compression or Compression.none
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedAllreduceFn.apply(
        op_name("grouped_allreduce", name, psid),
        op,
        prescale_factor,
        postscale_factor,
        reducer,
        process_set,
        *[p[0] for p in pairs],
    )
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


def grouped_allreduce_(
    tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None, reducer=None
) -> List[torch.Tensor]:
    return synchronize(
        grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor, process_set, reducer)
    )


# ---- allgather ----------------------------------------------------------------


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """A scalar gathers as one row."""
    return t.reshape(1) if t.dim() == 0 else t


def allgather_async(tensor, name=None, process_set=None) -> int:
    """Concatenates every rank's tensor along dimension 0 (sizes may differ there)."""
    psid = check_process_set(process_set)
    src = _as_rows(contiguous(tensor, "allgather"))
    h = submit(_C.AllgatherOptions(), [src], name=op_name("allgather", name, psid), process_set_id=psid)
    return register(h, lambda outs: outs[0])


def _rows_of_every_rank(dim0s: Sequence[int], process_set) -> torch.Tensor:
    """[set size, len(dim0s)]: every member's first dimension of each tensor."""
    mine = torch.tensor(list(dim0s), dtype=torch.int64)
    return synchronize(allgather_async(mine.reshape(1, -1), process_set=process_set))


def _set_rank(process_set) -> int:
    """This rank's position in the set (the rows of an allgather that are its own)."""
    return (process_set or global_process_set).rank()


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim0 = tensor.shape[0] if tensor.dim() > 0 else 1
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad):
        # Horovod's rule: average the incoming gradient, then take this rank's rows.
        ps = ctx.process_set
        reduced = synchronize(allreduce_async(grad, op=Average, process_set=ps))
        offset = int(_rows_of_every_rank([ctx.dim0], ps)[: _set_rank(ps), 0].sum())
        return reduced.narrow(0, offset, ctx.dim0), None, None


def allgather(tensor, name=None, process_set=None) -> torch.Tensor:
    psid = check_process_set(process_set)
    return _AllgatherFn.apply(tensor, op_name("allgather", name, psid), process_set)


def grouped_allgather_async(tensors, name=None, process_set=None) -> int:
    """All-gathers a list of tensors as one negotiated unit; synchronize() returns the list."""
    psid = check_process_set(process_set)
    srcs = [_as_rows(contiguous(t, "grouped_allgather")) for t in tensors]
    h = submit(_C.AllgatherOptions(), srcs, name=op_name("grouped_allgather", name, psid), process_set_id=psid)
    return register(h, lambda outs: list(outs))


class _GroupedAllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dim0s = [t.shape[0] if t.dim() > 0 else 1 for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name=name, process_set=process_set)))

    @staticmethod
    def backward(ctx, *grads):
        # As for allgather, per tensor: the averaged gradient's rows of this rank.
        ps = ctx.process_set
        reduced = synchronize(grouped_allreduce_async([g.contiguous() for g in grads], op=Average, process_set=ps))
        offsets = _rows_of_every_rank(ctx.dim0s, ps)[: _set_rank(ps)].sum(0).tolist()
        return (None, None, *[g.narrow(0, int(o), n) for g, o, n in zip(reduced, offsets, ctx.dim0s)])


def grouped_allgather(tensors, name=None, process_set=None) -> List[torch.Tensor]:
    """All-gathers each tensor of a list, negotiated as one unit; differentiable."""
    psid = check_process_set(process_set)
    return list(_GroupedAllgatherFn.apply(op_name("grouped_allgather", name, psid), process_set, *tensors))


# ---- broadcast ----------------------------------------------------------------


def _broadcast_submit(src: torch.Tensor, out: torch.Tensor, root_rank: int, name: str, psid: int) -> int:
    return submit(_C.BroadcastOptions(), [src], [out], name=name, root=root_rank, process_set_id=psid)


def broadcast_async(tensor, root_rank, name=None, process_set=None) -> int:
    """Starts a broadcast from ``root_rank`` (a global rank, also in a process set)."""
    psid = check_process_set(process_set)
    src = contiguous(tensor, "broadcast")
    out = fresh_output(src).copy_(src)  # the root's result is its input
    h = _broadcast_submit(src, out, root_rank, op_name("broadcast", name, psid), psid)
    return register(h, lambda _outs: out)


def broadcast_async_(tensor, root_rank, name=None, process_set=None) -> int:
    psid = check_process_set(process_set)
    buf = contiguous(tensor, "broadcast_")
    h = _broadcast_submit(buf, buf, root_rank, op_name("broadcast", name, psid), psid)
    if buf is tensor:
        return register(h, lambda _outs: tensor)
    return register(h, lambda _outs: tensor.copy_(buf))


def broadcast_(tensor, root_rank, name=None, process_set=None) -> torch.Tensor:
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad):
        # Horovod's rule: the averaged gradient flows back to the root only.
        reduced = synchronize(allreduce_async(grad, op=Average, process_set=ctx.process_set))
        if runtime.rank() != ctx.root:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=None) -> torch.Tensor:
    psid = check_process_set(process_set)
    return _BroadcastFn.apply(tensor, root_rank, op_name("broadcast", name, psid), process_set)


# ---- barrier, poll, synchronize --------------------------------------------


def barrier(process_set=None) -> None:
    """Returns once every rank (of the process set) has called barrier()."""
    psid = check_process_set(process_set)
    h = submit(_C.BarrierOptions(), name=op_name("barrier", None, psid), process_set_id=psid)
    register(h, lambda _outs: None)
    synchronize(h)


def join(device: int = -1) -> int:
    """This rank is out of data: returns, once every rank has called join(),
    the rank that joined last (Horovod's hvd.join).

    Until then the other ranks go on: their all-reduces and reduces (Sum or
    Average; Average still divides by every rank, as Horovod does) count
    this rank's contribution as zeros, their allgathers get no rows from it,
    their broadcasts reach it, and barriers pass it. Reduce-scatter,
    alltoall, the other reduce ops, and a broadcast or reduce whose root has
    joined raise HvdError on the ranks that submitted them. Only the global set joins: an
    op of another process set still needs every member. A sharded optimizer
    (DistributedOptimizer(shard=...)) is the exception: this rank holds the
    only state of its shard, so inside join() it goes on stepping that shard
    with the others, on the averaged gradients (zeros from this rank), until
    every rank has joined. ``device`` is
    accepted for Horovod's signature; the rank is returned either way."""
    del device
    h = submit(_C.JoinOptions())
    register(h, lambda outs: int(outs[0]))
    # Sharded optimizers go on stepping their shards with the others (zero gradients from here).
    runtime.run_joined_rounds()
    last = synchronize(h)
    runtime.joined()  # runs the join hooks of the modules above (autotune's among them)
    return last
