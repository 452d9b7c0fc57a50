"""What a rank that joined replays under shard=3: the gathers and frees of
its last pass of the kind the others run (hvd.join()).

Contract:
  * Each pass records the gathers and frees it ran, in order,
    one script for passes under autograd (from a forward to the next
    forward or step(): its backward included) and one without (its forward
    alone: recorded when that forward ends, so that it counts when it is
    the last thing a rank runs before join()); a forward inside
    gathered_parameters() is no pass (it gathers nothing and is not
    announced). A rank that has joined replays its last script of the kind
    the others announce (replay()), which issues the same collectives and
    host-copy puts in the same order as a pass of theirs.
  * What is recorded: each start, kept start, finish and free, except
    inside gathered_parameters() and gathers of the rank's own.
    ParameterUnits.forward() opens a pass (and closes the one before),
    after_step() closes it. The optimizer announces each pass
    (announce_pass, the protocol of zero/join.py) and calls replay() on
    the joined rank.
  * A joined rank that never ran a pass of the announced kind raises,
    naming it: it cannot serve the others' gathers.
"""

from .. import runtime


class _JoinReplay:
    """ParameterUnits' pass scripts (a mixin; the state is
    ParameterUnits.__init__'s): keeps _script, _script_grad and _last_pass,
    reads _pins and _private; a replay runs _start, _start_kept, _finish,
    _free and free_all."""

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
