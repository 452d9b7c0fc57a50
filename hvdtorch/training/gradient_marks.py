"""Whether the user changed gradients between backward and the reduction's
end, for the paths that finish the reduction in step() (DistributedOptimizer,
training/gradient_sync.py; the sharded optimizer's shard=1,
zero/gradients.py): clip_grad_norm_, GradScaler.unscale_ or a manual scale
there would race with the all-reduce in flight (or act on this rank's
gradient alone, where DDP changes the average), so it is an error naming
the fix instead.

How: at the end of every backward pass each gradient's mark is noted (its
memory: another tensor put in .grad; and its version counter: written in
place); check() compares before the reduction is finished. The note runs
after every callback queued in the pass, the C++ reducer's too: it writes
the slots of parameters without a gradient there, and a write to a bucket
moves the version of every gradient viewing it. Reads and changes through
.grad after the note go to stand-ins that finish the reduction first
(training/pending_gradients.py, placed by ``after_note``): what this check
still catches is a change through a reference taken before the note (a
gradient kept from an earlier step, a view of a bucket).
"""

import weakref
from typing import Callable, List, Optional, Sequence

import torch

from .. import runtime


def grad_mark(grad: Optional[torch.Tensor]) -> Optional[tuple]:
    """What tells a gradient changed: its memory and its version counter."""
    if grad is None:
        return None
    try:
        where = grad.data_ptr()
    except RuntimeError:  # no storage (sparse, and tensor subclasses): the object itself
        where = id(grad)
    return (where, grad._version)


class GradientMarks:
    def __init__(
        self,
        params: Sequence[torch.Tensor],
        names: Sequence[str],
        fix: str,
        after_note: Optional[Callable[[], None]] = None,
    ):
        """``names[i]`` names ``params[i]`` in the error; ``fix``: what the
        error tells the user to do instead (the path's own remedy);
        ``after_note``: runs right after each note (it must not keep the
        owner alive)."""
        self._params = list(params)
        self._names = list(names)
        self._fix = fix
        self._after_note = after_note
        self._noted: Optional[List[Optional[tuple]]] = None
        self._queued = False  # a note of this pass is queued already

    def note_after_pass(self) -> None:
        """Inside a backward pass (from a hook): note every gradient once the
        pass's callbacks have run. Once per pass, however often called."""
        if self._queued:
            return
        self._queued = True
        me = weakref.ref(self)  # the callbacks must not keep the optimizer alive

        def note() -> None:
            marks = me()
            if marks is not None:
                marks._noted = [grad_mark(p.grad) for p in marks._params]
                marks._queued = False
                if marks._after_note is not None:
                    marks._after_note()

        engine = torch.autograd.Variable._execution_engine
        # Queued from a callback, it runs after every callback queued during the pass.
        engine.queue_callback(lambda: engine.queue_callback(note))

    def forget(self) -> None:
        """The passes so far are dropped (load_state_dict, reset)."""
        self._noted = None

    def check(self) -> None:
        """Raises RuntimeError naming the gradients changed since the last
        pass's note; then forgets the note (the reduction goes on from here)."""
        noted, self._noted = self._noted, None
        if noted is None:
            return
        changed = [
            name
            for name, p, was in zip(self._names, self._params, noted)
            if was is not None and grad_mark(p.grad) != was
        ]
        if changed:
            shown = ", ".join(repr(n) for n in changed[:5]) + (
                f" and {len(changed) - 5} more" if len(changed) > 5 else ""
            )
            raise RuntimeError(
                f"hvdtorch: rank {runtime.rank()}: the gradients of {shown} were changed (in place, or .grad "
                "replaced: set to None or to another tensor) between backward and step() while their all-reduce was "
                f"still to finish (torch.nn.utils.clip_grad_norm_, GradScaler.unscale_, ...): {self._fix}"
            )
