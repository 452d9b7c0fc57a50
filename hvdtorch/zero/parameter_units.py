"""shard=3's parameters (ZeRO-3): each rank keeps its shard of every parameter
at rest, and a unit's full values exist only while its forward or backward
needs them.

Contract:
  * Units (plan_units). Walking down from the root, the first module whose
    subtree's parameters fit one bucket (the optimizer's fusion_bytes) is a
    unit with its whole subtree (a block of a deep network, a Linear of a
    wide MLP: one gather for the block, not one per layer); a module above
    that with parameters of its own is a unit of those alone. A parameter
    that modules of different units hold (tied weights), and the root's own,
    belong to the root's unit, gathered for the whole forward. The shard
    layout's buckets never span units (zero/layout.py's plan, the unit in
    each bucket's key), so a unit is a set of buckets, and a bucket is
    gathered and freed as a whole. Every module of a unit with parameters
    of its own is hooked too, and the unit is gathered while any of their
    forwards runs (counted), so a module called on its own (outside its
    unit's forward) finds its parameters.
  * At rest a parameter's ``.data`` is a stand-in of its shape, dtype and
    device that takes no memory: one NaN, expanded (every element reads NaN,
    any write raises). ``state_dict()`` and ``load_state_dict()`` of the
    model or any module in it raise, naming the DistributedModel's own
    (which gather) and ``gathered_parameters()``.
  * Gather: an all-gather of the bucket's shards (collective, named after
    the bucket's first parameter, so that an op a rank never joins fails
    naming it); its output becomes the bucket's storage and the parameters
    views of it. A unit is gathered by a forward pre-hook and freed by the
    forward hook (kept until backward with ``reshard_after_forward=False``);
    free means the parameters go back to their stand-ins and the storage is
    dropped, never resized, so nothing that still holds it can read freed
    memory.
  * One gathered copy per host. Where every host holds as many ranks of
    the set, more than one (and shared memory is on, tensors on the CPU; on
    several hosts, for the global set only, whose columns become process
    sets), a bucket is gathered into shared memory instead (_C.HostGather,
    csrc/core/transport/shm/host_gather.h): each rank copies its shard in
    (on several hosts, the shards of its column too: the ranks of its local
    rank on every host, all-gathered among them first, so each byte crosses
    a host's link once), and once all have, every rank's parameters are
    views of the one copy. The host then holds each gathered bucket once,
    not once per rank, in slots its ranks reuse. A tensor that still holds
    a freed bucket is given a private copy first (the binding's release):
    nothing reads a slot another gather took. The kept buckets, and
    gathered_parameters() (whose writes must come from one rank), use
    gathers of the rank's own.
  * Secondary copy (``secondary_copy``, ZeRO++'s hierarchical partitioning),
    for the global set on several hosts (refused for another set: its hosts'
    sets would need every rank of the job): a bucket gathered from the
    shards also leaves this rank its part of the bucket as sharded among its host's
    ranks alone (1/L of it, L ranks on the host), kept until the shards
    change (step(), a load, a write-back); while it is there, the bucket is
    gathered again from those parts alone, into the host's copy or by an
    all-gather among the host's ranks (a process set of them, added on
    every rank), which never crosses a host's link: backward's gathers, and
    a second forward's before the step.
  * Backward. While the DistributedModel's forward runs, autograd saves
    tensors that alias a gathered bucket (a weight, its transpose) as
    (bucket, offset, sizes, strides) instead of the tensor
    (``saved_tensors_hooks``); unpacking one in backward gathers the bucket
    again if it was freed. So what autograd keeps between forward and
    backward holds no gathered bucket, and backward reads the values the
    shards hold. A bucket is freed again once every parameter in it has its
    gradient accumulated, and whatever is still gathered at the end of
    backward is freed then.
  * Small buckets stay gathered (``keep_gathered_below`` bytes, as
    DeepSpeed's persistence threshold): they are gathered together, by one
    grouped all-gather at the first forward after a step, and kept until
    the next step, so that the norms and biases of a deep network cost one
    collective per step instead of two each. ``kept_bytes()`` counts them.
  * Prefetch. The order in which a forward first gathers the buckets is
    recorded; the next forward starts the gather of the bucket after the
    one it waits for, backward the one before. Every decision to gather or
    free follows the program's order (hooks, autograd's order of nodes on
    one device), never the timing of the network, so every rank issues the
    same gathers in the same order: every rank must run the same units in
    forward, as under FSDP.
  * ``gathered_parameters(modifier_rank)`` pins every bucket gathered for
    its body (nothing is freed, forward and backward inside included); on a
    clean exit each bucket is broadcast from ``modifier_rank`` (the set's
    rank: global rank ``process_set.ranks[modifier_rank]``) and every rank
    takes its range back into its shard, and the module's other state
    (buffers, frozen parameters) that any rank wrote inside is broadcast
    from it too, so that what the modifier holds (a load_state_dict() of
    the module inside, say) is what every rank holds after (None: read
    only; a write to a sharded parameter inside is then an error at exit).
    Inside, the module's own state_dict() and load_state_dict() work, as on
    a plain module.
  * Full state dicts are gathered bucket by bucket (never the whole model at
    once) and cloned on the ranks that receive them; loading one writes each
    rank's range of every parameter into its shard, locally: any number of
    ranks, any bucket layout. It refuses what torch refuses, in torch's
    words (strict: missing and unexpected keys; a tensor of another shape,
    "size mismatch", even of the same number of elements) and returns the
    keys torch returns. A sharded state dict is this rank's shards and
    the module's other state (buffers, frozen parameters): it loads back at
    the same rank and size, and every rank's, as a list in any order, at
    any size with the same buckets.
  * A write to a parameter at rest that its stand-in takes without an
    error (fill_, zero_: torch.nn.init.zeros_, constant_) raises at the
    next gather of its bucket, naming it: the write was lost.
  * A saved tensor on a stand-in (a parameter used outside the forward of
    its unit) raises, naming the parameter and the fixes: backward would
    read NaN.
  * A parameter written in place while gathered (an in-place op on a
    weight in forward, Embedding(max_norm=...)) raises when its bucket is
    freed or, if it stays gathered, at the end of the forward, naming it:
    the write would be lost with the gathered copy (and on one host be seen
    by the other ranks mid-step), where one process keeps it.
    gathered_parameters() is where parameters are written.
  * hvd.join(). Each pass records the gathers and frees it ran, in order,
    one script for passes under autograd (from a forward to the next
    forward or step(): its backward included) and one without (its forward
    alone: recorded when that forward ends, so that it counts when it is
    the last thing a rank runs before join()); a forward inside
    gathered_parameters() is no pass (it gathers nothing and is not
    announced). A rank that has joined replays its last script of the kind
    the others announce (replay()), which issues the same collectives and
    host-copy puts in the same order as a pass of theirs.
"""

import collections
import contextlib
import itertools
import weakref
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .. import _C, runtime
from ..collectives import ops, process_set_table
from ..training.gradient_sync import remove_hooks
from .layout import Bucket, shard_range, signature, write_into_shard

# The key of a sharded_state_dict() (what load_state_dict() tells it by).
SHARDED_FORMAT = "hvdtorch.zero3.shards"

# Numbers this process's ParameterUnits in construction order, which every
# rank shares (the optimizers are built collectively): the host gather's
# shared-memory name.
_instances = itertools.count()


class _Hosts:
    """Where the ranks of a process set live: ``ranks[h]``, the set's ranks
    on host h (hosts in the engine's order, ranks ascending); this rank is
    ``local`` of the ``local_size`` on ``host``."""

    def __init__(self, process_set):
        host_of = runtime.state().engine.topology()["host_of_rank"]
        by_host: Dict[int, List[int]] = {}
        for r in process_set.ranks:
            by_host.setdefault(host_of[r], []).append(r)
        self.ranks = [sorted(by_host[h]) for h in sorted(by_host)]
        me = runtime.rank()
        self.host = next(h for h, rs in enumerate(self.ranks) if me in rs)
        self.local, self.local_size = self.ranks[self.host].index(me), len(self.ranks[self.host])
        self.equal = len({len(rs) for rs in self.ranks}) == 1  # as many ranks on every host

    def sets(self, column: bool):
        """This rank's column (the ranks of its local rank on every host) or
        host as a process set of its own. Every column's (host's) set is
        added, or found, on every rank in the same order: the collectives
        line up."""
        groups = [list(c) for c in zip(*self.ranks)] if column else self.ranks
        mine = None
        for g in groups:
            ps = process_set_table.process_set_with(g)
            if runtime.rank() in ps.ranks:
                mine = ps
        return mine


def _host_gather(process_set, hosts: _Hosts, buckets: Sequence[Bucket], shards: Sequence[torch.Tensor], share: bool):
    """The host's shared gathered buckets (see the top), or None where they
    do not apply: shared memory off, tensors off the CPU, one rank on this
    host, hosts of different numbers of ranks. Decided alike on every rank."""
    number = next(_instances)
    if not share or any(s.device.type != "cpu" for s in shards) or hosts.local_size < 2 or not hosts.equal:
        return None
    if len(hosts.ranks) > 1 and process_set.process_set_id != 0:
        return None  # its columns would be process sets, which every rank of the job must add
    sizes = [max(1, b.numel * s.element_size()) for b, s in zip(buckets, shards)]
    name = f"{process_set.process_set_id}-{number}-h{hosts.host}"
    return _C.host_gather(runtime.state().engine, name, hosts.ranks[hosts.host], sizes)


@dataclass
class UnitPlan:
    """Which unit each parameter belongs to, and which unit each hooked
    module's forward needs gathered (unit 0: the root module's)."""

    of_param: Dict[int, int]  # parameter index -> unit
    of_module: Dict[int, int]  # id(module) -> unit, for every module in ``hooked``
    hooked: List[torch.nn.Module]


def plan_units(module: torch.nn.Module, params: Sequence[Optional[torch.Tensor]], cap_bytes: int) -> UnitPlan:
    """The units of ``module`` (see the top): walking down from the root, the
    first module whose subtree's parameters take at most ``cap_bytes`` is a
    unit with its whole subtree; a module above that with parameters of its
    own is a unit of those alone; the root's own parameters, and any held by
    modules of different units (tied weights), are the root's unit.
    ``params[i]`` None is not sharded. A parameter that is not the module's
    raises: nothing would gather it."""
    index = {id(p): i for i, p in enumerate(params) if p is not None}

    def own(m):
        return [index[id(p)] for p in m.parameters(recurse=False) if id(p) in index]

    def subtree_bytes(m):
        mine = {index[id(p)] for p in m.parameters() if id(p) in index}
        return sum(params[i].numel() * params[i].element_size() for i in mine)

    of_module: Dict[int, int] = {id(module): 0}
    hooked = [module]
    seen = {id(module)}
    count = 1

    def visit(m, unit):
        nonlocal count
        for child in m.children():
            if id(child) in seen:
                continue
            seen.add(id(child))
            u = unit
            if u is None and 0 < subtree_bytes(child) <= cap_bytes:
                u = count  # the child's whole subtree
                count += 1
                of_module[id(child)], _ = u, hooked.append(child)
            elif own(child):
                if u is None:
                    of_module[id(child)] = count  # its own parameters only
                    count += 1
                else:
                    of_module[id(child)] = u  # inside a unit: called alone, its forward gathers the unit
                hooked.append(child)
            visit(child, u)

    visit(module, 0 if 0 < subtree_bytes(module) <= cap_bytes else None)
    holders: Dict[int, set] = {}
    for m in hooked:
        for i in own(m):
            holders.setdefault(i, set()).add(of_module[id(m)])
    of_param = {}
    for i, p in enumerate(params):
        if p is None:
            continue
        units = holders.get(i)
        if units is None:
            raise ValueError(
                f"hvdtorch: shard=3: the optimizer steps a parameter of shape {tuple(p.shape)} that is not a "
                "parameter of the model: shard=3 gathers parameters around their module's forward, and nothing "
                "would gather this one; register it on a module of the model"
            )
        of_param[i] = next(iter(units)) if len(units) == 1 else 0
    return UnitPlan(of_param, of_module, hooked)


def stand_in(p: torch.Tensor) -> torch.Tensor:
    """What a parameter's ``.data`` is at rest (see the top): one NaN of its
    dtype and device, expanded to its shape."""
    return torch.full((), float("nan"), dtype=p.dtype, device=p.device).expand(p.shape)


class _SavedView:
    """What autograd keeps instead of a tensor that aliases a gathered bucket."""

    __slots__ = ("bucket", "offset", "size", "stride")

    def __init__(self, bucket: int, offset: int, size: Tuple[int, ...], stride: Tuple[int, ...]):
        self.bucket, self.offset, self.size, self.stride = bucket, offset, size, stride


def _hook_of(units_ref, method: str):
    """A hook that calls ``method`` on the units while they live (the model's
    hooks must not keep the optimizer alive). Under torch.compile it runs
    eagerly, outside any graph: it changes the parameters' storage, so the
    code after it is traced (and guarded) with the parameters as they are
    then."""

    @torch.compiler.disable
    def hook(*args):
        units = units_ref()
        if units is not None:
            return getattr(units, method)(*args)
        return None

    return hook


def _end_of_backward(units_ref) -> None:
    units = units_ref()
    if units is not None:
        units.end_backward()


class ParameterUnits:
    def __init__(
        self,
        name: str,
        module: torch.nn.Module,
        buckets: Sequence[Bucket],
        params: Sequence[torch.Tensor],
        names: Sequence[str],
        shards: Sequence[torch.Tensor],
        units: UnitPlan,
        process_set,
        reshard_after_forward: bool,
        keep_gathered_below: int = 0,
        share_gathered: bool = True,
        secondary_copy: bool = False,
        announce_pass=None,
        gather_dtype: Optional[torch.dtype] = None,
    ):
        """``params[i]``: the parameter numbered i in the buckets; ``shards[j]``:
        this rank's persistent shard of bucket j (the inner optimizer steps
        it); ``units``: plan_units() of the same parameters;
        ``share_gathered``: one gathered copy per host where it applies;
        ``secondary_copy``: ZeRO++'s, across hosts (both: see the top);
        ``announce_pass(grad_enabled, pinned)``: called as each forward
        starts (hvd.join(), and the optimizer's check that every rank runs
        it; ``pinned``: inside gathered_parameters(), where the forward
        gathers nothing). ``gather_dtype``: a mixed-precision policy's
        param_dtype (training/mixed_precision.py): forward's and backward's
        gathers cast each shard to it first, so they move and hold that
        dtype; gathered_parameters() and state_dict() gather the shards'
        own (full precision)."""
        self._name = name
        self._buckets = list(buckets)
        self._params = params
        self._names = names
        self._shards = shards
        self._process_set = process_set
        self._module = weakref.ref(module)  # its other state follows modifier_rank too (gathered_parameters())
        self._rank, self._size = process_set.rank(), process_set.size()
        self._reshard = bool(reshard_after_forward)
        self._gather_dtype = gather_dtype if gather_dtype is not None and gather_dtype != shards[0].dtype else None
        nb = len(self._buckets)
        self._full: List[Optional[torch.Tensor]] = [None] * nb  # the gathered bucket, while gathered
        # bucket -> (handle of its all-gather in flight, the buckets it gathers), or for a host gather (None,
        # True: put / False: not yet / ("column", handle of its column's all-gather in flight))
        self._gathers: Dict[int, tuple] = {}
        self._hosts = _Hosts(process_set)
        several = len(self._hosts.ranks) > 1
        self._host = _host_gather(process_set, self._hosts, self._buckets, shards, share_gathered)
        # Across hosts the host's copy takes the shards of the rank's column, gathered among the column.
        self._column = self._hosts.sets(column=True) if self._host is not None and several else None
        self._on_host = set()  # buckets gathered in the host's copy
        self._private = 0  # > 0: gathers of the rank's own (gathered_parameters())
        # The secondary copy (see the top): this rank's part of each bucket among its host's ranks, gathered
        # again into the host's copy, or else among the host's ranks (a process set of them).
        self._secondary_on = bool(secondary_copy) and several
        if self._secondary_on and process_set.process_set_id != 0:
            raise ValueError(
                "hvdtorch: secondary_copy=True needs the global process set: its hosts' ranks become process sets "
                "of their own, which every rank of the job must add (ranks outside this set build no optimizer)"
            )
        self._host_set = self._hosts.sets(column=False) if self._secondary_on and self._host is None else None
        self._secondary: Dict[int, torch.Tensor] = {}
        # hvd.join() (see the top): the events of the pass running, and the last pass's of each kind.
        self._announce_pass = announce_pass
        self._script: Optional[List[tuple]] = None  # None: not in a pass (nothing is recorded)
        self._script_grad = True
        self._last_pass: Dict[bool, List[tuple]] = {}
        self._bucket_of_storage: Dict[int, int] = {}  # data_ptr of a gathered bucket's storage -> bucket
        self._versions: Dict[int, List[int]] = {}  # gathered bucket -> its parameters' _version at the gather
        self._pins = 0  # gathered_parameters() depth: nothing is freed while > 0
        self._reading = 0  # > 0 while this code itself reads the module's state dict
        self._order: List[int] = []  # buckets in the order the last complete forward first gathered them
        self._position: Dict[int, int] = {}
        self._recording: List[int] = []
        self._recorded = set()
        self._missing = [len(b.params) for b in self._buckets]  # parameters whose gradient is not in yet
        # Buckets kept gathered from their first forward after a step to the next step (see the top).
        self._kept = [
            j for j, b in enumerate(self._buckets) if b.numel * self._shards[j].element_size() < keep_gathered_below
        ]
        self._kept_set = set(self._kept)
        self._callback_queued = False
        self._stand_ins = {}
        self._rest_versions: Dict[int, int] = {}  # parameter number -> its _version when it became a stand-in
        self._stand_in_of_storage: Dict[int, int] = {}  # data_ptr of a stand-in's one element -> parameter
        self._index_of: Dict[int, int] = {}  # id(parameter) -> its number, for the parameters held sharded
        self._place: Dict[int, Tuple[int, int]] = {}  # parameter number -> (its bucket, its offset there)
        for j, b in enumerate(self._buckets):
            for i, offset in zip(b.params, b.offsets):
                self._index_of[id(params[i])] = i
                self._place[i] = (j, offset)
                p = params[i]
                self._stand_ins[i] = stand_in(p)
                self._stand_in_of_storage[self._stand_ins[i].untyped_storage().data_ptr()] = i
        self._unit_buckets: Dict[int, List[int]] = {}  # unit -> its buckets
        for j, b in enumerate(self._buckets):
            self._unit_buckets.setdefault(units.of_param[b.params[0]], []).append(j)
        self._unit_of_module = dict(units.of_module)
        self._users = [0] * (max(self._unit_of_module.values()) + 1)  # forwards running that need the unit
        me = weakref.ref(self)
        handles = []
        forward_pre, forward_post = _hook_of(me, "_unit_forward_pre"), _hook_of(me, "_unit_forward_post")
        refuse_save, refuse_load = _hook_of(me, "_refuse_state_dict"), _hook_of(me, "_refuse_load_state_dict")
        for m in units.hooked:
            handles.append(m.register_forward_pre_hook(forward_pre))
            handles.append(m.register_forward_hook(forward_post))
            handles.append(m.register_state_dict_pre_hook(refuse_save))
            handles.append(m.register_load_state_dict_pre_hook(refuse_load))
        gradient_in = _hook_of(me, "_gradient_in")
        for i, (j, _) in self._place.items():
            handles.append(params[i].register_post_accumulate_grad_hook(lambda _p, j=j: gradient_in(j)))
        weakref.finalize(self, remove_hooks, handles)
        with torch.no_grad():
            for j in range(nb):
                self._to_stand_ins(j)

    def __deepcopy__(self, memo):
        # A copy of the model (torch's AveragedModel makes one) would hold stand-ins and hooks bound to this
        # job's collectives: say how to copy its values instead.
        raise RuntimeError(
            f"hvdtorch: rank {runtime.rank()}: a shard=3 model cannot be copied (its parameters are stand-ins "
            "outside forward). Copy the values: build the plain module again and load model.state_dict() into "
            "it (an EMA: update it inside `with model.gathered_parameters(modifier_rank=None):` from model.module)"
        )

    # ---- gather and free ----------------------------------------------------------

    def _record(self, *event) -> None:
        if self._script is not None and not self._pins and not self._private:
            self._script.append(event)

    def _close_pass(self) -> None:
        if self._script is not None:
            self._last_pass[self._script_grad] = self._script
        self._script = None

    def replay(self, grad_enabled: bool) -> None:
        """A joined rank: runs the gathers and frees of its last pass of this
        kind, while the ranks with data run theirs (see the top)."""
        script = self._last_pass.get(bool(grad_enabled))
        if script is None:
            raise RuntimeError(
                f"hvdtorch: rank {runtime.rank()}: hvd.join() with shard=3: the others run a forward "
                f"{'with' if grad_enabled else 'without'} autograd, which this rank never ran before it joined, so "
                "it cannot serve its gathers. Run one such forward on every rank before join()"
            )
        run = {"start": self._start, "kept": self._start_kept, "finish": self._finish, "free": self._free}
        for kind, *args in script:
            run[kind](*args)
        self.free_all()

    def _op_name(self, j: int) -> str:
        return f"{self._name}.gather.{j}.{self._names[self._buckets[j].params[0]]}"

    def _compute_dtype(self, j: int) -> torch.dtype:
        """What a gather of bucket j holds now: the policy's dtype for the
        forward's and backward's, the shards' own inside gathered_parameters()."""
        return self._shards[j].dtype if self._gather_dtype is None or self._private else self._gather_dtype

    def _cast(self, t: torch.Tensor, j: int) -> torch.Tensor:
        dtype = self._compute_dtype(j)
        return t if t.dtype == dtype else t.to(dtype)

    def _start(self, j: int) -> None:
        """Starts gathering bucket j unless it is gathered or on its way."""
        if self._full[j] is not None or j in self._gathers:
            return
        self._record("start", j)
        if self._host is not None and not self._private and j not in self._kept_set:
            if self._column is not None and j not in self._secondary:
                column = ops.allgather_async(
                    self._cast(self._shards[j], j), name=self._op_name(j), process_set=self._column
                )
                self._gathers[j] = (None, ("column", column))
            else:
                self._gathers[j] = (None, self._host.put(j, self._own_pieces(j), False))
            return
        if j in self._secondary and not self._private:  # from the host's ranks alone (in the policy's dtype)
            name = self._op_name(j).replace(".gather.", ".regather.", 1)
            handle = ops.allgather_async(self._secondary[j], name=name, process_set=self._host_set)
        else:
            handle = ops.allgather_async(
                self._cast(self._shards[j], j), name=self._op_name(j), process_set=self._process_set
            )
        self._gathers[j] = (handle, [j])

    def _own_pieces(self, j: int) -> List[Tuple[torch.Tensor, int]]:
        """What this rank puts into the host's copy of bucket j when it
        gathered nothing first: its secondary part, else its shard (one
        host), each with its offset in the bucket."""
        if j in self._secondary:
            start, _ = shard_range(self._buckets[j].numel, self._hosts.local, self._hosts.local_size)
            return [(self._secondary[j], start)]
        start, _ = self._buckets[j].shard_range(self._rank, self._size)
        return [(self._cast(self._shards[j], j), start)]

    def _column_pieces(self, j: int, gathered: torch.Tensor) -> List[Tuple[torch.Tensor, int]]:
        """The shards of this rank's column (an all-gather's output, in the
        column's rank order), each with its offset in the bucket."""
        b, out, at = self._buckets[j], [], 0
        for g in self._column.ranks:
            start, end = b.shard_range(self._process_set.ranks.index(g), self._size)
            out.append((gathered[at : at + end - start], start))
            at += end - start
        return out

    def _start_kept(self) -> None:
        """Starts one grouped all-gather of every kept bucket not gathered."""
        js = [j for j in self._kept if self._full[j] is None and j not in self._gathers]
        if not js:
            return
        self._record("kept")
        handle = ops.grouped_allgather_async(
            [self._cast(self._shards[j], j) for j in js],
            name=f"{self._name}.gather_kept",
            process_set=self._process_set,
        )
        for j in js:
            self._gathers[j] = (handle, js)

    def _finish(self, j: int) -> torch.Tensor:
        """Bucket j gathered: waits for its all-gather (started here if it was
        not) and makes its parameters views of the result."""
        full = self._full[j]
        if full is not None:
            return full
        self._start(j)
        self._record("finish", j)
        # Taken off the list first: a gather that fails is not waited for again (a free in a finally would
        # raise "unknown handle" over the failure's own error).
        handle, together = self._gathers.pop(j)
        if handle is None:  # a host gather: put (True), not yet (False), or its column's gather in flight
            if isinstance(together, tuple):
                self._host.put(j, self._column_pieces(j, ops.synchronize(together[1])), True)
            elif not together:
                self._host.put(j, self._own_pieces(j), True)
            self._on_host.add(j)
            self._install(j, self._host.await_(j, self._buckets[j].numel, self._compute_dtype(j)))
            return self._full[j]
        for k in together:
            self._gathers.pop(k, None)
        results = ops.synchronize(handle)
        if len(together) == 1 and not isinstance(results, list):
            results = [results]
        for k, result in zip(together, results):
            self._install(k, result)
        return self._full[j]

    def _install(self, j: int, full: torch.Tensor) -> None:
        self._refuse_writes_at_rest(j)
        if self._secondary_on and j not in self._secondary and j not in self._kept_set and not self._private:
            start, end = shard_range(full.numel(), self._hosts.local, self._hosts.local_size)
            self._secondary[j] = full[start:end].clone()
        self._full[j] = full
        self._bucket_of_storage[full.untyped_storage().data_ptr()] = j
        b = self._buckets[j]
        self._versions[j] = [self._params[i]._version for i in b.params]
        for i, offset, shape in zip(b.params, b.offsets, b.shapes):
            p = self._params[i]
            self._set_data(p, full[offset : offset + p.numel()].view(shape))

    def shares_gathered(self) -> bool:
        """Whether gathered buckets live once per host (see the top)."""
        return self._host is not None

    def kept_bytes(self) -> int:
        """Bytes of the buckets kept gathered between uses (see the top)."""
        return sum(self._buckets[j].numel * self._shards[j].element_size() for j in self._kept)

    def _free(self, j: int, kept_too: bool = False, writes_taken: bool = False) -> None:
        """Frees bucket j (see the top). ``writes_taken``: its parameters
        may have been written (gathered_parameters() took the writes)."""
        if self._pins or (j in self._kept_set and not kept_too):
            return
        if j in self._gathers:
            self._finish(j)  # a collective is never left behind
        full = self._full[j]
        if full is None:
            return
        self._record("free", j, kept_too)
        self._bucket_of_storage.pop(full.untyped_storage().data_ptr(), None)
        self._full[j] = None
        self._to_stand_ins(j)
        del full  # a host bucket's release copies what still holds it: this code must not
        if j in self._on_host:
            self._on_host.discard(j)
            self._host.release(j)
        versions = self._versions.pop(j)
        if not writes_taken:
            self._refuse_lost_writes(j, versions)

    def _refuse_lost_writes(self, j: int, versions: List[int]) -> None:
        b = self._buckets[j]
        written = [self._names[i] for i, v in zip(b.params, versions) if self._params[i]._version != v]
        if written:
            raise RuntimeError(
                f"hvdtorch: rank {runtime.rank()}: parameters {written[:5]} were written in place while gathered "
                "(an in-place op on a weight in forward, Embedding(max_norm=...)): shard=3 frees the gathered "
                "copy, so the write would be lost (one process keeps it). Write parameters inside `with "
                "model.gathered_parameters():`, or keep this module out of shard=3"
            )

    def _set_data(self, p: torch.Tensor, data: torch.Tensor) -> None:
        """p.data = data. Under a mixed-precision policy the dtype changes
        with it, which makes torch forget p's gradient accumulator, where
        the gradient reducer's hooks are: kept (_C.set_data_keeping_accumulator)."""
        if data.dtype == p.dtype:
            p.data = data
        else:
            _C.set_data_keeping_accumulator(p, data)

    def _to_stand_ins(self, j: int) -> None:
        for i in self._buckets[j].params:
            p = self._params[i]
            self._set_data(p, self._stand_ins[i])
            self._rest_versions[i] = p._version

    def _refuse_writes_at_rest(self, j: int) -> None:
        """A write that a stand-in takes without an error (fill_, zero_, and
        so torch.nn.init.zeros_ and constant_) changes its version only."""
        b = self._buckets[j]
        written = [self._names[i] for i in b.params if self._params[i]._version != self._rest_versions.get(i)]
        if written:
            raise RuntimeError(
                f"hvdtorch: rank {runtime.rank()}: parameters {written[:5]} were written while sharded (outside "
                "forward: p.fill_(), torch.nn.init.zeros_() or constant_()): shard=3 keeps no full values between "
                "uses, so the write was lost (one process keeps it). Write parameters inside `with "
                "model.gathered_parameters():`"
            )

    def free_all(self, kept_too: bool = False, writes_taken: bool = False) -> None:
        for j in range(len(self._buckets)):
            self._free(j, kept_too, writes_taken)

    def _gather(self, js: Sequence[int]) -> None:
        for j in js:
            self._start(j)
        for j in js:
            self._finish(j)

    def _prefetch(self, j: int, step: int) -> None:
        k = self._position.get(j)
        if k is not None and 0 <= k + step < len(self._order):
            self._start(self._order[k + step])

    # ---- forward --------------------------------------------------------------------

    @contextlib.contextmanager
    def forward(self):
        """Around the DistributedModel's forward: what was gathered before is
        freed (a second forward before backward included: backward gathers
        again what it needs), the gathering order is recorded for the next
        forward's prefetch, and autograd saves aliases of gathered buckets by
        position (see the top)."""
        self._users = [0] * len(self._users)  # a forward that raised left its counts behind
        self._close_pass()
        if self._announce_pass is not None:  # inside gathered_parameters() (pinned) it gathers nothing
            self._announce_pass(torch.is_grad_enabled(), self._pins > 0)
        # A forward inside gathered_parameters() (pinned) gathers nothing and is not announced: it is no pass.
        self._script, self._script_grad = (None if self._pins else []), torch.is_grad_enabled()
        self.free_all()
        self._start_kept()
        self._recording, self._recorded = [], set()
        clean = False
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield
            clean = True
        finally:
            if self._recording:
                self._order, self._position = self._recording, {j: k for k, j in enumerate(self._recording)}
            if self._reshard or not torch.is_grad_enabled():
                self.free_all(writes_taken=not clean)  # else kept for backward; a failed forward's error leads
            if not self._script_grad:
                self._close_pass()  # no backward follows a pass without autograd: it is whole now
        if not self._pins:  # what stays gathered (kept buckets, units kept for backward) is checked now
            for j, full in enumerate(self._full):
                if full is not None:
                    self._refuse_lost_writes(j, self._versions[j])

    def _unit_forward_pre(self, module, _args) -> None:
        u = self._unit_of_module[id(module)]
        self._users[u] += 1
        js = self._unit_buckets.get(u)
        if self._users[u] > 1 or not js:
            return  # gathered by the unit's outer forward (or nothing to gather)
        for j in js:
            if j not in self._recorded:
                self._recorded.add(j)
                self._recording.append(j)
        self._gather(js)
        self._prefetch(js[-1], +1)

    def _unit_forward_post(self, module, _args, _output) -> None:
        u = self._unit_of_module[id(module)]
        self._users[u] = max(self._users[u] - 1, 0)
        if self._users[u] == 0 and (self._reshard or not torch.is_grad_enabled()):
            for j in self._unit_buckets.get(u, ()):
                self._free(j)

    def _pack(self, t: torch.Tensor):
        if t.layout != torch.strided or t.device.type == "meta":
            return t
        ptr = t.untyped_storage().data_ptr()
        j = self._bucket_of_storage.get(ptr)
        if j is None:
            i = self._stand_in_of_storage.get(ptr)
            if i is not None:
                raise RuntimeError(
                    f"hvdtorch: rank {runtime.rank()}: parameter {self._names[i]!r} is used outside the forward "
                    "of the module that holds it: shard=3 gathers a module's parameters for its own forward "
                    "only. Use it through its module, register it on the module that uses it too (tied "
                    "weights), or pass reshard_after_forward=False (units stay gathered until backward)"
                )
            return t
        if t.dtype != self._full[j].dtype:
            return t
        return _SavedView(j, t.storage_offset() - self._full[j].storage_offset(), tuple(t.size()), tuple(t.stride()))

    def _unpack(self, saved):
        if not isinstance(saved, _SavedView):
            return saved
        self._in_backward()
        full = self._full[saved.bucket]
        if full is None:
            full = self._finish(saved.bucket)
            self._prefetch(saved.bucket, -1)
        return full.as_strided(saved.size, saved.stride, full.storage_offset() + saved.offset)

    # ---- backward -------------------------------------------------------------------

    def _in_backward(self) -> None:
        if self._callback_queued:
            return
        try:
            torch.autograd.Variable._execution_engine.queue_callback(_hook_of(weakref.ref(self), "end_backward"))
        except RuntimeError:
            return  # not inside backward (a saved tensor read by hand)
        self._callback_queued = True

    def _gradient_in(self, j: int) -> None:
        self._in_backward()
        if self._missing[j] > 0:
            self._missing[j] -= 1
            if self._missing[j] == 0:
                self._free(j)

    def end_backward(self) -> None:
        self._callback_queued = False
        self._missing = [len(b.params) for b in self._buckets]
        self.free_all()

    # ---- outside forward ------------------------------------------------------------

    def after_step(self) -> None:
        """The shards changed: nothing gathered before may be read again."""
        self._close_pass()
        self.free_all(kept_too=True)
        self._secondary.clear()  # gathered from the old shards

    @contextlib.contextmanager
    def gathered_parameters(self, modifier_rank: Optional[int] = 0):
        """Every parameter whole inside (collective); see the top for writes."""
        if modifier_rank is not None and not 0 <= int(modifier_rank) < self._size:
            raise ValueError(
                f"hvdtorch: gathered_parameters(modifier_rank={modifier_rank}): a rank of the process set "
                f"(0..{self._size - 1}), or None"
            )
        if self._pins == 0:  # writes inside must land in copies of the rank's own (see _write_back)
            for j in list(self._on_host) + [j for j, (handle, _) in self._gathers.items() if handle is None]:
                self._free(j)
            if self._gather_dtype is not None:  # inside, the parameters hold the shards' own precision
                self.free_all(kept_too=True)
        self._private += 1
        try:
            self._gather(list(reversed(range(len(self._buckets)))))
        finally:
            self._private -= 1
        self._pins += 1
        versions = {i: self._params[i]._version for b in self._buckets for i in b.params}
        rest_versions = {id(t): t._version for t in self._unsharded_state()}
        clean = False
        try:
            yield
            clean = True
        finally:
            self._pins -= 1
            try:
                if clean and self._pins == 0:
                    self._write_back(modifier_rank, versions, rest_versions)
            finally:
                # The kept buckets too: a write inside went to the shards (the write-back) or nowhere (an
                # exception, read only), so no gathered copy may keep it.
                if self._pins == 0:
                    self.free_all(kept_too=True, writes_taken=True)

    def _unsharded_state(self) -> List[torch.Tensor]:
        """The module's tensors shard=3 does not hold (buffers, frozen
        parameters, parameters the optimizer does not step), in the
        module's order (the same on every rank)."""
        module = self._module()
        if module is None:
            return []
        return [t for t in itertools.chain(module.parameters(), module.buffers()) if id(t) not in self._index_of]

    def _write_back(
        self, modifier_rank: Optional[int], versions: Dict[int, int], rest_versions: Dict[int, int]
    ) -> None:
        if modifier_rank is None:
            written = [self._names[i] for i, v in versions.items() if self._params[i]._version != v]
            if written:
                raise RuntimeError(
                    f"hvdtorch: rank {runtime.rank()}: parameters {written[:5]} were written inside "
                    "gathered_parameters(modifier_rank=None), which is read only: the write would be lost. Pass "
                    "modifier_rank= (the rank whose values every rank takes)"
                )
            return
        root = self._process_set.ranks[int(modifier_rank)]
        self._secondary.clear()  # the shards take the written values
        with torch.no_grad():
            for j, b in enumerate(self._buckets):
                full = self._full[j]
                if self._size > 1:
                    ops.broadcast_(full, root, name=f"{self._name}.write_back.{j}", process_set=self._process_set)
                start, end = b.shard_range(self._rank, self._size)
                self._shards[j].copy_(full[start:end])
            # The module's other state (a load_state_dict() inside loads buffers and frozen parameters too):
            # where any rank wrote one, every rank takes modifier_rank's.
            rest = self._unsharded_state()
            if rest and self._size > 1:
                written = torch.tensor(
                    [float(rest_versions.get(id(t)) != t._version) for t in rest], dtype=torch.float64
                )
                written = ops.allreduce(
                    written, op=ops.Max, name=f"{self._name}.write_back.rest", process_set=self._process_set
                )
                for k, (t, w) in enumerate(zip(rest, written.tolist())):
                    if w > 0:
                        ops.broadcast_(
                            t.data, root, name=f"{self._name}.write_back.rest.{k}", process_set=self._process_set
                        )

    # ---- state dicts ----------------------------------------------------------------

    def _refuse_state_dict(self, module, *_) -> None:
        self._refuse(
            f"state_dict() of a module whose parameters shard=3 holds sharded ({type(module).__name__}): its "
            "parameters are stand-ins outside forward. Use the DistributedModel's state_dict() (the full state, "
            "gathered), or read them"
        )

    def _refuse_load_state_dict(self, module, *_) -> None:
        self._refuse(
            f"load_state_dict() into a module whose parameters shard=3 holds sharded ({type(module).__name__}): "
            "use the DistributedModel's load_state_dict() (every rank takes its shard), or write them"
        )

    def _refuse(self, what: str) -> None:
        """The module state hooks: a read or write of stand-ins raises, except
        inside gathered_parameters() or this code's own (_own_reads())."""
        if self._pins or self._reading:
            return
        raise RuntimeError(f"hvdtorch: rank {runtime.rank()}: {what} inside `with model.gathered_parameters():`")

    @contextlib.contextmanager
    def _own_reads(self):
        """The module's state_dict()/load_state_dict() called by this code, which takes the parameters itself."""
        self._reading += 1
        try:
            yield
        finally:
            self._reading -= 1

    def state_dict(self, module: torch.nn.Module, prefix: str = "", to=None) -> dict:
        """Collective: the module's full state (parameters gathered bucket by
        bucket, cloned) on ``to`` (a global rank, a list of them, or None:
        every rank); an empty dict elsewhere."""
        receivers = None if to is None else {int(r) for r in ([to] if isinstance(to, int) else to)}
        here = receivers is None or runtime.rank() in receivers
        with self._own_reads():
            raw = module.state_dict(prefix=prefix, keep_vars=True)
        keys_of: Dict[int, List[str]] = {}
        for k, v in raw.items():
            keys_of.setdefault(id(v), []).append(k)
        out = {k: v.detach().clone() for k, v in raw.items() if id(v) not in self._index_of} if here else {}
        for j, b in enumerate(self._buckets):
            was_gathered = self._full[j] is not None
            if self._gather_dtype is not None:  # the shards' own precision, not the policy's
                full = ops.allgather(self._shards[j], name=f"{self._name}.state.{j}", process_set=self._process_set)
                was_gathered = True  # nothing installed here to free
            else:
                full = self._finish(j)
            if here:
                for i, offset, shape in zip(b.params, b.offsets, b.shapes):
                    value = full[offset : offset + int(torch.Size(shape).numel())].view(shape).clone()
                    for k in keys_of.get(id(self._params[i]), []):
                        out[k] = value
            del full  # held here, a host's bucket would be copied at its release
            if not was_gathered:
                self._free(j, kept_too=True)
        return {k: out[k] for k in raw if k in out}

    def sharded_state_dict(self, module: torch.nn.Module) -> dict:
        """This rank's shards (cloned) and the module's state shard=3 does not
        hold (buffers, frozen parameters): local, cheap."""
        with self._own_reads():
            raw = module.state_dict(keep_vars=True)
        rest = {k: v.detach().clone() for k, v in raw.items() if id(v) not in self._index_of}
        return {
            SHARDED_FORMAT: {
                "rank": self._rank,
                "size": self._size,
                "buckets": signature(self._buckets),
                "shards": [s.detach().clone() for s in self._shards],
                "rest": rest,
            }
        }

    def _load_sharded(self, module: torch.nn.Module, given) -> None:
        """A sharded_state_dict(): this rank's own (same rank and size), or the
        list of every rank's (any number of ranks, the same buckets)."""
        mine = signature(self._buckets)
        parts = [g[SHARDED_FORMAT] for g in (given if isinstance(given, (list, tuple)) else [given])]
        if any(p["buckets"] != mine for p in parts):
            raise ValueError(
                "hvdtorch: load_state_dict: the sharded state was saved with other buckets (another model or "
                "fusion_bytes): load the full state (the DistributedModel's state_dict()) instead"
            )
        if len(parts) == 1 and (parts[0]["rank"], parts[0]["size"]) != (self._rank, self._size):
            raise ValueError(
                f"hvdtorch: load_state_dict: rank {self._rank} of {self._size} was given the shards of rank "
                f"{parts[0]['rank']} of {parts[0]['size']}: pass this rank's own sharded_state_dict(), or the list "
                "of every rank's"
            )
        with torch.no_grad():
            if len(parts) == 1:
                for shard, saved in zip(self._shards, parts[0]["shards"]):
                    shard.copy_(saved)
            else:
                parts = sorted(parts, key=lambda p: p["rank"])
                if [p["rank"] for p in parts] != list(range(parts[0]["size"])):
                    raise ValueError("hvdtorch: load_state_dict: the list must hold every rank's sharded state")
                for j, b in enumerate(self._buckets):
                    full = torch.cat([p["shards"][j].reshape(-1) for p in parts])
                    start, end = b.shard_range(self._rank, self._size)
                    self._shards[j].copy_(full[start:end])
        with self._own_reads():
            module.load_state_dict(parts[0]["rest"], strict=False)
        self.after_step()

    def load_state_dict(self, module: torch.nn.Module, state_dict, strict: bool = True):
        """Each rank writes its range of every parameter into its shard (local,
        so every rank calls it with the full state); buffers and parameters
        shard=3 does not hold load as torch loads them. What torch refuses is
        refused as torch refuses it, in its words: with ``strict``, missing
        and unexpected keys; always, a tensor of another shape ("size
        mismatch", never a reshape of the same number of elements). The
        keys are returned as torch returns them."""
        if SHARDED_FORMAT in state_dict or (
            isinstance(state_dict, (list, tuple)) and all(SHARDED_FORMAT in s for s in state_dict)
        ):
            self._load_sharded(module, state_dict)
            return torch.nn.modules.module._IncompatibleKeys([], [])
        sharded_ids = self._index_of
        with self._own_reads():
            raw = module.state_dict(keep_vars=True)

        def sharded(k):
            return k in raw and id(raw[k]) in sharded_ids

        rest = collections.OrderedDict((k, v) for k, v in state_dict.items() if not sharded(k))
        metadata = getattr(state_dict, "_metadata", None)
        if metadata is not None:  # the modules' versions, which their loading hooks read
            rest._metadata = metadata
        with self._own_reads():
            result = module.load_state_dict(rest, strict=False)  # raises torch's errors of what it loads
        # torch's list, in its order, less the sharded parameters loaded here.
        missing = [k for k in result.missing_keys if not (sharded(k) and k in state_dict)]
        errors = []
        with torch.no_grad():
            for k, v in raw.items():  # a tied parameter's keys in torch's order: its last key's value stays
                if not sharded(k) or k not in state_dict:
                    continue
                value = state_dict[k]
                if not torch.overrides.is_tensor_like(value):
                    errors.append(
                        f'While copying the parameter named "{k}", expected torch.Tensor or Tensor-like object '
                        f"from checkpoint but received {type(value)}"
                    )
                    continue
                if v.dim() == 0 and value.dim() == 1 and value.shape[0] == 1:
                    value = value[0]  # torch's rule for a checkpoint of torch 0.3
                if value.shape != v.shape:
                    errors.append(
                        f"size mismatch for {k}: copying a param with shape {value.shape} from checkpoint, "
                        f"the shape in current model is {v.shape}."
                    )
                    continue
                self._write_parameter(sharded_ids[id(v)], value)
        self.after_step()
        if strict and result.unexpected_keys:
            errors.insert(
                0, "Unexpected key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in result.unexpected_keys))
            )
        if strict and missing:
            errors.insert(0, "Missing key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in missing)))
        if errors:
            raise RuntimeError(
                "Error(s) in loading state_dict for {}:\n\t{}".format(type(module).__name__, "\n\t".join(errors))
            )
        return torch.nn.modules.module._IncompatibleKeys(missing, list(result.unexpected_keys))

    def _write_parameter(self, i: int, value: torch.Tensor) -> None:
        j, offset = self._place[i]
        start, end = self._buckets[j].shard_range(self._rank, self._size)
        write_into_shard(self._shards[j], start, end, offset, value)
        if self._full[j] is not None:  # a gathered copy would be stale
            self._free(j, kept_too=True)
        self._secondary.pop(j, None)
