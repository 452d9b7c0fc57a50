"""hvd.elastic.run: Horovod's decorator for an elastic training function, on
torchrun's elastic agent.

    @hvd.elastic.run
    def train(state):
        ...                      # resumes from state.epoch, state.batch
    train(hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0))

On entry: rank 0 loads the last commit from the commit directory (a
restarted job resumes there) and every rank syncs to rank 0's state; if the
number of ranks differs from the commit's, the reset callbacks run. Then the
function runs. If a collective fails (a peer died or timed out:
hvdtorch.HvdError, a.k.a. HorovodInternalError), the state goes back to the
last commit and the error propagates, so the process exits with an error and
torchrun (--max-restarts=N) restarts all workers, which resume from the last
commit on disk. Horovod's own driver instead re-forms the job inside the
running processes; with torchrun the agent owns membership (rendezvous,
--nnodes=MIN:MAX), so the process restarts.
"""

import functools

from .. import runtime
from ..exceptions import HorovodInternalError


def run(func):
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not runtime.is_initialized():
            raise ValueError("hvdtorch.elastic.run: call hvdtorch.init() before the elastic function")
        if runtime.rank() == 0:
            state.load_last_commit()
        state.sync()
        if state._committed_size is not None and state._committed_size != runtime.size():
            state.on_reset()
        try:
            return func(state, *args, **kwargs)
        except HorovodInternalError:
            state.restore()
            raise

    return wrapper
