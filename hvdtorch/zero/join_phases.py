"""What a ShardedOptimizer announces to the ranks that joined (hvd.join()),
and what it runs on a rank that has; the protocol is zero/join.py's.

Contract:
  * Uneven data, hvd.join(): a joined rank goes on stepping its shard with
    the others, on zero gradients of its own (zero/join.py); with shard=3 it
    also replays its last pass's gathers at each forward the others
    announce.
  * A rank with data announces each phase before its collectives
    (_announce: synchronize(), clip_grad_norm_(), step(), and shard=3's
    forwards through _pass_begins); inside hvd.join() the runtime calls
    listen_while_joined(), heard() and joined_phase() of each sharded
    optimizer (runtime.run_joined_rounds).
"""

# Imported under this name so the code reads which module each call goes to.
from . import join as shard_join


def _pass_announcer(optimizer_ref):
    """shard=3's start of each forward (ShardedOptimizer._pass_begins),
    holding the optimizer weakly (the model holds the parameter units)."""

    def announce(grad_enabled: bool, pinned: bool) -> None:
        optimizer = optimizer_ref()
        if optimizer is not None:
            optimizer._pass_begins(grad_enabled, pinned)

    return announce


class _JoinPhases:
    """ShardedOptimizer's side of hvd.join() (a mixin; the state is
    ShardedOptimizer.__init__'s): reads _announcer, _grads, _units, _stage
    and _synchronized; keeps _joined and _joined_fold; runs
    wait_parameters, zero_grad, _synchronize, clip_grad_norm_ and step."""

    def _announce(self, phase: int, clip=(0.0, 0.0, False), folds: bool = False, **kw) -> None:
        """Tells ranks that have joined what this step does next, and checks
        that every rank does the same (zero/join.py)."""
        if self._announcer is not None and not self._joined:
            self._announcer.announce(phase, clip, folds=folds, **kw)

    def _pass_begins(self, grad_enabled: bool, pinned: bool = False) -> None:
        """shard=3: a forward of the model begins. Announced (a joined rank
        replays its gathers) and checked at once (every rank must run it: a
        forward one rank runs alone raises on every rank); then the last
        backward pass's reduce-scatters are taken in (zero/gradients.py's
        fold), which a joined rank matches with zeros. ``pinned``: inside
        gathered_parameters() the forward gathers nothing and may run on one
        rank alone: nothing is announced."""
        folds = self._grads.folds_at_forward()
        if not pinned:
            self._announce(
                shard_join.PASS, (float(grad_enabled), 0.0, False), folds=folds, grad_enabled=grad_enabled, wait=True
            )
        if folds:
            self._grads.fold()

    def listen_while_joined(self) -> int:
        """Inside hvd.join(): starts waiting for what the others do next."""
        return self._announcer.listen()

    def heard(self, token: int) -> bool:
        return self._announcer.arrived(token)

    def joined_phase(self, token: int) -> bool:
        """Inside hvd.join(): runs the phase the others announced with zero
        gradients (the gradients of a partial accumulation are dropped, as a
        joined rank's are in Horovod). False once every rank has joined."""
        phase, clip, folds = self._announcer.heard(token)
        if phase == shard_join.NONE:
            self.wait_parameters()
            return False
        self._joined = True
        try:
            if phase == shard_join.PASS:  # shard=3: the others' forward and backward gather from this rank too
                if folds:  # the others take in the reduce-scatters of their last pass: zeros from here
                    self._grads.fold()
                self._units.replay(bool(clip[0]))
                return True
            # A partial accumulation of this rank's own is dropped (as Horovod drops a joined rank's); shard=3's
            # folded passes were reduced with every rank's and are kept.
            if not self._synchronized and self._stage < 3:
                self._grads.reset()
                self.zero_grad(set_to_none=True)
            self._joined_fold = folds if self._stage == 3 else None
            if phase == shard_join.SYNC:
                self._synchronize()
            elif phase == shard_join.CLIP:
                self.clip_grad_norm_(*clip)
            else:
                self.step()
        finally:
            self._joined = False
            self._joined_fold = None
        return True
