"""Exception classes with Horovod's names, and the argument error.

``HorovodInternalError`` is the class every failed collective raises: a
mismatch across ranks, a peer that died or timed out, an op submitted after
the engine failed or shut down. It *is* ``hvdtorch.HvdError`` (the class the
C++ engine's errors are translated to, a RuntimeError), so ``except
hvd.HorovodInternalError`` and ``except hvd.HvdError`` catch the same errors.

Bad arguments to a collective or to a process-set call are not internal
errors: they raise ``InvalidArgumentError`` before anything is sent, from
the C++ core and from the Python checks alike. It derives from both
ValueError (our contract: bad arguments are ValueErrors) and RuntimeError
(Horovod reports the same mistakes from its core as RuntimeError, and
scripts written for it catch that), but not from HorovodInternalError, so
elastic training does not retry a call that can never succeed. Checks of
Python-only helpers that Horovod also makes in Python (DistributedOptimizer's
arguments, broadcast_parameters' input) stay plain ValueErrors, as there.

``HostsUpdatedInterrupt`` exists so that scripts written for elastic Horovod
import and catch it; hvdtorch itself never raises it: under torchrun, hosts
that come or go make the agent restart the workers, which resume from the
last commit (see hvdtorch.elastic).
"""

from ._C import HvdError, InvalidArgumentError  # noqa: F401  (re-exported)

HorovodInternalError = HvdError


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts in the job changed; ``skip_sync``: whether the state
    may skip its sync on the reset that follows."""

    def __init__(self, skip_sync):
        super().__init__(skip_sync)
        self.skip_sync = skip_sync
