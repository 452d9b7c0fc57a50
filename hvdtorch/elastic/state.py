"""Horovod's elastic state objects: State, ObjectState and TorchState.

A state is what training needs to resume: model and optimizer state, any
picklable extras (epoch, batch, ...) and ElasticSamplers. Its three verbs:

  commit()   collective (every rank calls it at the same step): gathers the
             samplers' processed indices from every rank, keeps a copy in
             memory and, with a commit directory, writes it atomically to
             <dir>/commit.pt (one writer per host: local rank 0), then waits
             until every host has written. After commit() returns on any rank,
             every host's copy holds this commit.
  restore()  goes back to the last commit kept in memory (local).
  sync()     collective: every rank takes rank 0's state (parameters,
             optimizer state, extras, samplers with the union of what every
             rank processed), and that becomes the commit kept in memory.

TorchState carries a Compression.powersgd compressor's state along: the
DistributedModel's (of `model`, or of the DistributedModel wrapping it) in
its own slot, the DistributedOptimizer's inside the optimizer's state. On
sync() its pass count and Q factors are rank 0's, while each compressed
parameter's error feedback becomes the average over the ranks that hold
one: errors are each rank's own, and what the averaged update still owes
is their mean. A rank that joins (or restarts without the commit) holds
none, so it does not dilute the mean.

Under torchrun a lost worker makes the agent restart every worker; the new
processes find the last commit in the directory (hvd.elastic.run loads it on
rank 0 and syncs it to everyone). The directory is HVDTORCH_ELASTIC_DIR or
the commit_dir argument; without one, commits live in memory only and a
restart starts from scratch.
"""

import copy
import os
from typing import Callable, Dict, List, Optional

import torch

from .. import runtime
from ..collectives import broadcast, ops, own_state
from ..collectives.powersgd import is_powersgd
from ..training.distributed_model import owner_of
from ..zero.optimizer import ShardedOptimizer
from . import persist
from .sampler import ElasticSampler

COMMIT_FILE = "commit.pt"


def _model_compressor(model):
    """The Compression.powersgd compressor of the DistributedModel that is `model` or reduces its
    parameters; None when there is none."""
    if model is None:
        return None
    # A DistributedModel's parameters are its module's: one lookup finds it either way.
    owner = next((o for o in map(owner_of, model.parameters()) if o is not None), None)
    compression = owner.gradient_options["compression"] if owner is not None else None
    return compression if is_powersgd(compression) else None


def _sync_powersgd(compressor, mine: Dict, name: str) -> None:
    """Collective over every rank: `compressor` takes rank 0's pass count and Q factors, and per
    parameter with a Q there the mean of the errors of the ranks whose state (`mine`, taken before rank
    0's state was broadcast) holds one."""
    root = broadcast.broadcast_object(
        {k: mine[k] for k in ("options", "iteration", "qs")}, 0, name=f"{name}.powersgd.root"
    )
    held = broadcast.allgather_object(
        {k: (tuple(v.shape), v.dtype) for k, v in mine["errors"].items()}, name=f"{name}.powersgd.errors"
    )
    shapes, holders = {}, {}
    for rank, errors in enumerate(held):
        for k, shape in errors.items():
            if shapes.setdefault(k, shape) != shape:
                raise ValueError(
                    f"hvdtorch.elastic: rank {rank}'s PowerSGD error of parameter {k} is {shape}, "
                    f"another rank's is {shapes[k]}: the ranks do not train the same model"
                )
            holders[k] = holders.get(k, 0) + 1
    keys = sorted(k for k in shapes if k in root["qs"])  # a parameter's error goes with its Q, rank 0's
    errors = {}
    if keys:
        sums = [
            mine["errors"][k].clone() if k in mine["errors"] else torch.zeros(shapes[k][0], dtype=shapes[k][1])
            for k in keys
        ]
        sums = ops.grouped_allreduce(sums, op=ops.Sum, name=f"{name}.powersgd.error_sums")
        errors = {k: total / holders[k] for k, total in zip(keys, sums)}
    compressor.load_state_dict({**root, "errors": errors})


class State:
    """Base class: reset callbacks, commit bookkeeping and persistence."""

    def __init__(self, commit_dir: Optional[str] = None):
        self._reset_callbacks: List[Callable[[], None]] = []
        self._commit_dir = commit_dir or os.environ.get("HVDTORCH_ELASTIC_DIR") or None
        self._commits = 0  # commits made by this job, resumed ones included
        self._committed_size = None  # world size when the last commit was made

    # -- Horovod's API -----------------------------------------------------
    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Functions called when training resumes with another number of ranks."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        self._gather()
        self.save()
        self._commits += 1
        self._committed_size = runtime.size()
        if self._commit_dir:
            self._gather_for_disk()
        if self._commit_dir and runtime.local_rank() == 0:
            persist.write_atomically(self.commit_path, self._snapshot())
        self._full_optimizer = None
        self._full_model = None
        if runtime.size() > 1:
            ops.barrier()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Horovod polls its driver for host changes here; torchrun's agent
        instead restarts the workers when hosts come or go, so nothing to do."""

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    # -- commits on disk ----------------------------------------------------
    @property
    def commit_path(self) -> Optional[str]:
        return os.path.join(self._commit_dir, COMMIT_FILE) if self._commit_dir else None

    @property
    def commit_count(self) -> int:
        """How many commits this job has made (counting those before a restart)."""
        return self._commits

    def _gather(self) -> None:
        """Collective step of commit() before saving (samplers' processed indices)."""

    def _gather_for_disk(self) -> None:
        """Collective step of commit() before writing (what only the writers need)."""

    def _saved(self) -> Dict:
        raise NotImplementedError

    def _load_saved(self, saved: Dict) -> None:
        raise NotImplementedError

    def _snapshot(self) -> Dict:
        return {"format": 1, "commits": self._commits, "size": self._committed_size, "saved": self._saved()}

    def load_last_commit(self) -> bool:
        """Makes the commit in the directory (if any) this state's last commit
        and restores it. Local; hvd.elastic.run calls it on rank 0 only."""
        if not self._commit_dir:
            return False
        snap = persist.read(self.commit_path)
        if snap is None:
            return False
        if snap.get("format") != 1:
            raise ValueError(f"hvdtorch.elastic: {self.commit_path} is not a commit this version can read")
        self._commits, self._committed_size = snap["commits"], snap["size"]
        self._load_saved(snap["saved"])
        self.restore()
        return True

    def _sync_bookkeeping(self) -> None:
        self._commits, self._committed_size = broadcast.broadcast_object(
            (self._commits, self._committed_size), 0, name="elastic.state.bookkeeping"
        )


class ObjectState(State):
    """Picklable attributes (`ObjectState(epoch=0, batch=0)` -> state.epoch, state.batch)."""

    def __init__(self, commit_dir: Optional[str] = None, **kwargs):
        super().__init__(commit_dir)
        self._names = list(kwargs)
        # The saved values are copies from the start: an extra changed in place before the first
        # save() (a list appended to) must not change what restore() brings back.
        self._saved_objects = copy.deepcopy(dict(kwargs))
        for k, v in kwargs.items():
            setattr(self, k, v)

    def _objects(self) -> Dict:
        return {k: getattr(self, k) for k in self._names}

    def save(self) -> None:
        self._saved_objects = copy.deepcopy(self._objects())

    def restore(self) -> None:
        for k, v in copy.deepcopy(self._saved_objects).items():
            setattr(self, k, v)

    def sync(self) -> None:
        objects = broadcast.broadcast_object(self._objects(), 0, name="elastic.state.objects")
        for k, v in objects.items():
            setattr(self, k, v)
        self._sync_bookkeeping()
        self.save()

    def _saved(self) -> Dict:
        return {"objects": self._saved_objects}

    def _load_saved(self, saved: Dict) -> None:
        self._saved_objects = saved["objects"]


def _is_stateful(value) -> bool:
    """Has torch's state_dict()/load_state_dict() pair (and is not a class)."""
    return (
        not isinstance(value, type)
        and callable(getattr(value, "state_dict", None))
        and callable(getattr(value, "load_state_dict", None))
    )


class TorchState(ObjectState):
    """A model, an optimizer and extras; ElasticSampler extras are kept in step
    across ranks (their processed indices are the union over ranks); extras
    with state_dict()/load_state_dict() (schedulers, GradScaler, an EMA's
    AveragedModel) are saved and restored through them, in place; other
    extras are deep-copied values (ObjectState).

    A sharded optimizer (hvd.DistributedOptimizer(shard=1|2|3)) keeps its shard
    in memory on each rank (restore() is local), writes the whole state,
    gathered to every host's writer, in a commit on disk, and sync() hands
    every rank its shard of the job's state (of the commit rank 0 loaded, if
    it loaded one). With shard=3 the model's parameters are sharded too and
    travel alike: each rank keeps its shards in memory, a commit writes the
    full model, and sync() hands every rank its range of the model of rank
    0's commit read from disk.

    A Compression.powersgd compressor's state travels with the model (a
    DistributedModel's) or the optimizer (a DistributedOptimizer's): see the
    module's docstring for what sync() makes of it."""

    def __init__(self, model=None, optimizer=None, commit_dir: Optional[str] = None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        self._samplers = {k: v for k, v in kwargs.items() if isinstance(v, ElasticSampler)}
        # Extras with state_dict()/load_state_dict() (a learning-rate scheduler, a GradScaler, an EMA
        # model, another module or optimizer) are saved and restored in place, as model and optimizer
        # are: a deep copy would restore a scheduler that drives a copy of the optimizer, silently.
        self._stateful = {k: v for k, v in kwargs.items() if k not in self._samplers and _is_stateful(v)}
        for k, v in self._stateful.items():
            if isinstance(v, ShardedOptimizer):
                raise ValueError(
                    f"hvdtorch.elastic: TorchState extra {k!r} is a sharded optimizer: pass it as optimizer= "
                    "(its state is gathered and cut anew when the number of ranks changes)"
                )
        for k, v in {**self._samplers, **self._stateful}.items():
            setattr(self, k, v)
        self._saved_stateful: Dict = {}
        plain = {k: v for k, v in kwargs.items() if k not in self._samplers and k not in self._stateful}
        super().__init__(commit_dir, **plain)
        self._saved_model = None
        self._saved_optimizer = None
        self._saved_samplers = {}
        self._sharded = isinstance(optimizer, ShardedOptimizer)
        # shard=3: the model's parameters are sharded too: each rank keeps its shards in memory, a commit
        # writes the full model (gathered to the writers), and sync() hands rank 0's commit read from disk
        # to every rank (a broadcast of the state_dict() would go to copies).
        self._sharded_model = getattr(model, "_parameter_units", None) is not None
        self._full_model = None
        self._model_from_disk = False
        self._full_optimizer = None  # sharded: the whole state, on the writers of a commit
        self._optimizer_from_disk = False  # sharded: _saved_optimizer is a whole state read from disk
        # The DistributedModel's PowerSGD compressor, whose state lives beside the model's (the
        # optimizer's compressor travels in the optimizer's state_dict()).
        self._model_powersgd = _model_compressor(model)
        self._saved_powersgd = None
        self.save()

    def save(self) -> None:
        super().save()
        if self._sharded_model:
            self._saved_model = self.model.sharded_state_dict()  # clones
        elif self.model is not None:
            self._saved_model = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            # Sharded: each rank keeps its own shard in memory (a restore happens at the same size).
            state = self.optimizer.sharded_state_dict() if self._sharded else self.optimizer.state_dict()
            self._saved_optimizer = copy.deepcopy(state)
        if self._model_powersgd is not None:
            self._saved_powersgd = self._model_powersgd.state_dict()  # a copy
        self._saved_samplers = {k: s.state_dict() for k, s in self._samplers.items()}
        self._saved_stateful = {k: copy.deepcopy(v.state_dict()) for k, v in self._stateful.items()}

    def restore(self) -> None:
        super().restore()
        if self.model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
        if self._model_powersgd is not None and self._saved_powersgd is not None:
            self._model_powersgd.load_state_dict(self._saved_powersgd)
        for k, s in self._samplers.items():
            s.load_state_dict(self._saved_samplers[k])
        for k, v in self._stateful.items():
            if k in self._saved_stateful:
                v.load_state_dict(copy.deepcopy(self._saved_stateful[k]))

    def _gather(self) -> None:
        for k, s in self._samplers.items():
            if runtime.size() > 1:
                every = broadcast.allgather_object(s.processed_indices, name=f"elastic.sampler.{k}.processed")
                s.processed_indices = set().union(*every)

    def _gather_for_disk(self) -> None:
        if not (self._sharded_model or self._sharded):
            return
        # Each host's writer (its local rank 0) gets the whole state.
        local_ranks = broadcast.allgather_object(runtime.local_rank(), name="elastic.state.local_ranks")
        writers = [r for r, local in enumerate(local_ranks) if local == 0]
        if self._sharded_model:
            self._full_model = self.model.state_dict(to=writers)
        if self._sharded:
            self._full_optimizer = self.optimizer.consolidate_state_dict(to=writers)

    def _sync_sharded_optimizer(self) -> None:
        """Every rank takes its shard of rank 0's commit read from disk, or else of the job's state."""
        from_disk = broadcast.broadcast_object(self._optimizer_from_disk, 0, name="elastic.state.from_disk")
        if from_disk:
            mine = self._saved_optimizer if runtime.rank() == 0 else None
            full = broadcast.broadcast_object(mine, 0, name="elastic.state.optimizer")
        else:
            full = broadcast.broadcast_object(
                self.optimizer.consolidate_state_dict(to=0), 0, name="elastic.state.optimizer"
            )
        self.optimizer.load_state_dict(full)
        self._optimizer_from_disk = False

    def _sync_sharded_model(self) -> None:
        """shard=3: every rank takes its range of rank 0's commit read from
        disk; otherwise every rank already holds its shard of one model."""
        if broadcast.broadcast_object(self._model_from_disk, 0, name="elastic.state.model_from_disk"):
            mine = self._saved_model if runtime.rank() == 0 else None
            self.model.load_state_dict(broadcast.broadcast_object(mine, 0, name="elastic.state.model"))
        self._model_from_disk = False

    def sync(self) -> None:
        # Each rank's own PowerSGD states, before rank 0's optimizer state (which carries one) replaces it.
        optimizer_powersgd = getattr(self.optimizer, "_hvd_compression", None)
        optimizer_powersgd = optimizer_powersgd if is_powersgd(optimizer_powersgd) else None
        own = [
            (c, c.state_dict(), name)
            for c, name in ((self._model_powersgd, "elastic.model"), (optimizer_powersgd, "elastic.optimizer"))
            if c is not None
        ]
        if self._sharded_model:
            self._sync_sharded_model()
        elif self.model is not None:
            broadcast.broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None and self._sharded:
            self._sync_sharded_optimizer()
        elif self.optimizer is not None:
            broadcast.broadcast_optimizer_state(self.optimizer, root_rank=0)
        for compressor, mine, name in own:
            _sync_powersgd(compressor, mine, name)
        self._gather()
        for k, s in self._samplers.items():
            s.load_state_dict(broadcast.broadcast_object(s.state_dict(), 0, name=f"elastic.sampler.{k}.state"))
        for k, v in self._stateful.items():
            v.load_state_dict(broadcast.broadcast_object(v.state_dict(), 0, name=f"elastic.extra.{k}.state"))
        super().sync()  # extras and bookkeeping, then save()

    def _saved(self) -> Dict:
        out = super()._saved()
        optimizer = self._full_optimizer if self._sharded else self._saved_optimizer
        out.update(
            model=self._full_model if self._sharded_model else self._saved_model,
            optimizer=optimizer,
            samplers=self._saved_samplers,
            powersgd=self._saved_powersgd,
            stateful=self._saved_stateful,
        )
        return out

    def _load_saved(self, saved: Dict) -> None:
        super()._load_saved(saved)
        self._saved_model = saved["model"]
        self._model_from_disk = self._sharded_model
        # A commit on disk is the job's (one writer per host; a shared folder keeps the last writer's): what
        # a rank of it held of its own (Adasum's, PowerSGD's) is taken on purpose, as sync() hands it out.
        self._saved_optimizer = own_state.disown(saved["optimizer"])
        self._saved_samplers = saved["samplers"]
        self._saved_stateful = saved.get("stateful", {})
        # Absent from commits written before it was carried; disowned as the optimizer's.
        self._saved_powersgd = own_state.disown(saved.get("powersgd"))
        self._optimizer_from_disk = self._sharded
