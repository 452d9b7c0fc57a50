"""A ShardedOptimizer's state dicts: state_dict() (the consolidated state),
sharded_state_dict(), load_state_dict(), consolidate_state_dict() and
hvd.broadcast_optimizer_state's hook.

Contract:
  * Checkpoints: zero/checkpoint.py does the work; these methods keep what
    the last consolidate_state_dict() gave this rank until the next step()
    (step() clears it), and a load starts the gradients afresh.
"""

from ..collectives.broadcast import broadcast_object

# Imported under this name so the code reads which module each call goes to.
from . import checkpoint as sharded_checkpoint


class _OptimizerStateDicts:
    """ShardedOptimizer's state dicts (a mixin; the state is
    ShardedOptimizer.__init__'s): keeps _consolidated; reads _name and
    _process_set; resets _grads and _synchronized at a load; runs
    wait_parameters."""

    def state_dict(self):
        """The whole optimizer state in torch's format, as the last
        consolidate_state_dict() gave it to this rank (torch's
        ZeroRedundancyOptimizer's contract, which Lightning follows). Without
        one since the last step(), or on a rank it did not go to, it raises
        naming the fix: a rank's own state is only a shard, and a checkpoint
        of it saved from rank 0 would silently hold rank 0's part alone."""
        return sharded_checkpoint.consolidated_state_dict(self)

    def sharded_state_dict(self):
        """This rank's shard of the optimizer state (local, cheap; every rank
        saves its own: load it back at the same number of ranks, or pass
        every rank's to load_state_dict at any number)."""
        return sharded_checkpoint.shard_state_dict(self)

    def load_state_dict(self, state_dict) -> None:
        """Takes a full state (an unsharded optimizer's state_dict(), or
        consolidate_state_dict()'s), this rank's shard from
        sharded_state_dict(), or the list of every rank's shards (any number
        of ranks then)."""
        self.wait_parameters()
        self._grads.reset()
        self._synchronized = False
        self._consolidated = None
        sharded_checkpoint.load(self, state_dict)

    def consolidate_state_dict(self, to=0):
        """Collective: the whole optimizer state in torch's format (as the
        unsharded optimizer's state_dict() would hold it, tensors on the CPU)
        on rank ``to`` (a global rank, a list of them, or None: every rank);
        None elsewhere. state_dict() returns it there until the next step()."""
        self._consolidated = sharded_checkpoint.consolidate(self, to)
        return self._consolidated

    def _hvd_broadcast_state(self, root_rank: int) -> None:
        """hvd.broadcast_optimizer_state on a sharded optimizer: the job's state as root_rank sees it."""
        full = self.consolidate_state_dict(to=root_rank)
        full = broadcast_object(full, root_rank, name=f"{self._name}.broadcast_state", process_set=self._process_set)
        self.load_state_dict(full)
