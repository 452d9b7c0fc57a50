"""``horovod.torch.functions``'s public names (the broadcast and gather
helpers), for scripts that import them from there. The same objects as
``hvdtorch.<name>``; they live in collectives/broadcast.py."""

from .collectives.broadcast import (  # noqa: F401
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
