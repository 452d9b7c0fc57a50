"""How shard=3 gathers a bucket: the route that applies to it, and the host
topology the routes need.

ParameterUnits (zero/parameter_units.py) starts a bucket's gather with
_start(j) and waits for it with _finish(j), which installs the result as the
bucket's storage; both are this file's _GatherRoutes, a base of ParameterUnits.

Contract:
  * Gather: an all-gather of the bucket's shards (collective, named after
    the bucket's first parameter, so that an op a rank never joins fails
    naming it); its output becomes the bucket's storage and the parameters
    views of it. The kept buckets (zero/parameter_units.py) are gathered
    together, by one grouped all-gather.
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
  * Precision. Under a mixed-precision policy (``gather_dtype``, its
    param_dtype) forward's and backward's gathers cast each shard to it
    first, so they move and hold that dtype; gathers of the rank's own
    (gathered_parameters()) hold the shards' own.
  * Every choice of route follows what every rank holds alike (the process
    set and its hosts, the bucket, whether it is kept or has a secondary
    part, whether gathered_parameters() runs), never the timing of the
    network: every rank issues the same collectives in the same order.
"""

import itertools
from typing import Dict, List, Sequence, Tuple

import torch

from .. import _C, runtime
from ..collectives import ops, process_set_table
from .layout import Bucket, shard_range

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


class _GatherRoutes:
    """ParameterUnits' gathers (a mixin; the state is ParameterUnits.__init__'s).
    Reads _name, _buckets, _shards, _params, _names, _process_set, _rank, _size,
    _hosts, _host, _column, _host_set, _secondary_on, _kept, _kept_set,
    _private and _gather_dtype; keeps _gathers (in flight), _full,
    _on_host, _secondary, _bucket_of_storage and _versions. Each start,
    kept start and finish is recorded for hvd.join() (_record,
    join_replay.py); an install first checks that no write at rest was
    lost (_refuse_writes_at_rest, stand_ins.py)."""

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
