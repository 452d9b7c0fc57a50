"""Adding and removing process sets: collectives over every rank, which give
each set the same id everywhere (collectives/process_sets.py says what a set is).

Every rank calls them with the same ranks in the same order. ``hvd.init(process_sets=[...])``
adds the listed sets through the init hook registered below, and ``shutdown()``
makes every set forget its id.
"""

from typing import Iterable, Union

from .. import runtime
from ..exceptions import InvalidArgumentError
from . import ops, process_sets
from .broadcast import allgather_object


def add_process_set(process_set: Union[process_sets.ProcessSet, Iterable[int]]) -> process_sets.ProcessSet:
    """Adds a set on every rank (a collective: all ranks call it, same ranks, same order).

    Returns the ProcessSet, now with its id. A set defined differently on
    different ranks raises ValueError on every rank, naming what each rank passed."""
    ps = process_set if isinstance(process_set, process_sets.ProcessSet) else process_sets.ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise InvalidArgumentError(f"hvdtorch: {ps} has been added already")
    st = runtime.state()
    bad = [r for r in ps.ranks if not 0 <= r < st.size]
    if bad:
        raise InvalidArgumentError(f"hvdtorch: process set {ps.ranks}: ranks {bad} are not in [0, {st.size})")
    # Every rank must define the same set: compare over the global set first,
    # so that a disagreement is an error everywhere rather than a hang.
    everyone = allgather_object(ps.ranks, name=runtime.next_name("add_process_set"))
    if any(r != ps.ranks for r in everyone):
        variants = "; ".join(f"rank {k}: {r}" for k, r in enumerate(everyone))
        raise InvalidArgumentError(
            f"hvdtorch: add_process_set was called with different ranks on different ranks ({variants})"
        )
    groups = runtime.make_set_groups(ps.ranks)
    try:
        new_id = st.engine.add_process_set(ps.ranks, *groups)
    except BaseException:
        runtime.destroy_groups(groups)
        raise
    runtime.keep_set_groups(new_id, groups)
    process_sets.reset_names(new_id)
    # No rank may submit to the set before every rank knows it.
    ops.barrier()
    process_sets.remember(ps, new_id)
    return ps


def process_set_with(ranks: Iterable[int]) -> process_sets.ProcessSet:
    """The added set of exactly ``ranks``, added now if there is none (a
    collective then: every rank calls it with the same ranks, in the same
    order; the registries agree, so every rank adds or none does)."""
    wanted = sorted(int(r) for r in ranks)
    for ps in process_sets.added():
        if ps.ranks == wanted:
            return ps
    return add_process_set(wanted)


def remove_process_set(process_set: process_sets.ProcessSet) -> bool:
    """Removes a set on every rank (a collective). Its ops must have finished."""
    if process_set is process_sets.global_process_set or process_set.process_set_id == 0:
        raise InvalidArgumentError("hvdtorch: the global process set cannot be removed")
    psid = process_sets.set_id(process_set, member=False)
    ops.barrier()  # every rank is done with the set before anyone drops it
    runtime.state().engine.remove_process_set(psid)
    # The members' device rings close with a handshake on links other ops share: nobody goes on before it is over.
    ops.barrier()
    runtime.drop_set_groups(psid)
    process_sets.forget(process_set)
    return True


def _add_listed(listed) -> None:
    """hvd.init(process_sets=...): add each listed set, in order."""
    process_sets.forget_all()
    if listed in (None, "dynamic"):
        return
    for ps in listed:
        add_process_set(ps)


runtime.on_init(_add_listed)
runtime.on_shutdown(process_sets.forget_all)
