"""shard=3 from a model built on the meta device: each rank's shards are
made module by module, so no rank holds more than one module's full
parameters at a time (or those under one init, below), and a model whose
parameters do not fit one rank can be built.

Contract:
  * Order. Modules are initialized children before parents (the order in
    which building a module runs its submodules' constructors before its
    own code), each module once, in ``named_modules()`` order otherwise.
  * A module with tensors of its own (``recurse=False``) on the meta device
    gets them materialized on ``device`` (the parameter objects stay the
    same: the optimizer's param_groups keep working), then
    ``param_init_fn(module)`` runs, or else its ``reset_parameters()`` or
    ``_reset_parameters()`` (what torch's layers run when built). The
    tensors are final once every init that may write them has run: with
    param_init_fn, their module's (it must initialize its module's own
    tensors only); otherwise that of the outermost module around them with
    an init of its own (torch's MultiheadAttention zeroes its out_proj's
    bias in its own, torch's Transformer re-initializes every weight inside
    it), which runs after theirs. An init that writes a parameter sharded
    already finds a stand-in, and raises naming the module: torch refuses
    most writes to it (copy_), and one it takes (fill_, zero_) changes its
    version, which is checked after each init. A tensor still as it was
    materialized when final (filled with NaN, or the dtype's lowest
    integer) raises naming it: uninitialized memory would train silently
    wrong. A module with meta tensors and no
    init anywhere around it raises naming it.
  * Values. Every rank runs the same inits (so every rank's random
    generator moves as building the model would move it), then the set's
    first rank's values are broadcast, as wrapping a built model broadcasts
    them (with the DistributedModel's init_sync=False, as there, not: each
    rank shards its own values). Training then equals one process that builds the model on the
    meta device, materializes it on ``device`` and runs the same inits in
    the same order (for torch's layers: the values of building it there,
    with the same seed).
  * Tied parameters (one tensor in several modules) take the values of the
    first module that initializes them; a later module's init writes into
    scratch memory, which is dropped (building the model keeps one of the
    inits too: the tensor that is tied).
  * Once final, each parameter the optimizer shards is copied into this
    rank's range of its bucket and goes back to a stand-in (for the rest
    of the materialization; then to a view of a scratch buffer, see the
    end of build_shards, until ParameterUnits puts its own in); frozen
    parameters and buffers stay materialized whole (they are not sharded).
    So a rank holds at once the full parameters of one module (or of the
    outermost module with an init around several), never the model's.
"""

import itertools
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .. import runtime
from ..collectives import ops
from .layout import Bucket, write_into_shard
from .stand_ins import stand_in


def _children_first(module: torch.nn.Module) -> List[torch.nn.Module]:
    order, seen = [], set()

    def visit(m):
        if id(m) in seen:
            return
        seen.add(id(m))
        for child in m.children():
            visit(child)
        order.append(m)

    visit(module)
    return order


def _unset_marker(t: torch.Tensor) -> Optional[float]:
    """What a materialized tensor is filled with before its init, to tell
    one the init left alone; None for bool (nothing to tell it by)."""
    if t.dtype == torch.bool:
        return None
    if t.is_floating_point() or t.is_complex():
        return float("nan")
    return torch.iinfo(t.dtype).min


def _left_unset(t: torch.Tensor, marker: Optional[float]) -> bool:
    if marker is None or t.numel() == 0:
        return False
    if marker != marker:  # NaN
        return bool(torch.isnan(t).all())
    return bool((t == marker).all())


_WRITES_INSIDE = (
    "Modules are initialized children first, and a module's parameters are sharded once every init that may "
    "write them has run (its own, and reset_parameters() or _reset_parameters() of a module around it); a "
    "param_init_fn must initialize its module's own parameters and buffers only"
)


def _init_of(m: torch.nn.Module, param_init_fn) -> Optional[Callable[[], None]]:
    """The init that runs on ``m`` (see the top); None where it has none."""
    if param_init_fn is not None:
        return lambda: param_init_fn(m)
    for method in ("reset_parameters", "_reset_parameters"):
        f = getattr(m, method, None)
        if callable(f):
            return f
    return None


def _owners(module: torch.nn.Module, param_init_fn) -> Dict[int, Optional[torch.nn.Module]]:
    """id(module) -> the module after whose init its tensors are final: the
    outermost module on its path from the root (itself included) that has a
    reset_parameters() or _reset_parameters() (torch's MultiheadAttention
    zeroes its out_proj's bias in its own, torch's Transformer re-initializes
    every weight inside it), or itself with a param_init_fn (which
    initializes its module's own tensors only); None: no init."""
    owners: Dict[int, Optional[torch.nn.Module]] = {}

    def visit(m, outer):
        if id(m) in owners:
            return  # a module in two places: its first
        if param_init_fn is not None:
            owners[id(m)] = m
        else:
            owners[id(m)] = outer if outer is not None else (m if _init_of(m, None) is not None else None)
        for child in m.children():
            visit(child, None if param_init_fn is not None else owners[id(m)])

    visit(module, None)
    return owners


def build_shards(
    module: torch.nn.Module,
    params: Sequence[torch.Tensor],
    buckets: Sequence[Bucket],
    process_set,
    name: str,
    device,
    param_init_fn: Optional[Callable[[torch.nn.Module], None]],
    broadcast: bool = True,
) -> List[torch.Tensor]:
    """This rank's shard of every bucket, from ``module`` built on the meta
    device (see the top). ``params[i]``: the parameter numbered i in the
    buckets. A collective over ``process_set`` (a broadcast per tensor;
    ``broadcast=False``, the DistributedModel's init_sync=False: none, each
    rank keeps its own inits' values, as that flag does for a built model)."""
    device = torch.device(device)
    rank, size = process_set.rank(), process_set.size()
    ranges = [b.shard_range(rank, size) for b in buckets]
    shards = [torch.empty(end - start, dtype=b.dtype, device=device) for b, (start, end) in zip(buckets, ranges)]
    place: Dict[int, Tuple[int, int]] = {}  # id(parameter) -> (its bucket, its offset there)
    for j, b in enumerate(buckets):
        for i, offset in zip(b.params, b.offsets):
            place[id(params[i])] = (j, offset)
    names = {}
    for path, m in module.named_modules():
        names.setdefault(id(m), path or "the root module")
    owners = _owners(module, param_init_fn)
    # id(owner) -> the tensors materialized under it, final once its init has run: (where, name, tensor, marker)
    pending: Dict[int, List[tuple]] = {}
    done = set()  # ids of the tensors final (broadcast, and sharded if the optimizer shards them)
    count = itertools.count()  # the broadcasts' names
    rest: Dict[int, int] = {}  # id(sharded parameter) -> its _version once a stand-in

    def final(t: torch.Tensor) -> None:
        """``t`` holds its values: the set's first rank's are broadcast (as wrapping a built model broadcasts
        them, unless init_sync=False); a sharded parameter goes into this rank's range of its bucket and back
        to a stand-in, frozen parameters and buffers stay whole."""
        if broadcast:
            ops.broadcast_(
                t.data, process_set.ranks[0], name=f"{name}.meta_init.{next(count)}", process_set=process_set
            )
        done.add(id(t))
        if id(t) in place:
            j, offset = place[id(t)]
            write_into_shard(shards[j], *ranges[j], offset, t.data)
            t.data = stand_in(t)
            rest[id(t)] = t._version

    with torch.no_grad():
        # Tensors built on a real device first.
        for t in [t for t in itertools.chain(module.parameters(), module.buffers()) if not t.is_meta]:
            final(t)
        for m in _children_first(module):
            where = f"shard=3 from the meta device: module '{names[id(m)]}' ({type(m).__name__})"
            own = [(n, t) for n, t in itertools.chain(m._parameters.items(), m._buffers.items()) if t is not None]
            fresh = [(n, t) for n, t in own if t.is_meta]
            # Tied tensors final already: this init writes into scratch memory, dropped after.
            scratch = [t for _, t in own if id(t) in done and id(t) in place]
            init = _init_of(m, param_init_fn)
            if fresh and owners[id(m)] is None:
                raise ValueError(
                    f"hvdtorch: {where} holds {[n for n, _ in fresh]} on the meta device and has no "
                    "reset_parameters(): give it one that initializes its own parameters and buffers, pass "
                    "param_init_fn= to the optimizer, or build this module on a real device"
                )
            if not (fresh or scratch or id(m) in pending):
                continue
            for n, t in fresh:
                made = torch.empty_like(t, device=device)
                marker = _unset_marker(made)
                if marker is not None:
                    made.fill_(marker)
                if isinstance(t, torch.nn.Parameter):
                    made = torch.nn.Parameter(made, requires_grad=t.requires_grad)
                torch.utils.swap_tensors(t, made)  # the same object, now on `device`
                pending.setdefault(id(owners[id(m)]), []).append((where, n, t, marker))
            for t in scratch:
                t.data = torch.empty_like(t)
            if init is not None:
                try:
                    init()
                except RuntimeError as e:
                    raise RuntimeError(
                        f"hvdtorch: rank {runtime.rank()}: {where}: its init failed: {e}. {_WRITES_INSIDE}"
                    ) from e
            for t in scratch:
                t.data = stand_in(t)
                rest[id(t)] = t._version
            # A write into a sharded parameter that its stand-in takes without an error (fill_, zero_).
            written = [n for n, t in m.named_parameters() if id(t) in rest and t._version != rest[id(t)]]
            if written:
                raise RuntimeError(
                    f"hvdtorch: rank {runtime.rank()}: {where}: its init wrote {written[:5]}, sharded already. "
                    f"{_WRITES_INSIDE}"
                )
            for where_t, n, t, marker in pending.pop(id(m), []):
                if _left_unset(t, marker):
                    raise ValueError(
                        f"hvdtorch: {where_t}: its init left '{n}' as materialized (uninitialized memory): "
                        "initialize it in reset_parameters() (or param_init_fn), or build this module on a real "
                        "device"
                    )
                final(t)
    left = [n for n, t in itertools.chain(module.named_parameters(), module.named_buffers()) if t.is_meta]
    if left:
        raise ValueError(f"hvdtorch: shard=3 from the meta device: {left} are still on the meta device")
    # The optimizer builds its gradient reduction over contiguous parameters, as it finds them when the
    # model was built on a real device, before ParameterUnits puts its stand-ins in: until then each
    # sharded parameter is a view of one scratch buffer per dtype, the largest parameter's size.
    sharded = [params[i] for b in buckets for i in b.params]
    scratch_of: Dict[torch.dtype, torch.Tensor] = {}
    for t in sharded:
        if t.dtype not in scratch_of:
            largest = max(u.numel() for u in sharded if u.dtype == t.dtype)
            scratch_of[t.dtype] = torch.empty(largest, dtype=t.dtype, device=device)
        t.data = scratch_of[t.dtype][: t.numel()].view(t.shape)
    return shards
