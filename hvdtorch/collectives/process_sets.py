"""Process sets: Horovod's subsets of ranks that run collectives of their own.

    even = hvd.ProcessSet([0, 2])
    hvd.init(process_sets=[even])          # or, once running: hvd.add_process_set([0, 2])
    if even.included():
        hvd.allreduce(t, process_set=even)  # only ranks 0 and 2 call it

A set is a list of global ranks. Each set negotiates on its own (its own
coordinator, response cache and stall check) and its ops run over the job's
existing links, shared memory between members on one host and the c10d link
otherwise; ops of disjoint sets run at the same time. Adding and removing a
set are collectives over every rank: every rank calls them with the same
ranks in the same order and gets the same id. As in Horovod, ranks given to
ops of a set (broadcast's ``root_rank``) are global ranks; ``ProcessSet.rank()``
is a rank's position inside the set (useful to pick its rows of an allgather).

This module is what a set *is* (the class, the global set, the ids the ops
resolve); adding and removing sets, which run collectives, is
collectives/process_set_table.py, above the ops.
"""

from typing import Dict, Iterable, List, Optional

from .. import runtime
from ..exceptions import InvalidArgumentError

# id -> the ProcessSet object every rank registered under it
_registry: Dict[int, "ProcessSet"] = {}


class ProcessSet:
    """A set of global ranks; usable in ops once added (init or add_process_set)."""

    def __init__(self, ranks: Iterable[int]):
        if hasattr(ranks, "Get_group"):
            raise InvalidArgumentError("hvdtorch: process sets are lists of ranks; MPI communicators are not supported")
        try:
            self.ranks: List[int] = sorted(int(r) for r in ranks)
        except TypeError as e:
            raise InvalidArgumentError(f"hvdtorch: a process set is a list of ranks, got {ranks!r}") from e
        if len(set(self.ranks)) != len(self.ranks):
            raise InvalidArgumentError(f"hvdtorch: process set {self.ranks} lists a rank twice")
        self.process_set_id: Optional[int] = None

    def size(self) -> Optional[int]:
        """Number of ranks in the set; None until the set is added."""
        return None if self.process_set_id is None else len(self.ranks)

    def rank(self) -> Optional[int]:
        """This rank's position in the set, -1 when not included; None until added."""
        if self.process_set_id is None:
            return None
        me = runtime.rank()
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> Optional[bool]:
        """Whether this rank is in the set; None until added."""
        return None if self.process_set_id is None else runtime.rank() in self.ranks

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


class _GlobalProcessSet(ProcessSet):
    """Every rank, id 0: the default of every op."""

    def __init__(self):
        self.process_set_id = 0

    @property
    def ranks(self) -> List[int]:  # type: ignore[override]
        return list(range(runtime.size()))

    def size(self) -> int:
        return runtime.size()

    def rank(self) -> int:
        return runtime.rank()

    def included(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "global_process_set"


global_process_set = _GlobalProcessSet()


def set_id(process_set, member: bool = True) -> int:
    """The engine id of an op's ``process_set`` argument (None: the global set);
    with ``member``, this rank must be in the set."""
    if process_set is None or process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise InvalidArgumentError(
            f"hvdtorch: process_set must be a hvdtorch.ProcessSet, got {type(process_set).__name__}"
        )
    if process_set.process_set_id is None:
        raise InvalidArgumentError(
            f"hvdtorch: {process_set} has not been added; use hvdtorch.add_process_set() or "
            "hvdtorch.init(process_sets=[...]) first"
        )
    if _registry.get(process_set.process_set_id) is not process_set:
        raise InvalidArgumentError(f"hvdtorch: {process_set} was removed")
    if member and runtime.rank() not in process_set.ranks:
        # Checked here too (the engine checks again) so that a rejected call
        # does not number an unnamed op on this rank only.
        raise InvalidArgumentError(
            f"hvdtorch: rank {runtime.rank()}: {_describe(process_set)} does not include this rank"
        )
    return process_set.process_set_id


def _describe(ps: ProcessSet) -> str:
    return f"process set {ps.process_set_id} [{', '.join(map(str, ps.ranks))}]"


def reset_names(psid: int) -> None:
    """Unnamed ops of a set are numbered per set; a new set under an old id starts again."""
    counters = runtime.state().name_counters
    for key in [k for k in counters if k.endswith(f".set{psid}")]:
        del counters[key]


def remember(ps: ProcessSet, psid: int) -> None:
    """``ps`` was added under ``psid`` (on every rank)."""
    ps.process_set_id = psid
    _registry[psid] = ps


def added() -> List[ProcessSet]:
    """Every set added now, the global one included, by id."""
    return [_registry[k] for k in sorted(_registry)]


def forget(ps: ProcessSet) -> None:
    """``ps`` was removed; its id may be given to a new set."""
    del _registry[ps.process_set_id]
    reset_names(ps.process_set_id)
    ps.process_set_id = None


def forget_all() -> None:
    """Every set dies with the engine (shutdown, or init afresh)."""
    for ps in _registry.values():
        ps.process_set_id = None
    _registry.clear()
