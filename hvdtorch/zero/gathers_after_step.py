"""How the shards that a ShardedOptimizer's step() updated reach every
rank's parameters under shard=1/2 (the all-gathers after the step), and
what waits for them.

Contract:
  * step() then steps the shards and starts one all-gather per bucket into
    the flat buckets, the bucket forward needs first first, and waits for
    them: when step() returns, every parameter holds its new value, so an
    EMA, a norm for the log or a checkpoint reads what one process would.
    overlap_gathers=True (with a module to hook: model=, or the
    DistributedModel) lets step() return at once instead, and each
    submodule's forward waits for the buckets of its own parameters; the
    module's (and the DistributedModel's) state_dict(), load_state_dict(),
    parameters() and named_parameters() wait for every bucket, and so do
    what reads through them (AveragedModel.update_parameters, checkpoints,
    hvd.broadcast_parameters, elastic state), the next step() and
    wait_parameters(). The hazard of that opt-in: a parameter read through
    a reference kept from before (a tensor held by the caller, the
    optimizer's param_groups, a weight shared with another module) may be
    half gathered; call wait_parameters() first.
  * shard=3 gathers nothing after a step (_gather hands over to the
    parameter units' after_step(), zero/parameter_units.py).
"""

import weakref

import torch

from ..collectives import ops
from ..training.gradient_sync import remove_hooks


def _wait(opt_ref, buckets) -> None:
    opt = opt_ref()
    if opt is None:
        return
    if buckets is None:
        opt.wait_parameters()
    else:
        opt._wait(buckets)


class _WaitForGathers:
    """A module hook (forward, state_dict and load_state_dict pre-hooks) that
    waits for the all-gathers of some buckets (None: of all). A copy or a
    pickle of the module gets one that waits for nothing."""

    def __init__(self, opt_ref=None, buckets=None):
        self._opt_ref, self._buckets = opt_ref, buckets

    def __call__(self, *_) -> None:
        if self._opt_ref is not None:
            _wait(self._opt_ref, self._buckets)

    def __reduce__(self):
        return (_WaitForGathers, ())


class _ReadAfterGathers:
    """Stands in, as an instance attribute, for parameters() or
    named_parameters() of a module whose parameters a sharded optimizer
    gathers behind step() (overlap_gathers=True): waits for the gathers,
    then calls the class's method. A copy or a pickle of the module (an
    AveragedModel deep-copies it) gets a plain forwarder bound to the copy,
    which waits for nothing: the copy's parameters are its own."""

    def __init__(self, module: torch.nn.Module, method: str, opt_ref=None):
        self._module, self._method, self._opt_ref = module, method, opt_ref

    def __call__(self, *args, **kwargs):
        if self._opt_ref is not None:
            _wait(self._opt_ref, None)
        return getattr(type(self._module), self._method)(self._module, *args, **kwargs)

    def __reduce__(self):
        return (_ReadAfterGathers, (self._module, self._method))

    def remove(self) -> None:
        if self._module.__dict__.get(self._method) is self:
            del self._module.__dict__[self._method]


class _GathersAfterStep:
    """ShardedOptimizer's gathers after step() (a mixin; the state is
    ShardedOptimizer.__init__'s): reads _buckets, _all_params, _process_set,
    _rank, _size, _name, _stage, _units, _gather_in_place and _overlap;
    keeps _gathers; writes _flats, _shards and the parameters' .data."""

    def _hook(self, module: torch.nn.Module, readers) -> None:
        """Forward pre-hooks that wait for the all-gathers of each module's own
        parameters; every read through ``readers`` (the module, and the
        DistributedModel around it) waits for all of them."""
        bucket_of = {i: j for j, b in enumerate(self._buckets) for i in b.params}
        index = {id(p): i for i, p in enumerate(self._all_params)}
        me = weakref.ref(self)  # the module's hooks must not keep the optimizer alive
        handles = []
        for m in module.modules():
            mine = sorted(
                {bucket_of[index[id(p)]] for p in m.parameters(recurse=False) if index.get(id(p)) in bucket_of}
            )
            if mine:
                handles.append(m.register_forward_pre_hook(_WaitForGathers(me, mine)))
        for m in readers:
            handles.append(m.register_state_dict_pre_hook(_WaitForGathers(me)))
            handles.append(m.register_load_state_dict_pre_hook(_WaitForGathers(me)))
            for method in ("parameters", "named_parameters"):
                read = _ReadAfterGathers(m, method, me)
                object.__setattr__(m, method, read)  # an instance attribute shadows the class's method
                handles.append(read)
        weakref.finalize(self, remove_hooks, handles)

    def _gather(self) -> None:
        """Starts putting every rank's updated shard into every rank's buckets.

        In place (every rank on one host, flats in registered memory): each
        rank zeroes its flat outside its own range and the flats are summed
        by an all-reduce in place, which on one host is the engine's zero-copy
        path (each rank reads its peers' registered buffers; never fused, so
        no bucket is copied into the engine's fusion buffer): exact, since
        only one rank adds anything but zero to an element, and several times
        faster here than the all-gather, which copies through the links into
        an output it allocates each time. A rank that has joined takes part
        with its own shard too (the names keep the engine from standing in
        for it with zeros, zero/join.py). Otherwise: an all-gather, whose
        output becomes the parameters' storage. shard=3 gathers nothing here:
        each layer's forward gathers its own (zero/parameter_units.py)."""
        if self._stage == 3:
            self._units.after_step()
            return
        if self._size == 1:
            return
        for j in reversed(range(len(self._buckets))):  # the first layers' bucket is the last one
            name = f"{self._name}.gather.{j}"
            if self._gather_in_place:
                flat, (start, end) = self._flats[j], self._buckets[j].shard_range(self._rank, self._size)
                with torch.no_grad():
                    flat[:start].zero_()
                    flat[end:].zero_()
                self._gathers[j] = ops.registered_allreduce_async_(flat, name, ops.Sum, process_set=self._process_set)
            else:
                self._gathers[j] = ops.allgather_async(self._shards[j], name=name, process_set=self._process_set)
        if not self._overlap:
            self.wait_parameters()

    def _wait(self, buckets) -> None:
        for j in buckets:
            handle = self._gathers.pop(j, None)
            if handle is None:
                continue
            gathered = ops.synchronize(handle)
            b = self._buckets[j]
            if self._gather_in_place:
                continue
            # The gathered bucket becomes the parameters' storage (no copy back).
            for i, offset, shape in zip(b.params, b.offsets, b.shapes):
                p = self._all_params[i]
                p.data = gathered[offset : offset + p.numel()].view(shape)
            start, end = b.shard_range(self._rank, self._size)
            self._shards[j].data = gathered[start:end]
            self._flats[j] = gathered

    def wait_parameters(self) -> None:
        """Returns once every parameter holds the value of the last step()."""
        if self._gathers:
            self._wait(list(self._gathers))
