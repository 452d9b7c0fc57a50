"""shard=3's parameters (ZeRO-3): each rank keeps its shard of every parameter
at rest, and a unit's full values exist only while its forward or backward
needs them.

This file holds ParameterUnits and its lifecycle: the hooks it puts on the
model, and when each unit is gathered and freed around forward, backward
and the step. Its other jobs are mixins, each in a file of its own:
  unit_plan.py               which modules are units (plan_units)
  gather_routes.py           how a bucket is gathered: an all-gather, the host's one copy, the secondary copy
  stand_ins.py               what a parameter holds at rest, and the checks that no write is lost
  saved_tensors.py           what autograd keeps of a gathered bucket between forward and backward
  gathered_parameters.py     gathered_parameters() and its write-back
  parameter_state_dicts.py   the full and sharded state dicts and their loading
  join_replay.py             what a rank that joined replays (hvd.join())
plan_units, UnitPlan, stand_in and SHARDED_FORMAT are importable from here too.

Contract:
  * A unit is a set of buckets (unit_plan.py), gathered and freed as a
    whole. A unit is gathered by a forward pre-hook and freed by the forward
    hook (kept until backward with ``reshard_after_forward=False``); free
    means the parameters go back to their stand-ins (stand_ins.py) and the
    storage is dropped, never resized, so nothing that still holds it can
    read freed memory.
  * Backward. What autograd saved of a gathered bucket gathers it again
    when backward reads it (saved_tensors.py). A bucket is freed again once
    every parameter in it has its gradient accumulated, and whatever is
    still gathered at the end of backward is freed then.
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
  * The step (after_step()) changes the shards: nothing gathered before is
    read again (the kept buckets and the secondary copies included).
  * A copy of the model (copy.deepcopy, torch's AveragedModel) raises,
    naming how to copy its values instead.
"""

import contextlib
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .. import runtime
from ..training.gradient_sync import remove_hooks
from .gather_routes import _GatherRoutes, _host_gather, _Hosts
from .gathered_parameters import _GatheredParameters
from .join_replay import _JoinReplay
from .layout import Bucket
from .parameter_state_dicts import SHARDED_FORMAT as SHARDED_FORMAT
from .parameter_state_dicts import _StateDicts
from .saved_tensors import _SavedTensors
from .stand_ins import _StandIns, stand_in
from .unit_plan import UnitPlan
from .unit_plan import plan_units as plan_units


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


class ParameterUnits(_GatherRoutes, _StandIns, _SavedTensors, _GatheredParameters, _StateDicts, _JoinReplay):
    """One sharded optimizer's shard=3 parameters (see the top); each base
    is one job of it, in its own file, on the state __init__ sets."""

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
        ``secondary_copy``: ZeRO++'s, across hosts (both: gather_routes.py);
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
        # The secondary copy (gather_routes.py): this rank's part of each bucket among its host's ranks, gathered
        # again into the host's copy, or else among the host's ranks (a process set of them).
        self._secondary_on = bool(secondary_copy) and several
        if self._secondary_on and process_set.process_set_id != 0:
            raise ValueError(
                "hvdtorch: secondary_copy=True needs the global process set: its hosts' ranks become process sets "
                "of their own, which every rank of the job must add (ranks outside this set build no optimizer)"
            )
        self._host_set = self._hosts.sets(column=False) if self._secondary_on and self._host is None else None
        self._secondary: Dict[int, torch.Tensor] = {}
        # hvd.join() (join_replay.py): the events of the pass running, and the last pass's of each kind.
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
