"""A training script written for horovod.torch, unchanged: process sets,
alltoall, reducescatter, join with uneven data, DistributedOptimizer and the
broadcast helpers. With hvdtorch, replace the import by `import hvdtorch as
hvd` (tests/test_horovod_script.py runs this very file with horovod.torch
resolving to hvdtorch, and checks the numbers it prints).

    torchrun --nproc_per_node=3 examples/horovod/train_horovod.py
"""

import horovod.torch as hvd
import torch
import torch.nn.functional as F

evens = hvd.ProcessSet([0, 2])
hvd.init(process_sets=[evens])
rank, size = hvd.rank(), hvd.size()
torch.manual_seed(0)

# A model every rank starts from rank 0's weights of.
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * size, momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Average)

# Uneven data: rank r has 3 + r batches.
g = torch.Generator().manual_seed(100 + rank)
batches = [(torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(3 + rank)]
for epoch in range(3):
    for x, y in batches:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    last = hvd.join()
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    mean_loss = hvd.allreduce(loss.detach(), name="epoch_loss").item()
    if rank == 0:
        print(f"epoch {epoch} loss {mean_loss:.4f} last_joined {last}", flush=True)

# Every rank ends with the same weights.
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
spread = hvd.allreduce(flat, op=hvd.Max) - hvd.allreduce(flat, op=hvd.Min)
print(f"rank {rank} weights_spread {spread.abs().max().item():.3g}", flush=True)

# alltoall: rank r sends r + 1 rows to every rank.
rows = torch.arange(size * (rank + 1), dtype=torch.float32).reshape(-1, 1) + 100 * rank
out, received = hvd.alltoall(rows, splits=torch.full((size,), rank + 1, dtype=torch.int32))
print(f"rank {rank} alltoall_received {received.tolist()} first_rows {out[:, 0].tolist()}", flush=True)

# reducescatter: the sum over ranks, rank r keeps its share of the rows.
shard = hvd.reducescatter(torch.ones(2 * size, 3) * (rank + 1), op=hvd.Sum)
print(f"rank {rank} reducescatter {shard.shape[0]}x{shard.shape[1]} value {shard[0, 0].item():g}", flush=True)

# A process set: only its members call its ops.
if evens.included():
    s = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, process_set=evens)
    print(f"rank {rank} evens_rank {evens.rank()} evens_sum {s.item():g}", flush=True)
hvd.barrier()
hvd.shutdown()
