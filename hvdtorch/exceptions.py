"""Exception classes with Horovod's names.

``HorovodInternalError`` is the class every failed collective raises: a
mismatch across ranks, a peer that died or timed out, an op submitted after
the engine failed or shut down. It *is* ``hvdtorch.HvdError`` (the class the
C++ engine's errors are translated to, a RuntimeError), so ``except
hvd.HorovodInternalError`` and ``except hvd.HvdError`` catch the same errors.
Bad arguments are not internal errors: they raise ValueError before anything
is sent.

``HostsUpdatedInterrupt`` exists so that scripts written for elastic Horovod
import and catch it; hvdtorch itself never raises it: under torchrun, hosts
that come or go make the agent restart the workers, which resume from the
last commit (see hvdtorch.elastic).
"""

from ._C import HvdError

HorovodInternalError = HvdError


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts in the job changed; ``skip_sync``: whether the state
    may skip its sync on the reset that follows."""

    def __init__(self, skip_sync):
        super().__init__(skip_sync)
        self.skip_sync = skip_sync
