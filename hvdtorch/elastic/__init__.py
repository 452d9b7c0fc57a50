"""Elastic training with Horovod's API on torchrun's elastic agent.

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0,
                                   commit_dir="/shared/ckpt")   # or HVDTORCH_ELASTIC_DIR
    @hvd.elastic.run
    def train(state): ...

See run.py (what happens on failure), state.py (commit/restore/sync) and
sampler.py (ElasticSampler).
"""

from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from .run import run  # noqa: F401
from .sampler import ElasticSampler  # noqa: F401
from .state import ObjectState, State, TorchState  # noqa: F401
