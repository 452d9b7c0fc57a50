"""Prints each rank's place in the job and checks a node all-reduce.

    HVDTORCH_HOSTNAME=hostA torchrun --nnodes=2 --node_rank=0 --nproc_per_node=2 \\
        --master_addr=127.0.0.1 --master_port=29500 examples/topology.py &
    HVDTORCH_HOSTNAME=hostB torchrun --nnodes=2 --node_rank=1 --nproc_per_node=2 \\
        --master_addr=127.0.0.1 --master_port=29500 examples/topology.py
"""

import os

import torch

import hvdtorch as hvd

hvd.init()
x = torch.full((1000,), float(hvd.rank() + 1))
s = hvd.allreduce(x, op=hvd.Sum, reducer="node")
ok = bool((s == sum(range(1, hvd.size() + 1))).all())
kinds = hvd.runtime.state().engine.link_kinds()
line = (
    f"TOPOLOGY rank={hvd.rank()} size={hvd.size()} local_rank={hvd.local_rank()} "
    f"local_size={hvd.local_size()} cross_rank={hvd.cross_rank()} cross_size={hvd.cross_size()} "
    f"node_allreduce={'ok' if ok else 'WRONG'} links={sorted((p, tuple(k)) for p, k in kinds.items())}\n"
)
# One write of under 4 KiB is atomic on a pipe: ranks sharing the agent's
# stdout cannot interleave their lines.
os.write(1, line.encode())
hvd.shutdown()
