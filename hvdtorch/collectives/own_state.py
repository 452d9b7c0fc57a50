"""State of each rank's own, in checkpoints: Adasum's optimizer state
(momentum, moments) and PowerSGD's error feedback differ from rank to rank,
so a checkpoint of one rank's state does not resume another rank as it was.

Such a state_dict() carries OWNER_KEY, the global rank it came from. own()
is what load_state_dict() takes: this rank's state, or the list of every
rank's (it picks its own); another rank's is refused naming the ways out.
A state without the key (a plain optimizer's, or one disown()ed: what
hvd.broadcast_optimizer_state and an elastic commit read from disk hand
every rank on purpose) is taken as it is.
"""

from typing import Dict

# The global rank whose own state a state_dict() holds.
OWNER_KEY = "hvdtorch_owner_rank"


def mark(state: Dict, rank) -> Dict:
    """``state`` with its owner (``rank``; None: no owner yet, nothing of a rank's own in it)."""
    if rank is not None:
        state[OWNER_KEY] = int(rank)
    return state


def disown(state):
    """A copy of ``state`` without owner marks, at the top and in dict values one level down (a
    compressor's state inside an optimizer's): every rank takes it on purpose."""
    if not isinstance(state, dict):
        return state
    return {
        k: ({j: w for j, w in v.items() if j != OWNER_KEY} if isinstance(v, dict) else v)
        for k, v in state.items()
        if k != OWNER_KEY
    }


def own(state, rank: int, what: str, owns: str, or_else: str = "") -> Dict:
    """This rank's state out of ``state`` (a state_dict() or the list of every rank's), without its
    mark. ``what`` names the loader in errors, ``owns`` what a rank's own part is, ``or_else`` one
    more way out."""
    if isinstance(state, (list, tuple)):
        owners = [s.get(OWNER_KEY) if isinstance(s, dict) else None for s in state]
        mine = [s for s, owner in zip(state, owners) if owner == rank]
        if len(mine) != 1:
            raise ValueError(
                f"hvdtorch: rank {rank}: {what} got a list of states of ranks {owners}, none or several of them "
                "this rank's; pass the list of every rank's state_dict()"
            )
        state = mine[0]
    owner = state.get(OWNER_KEY) if isinstance(state, dict) else None
    if owner is not None and owner != rank:
        raise ValueError(
            f"hvdtorch: rank {rank}: {what}: this state is rank {owner}'s, and {owns} is each rank's own, so it "
            "would not resume this rank as it was. Save every rank's state (a file per rank, or "
            f"hvd.allgather_object(x.state_dict()) on every rank, saved as one list) and load this rank's or the "
            f"list{or_else}"
        )
    return {k: v for k, v in state.items() if k != OWNER_KEY} if owner is not None else state
