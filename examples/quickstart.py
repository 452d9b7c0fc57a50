"""Quickstart: a single-process training script made data-parallel with hvdtorch.

    torchrun --nproc_per_node=2 examples/quickstart.py
    mpirun -np 2 python examples/quickstart.py
    python examples/quickstart.py          # one process: the same training on the same global batch

Every rank runs this whole file. The lines marked `# hvd` are what changes in
a single-process script: join the job, wrap the model, give each rank its
share of the data, and log and save on rank 0 only. A small CNN learns a
synthetic data set (built alike on every rank from fixed seeds); the global
batch is the same whatever the number of ranks, so 2 ranks train as one
process does on that batch, up to float rounding (tests/test_quickstart.py
checks it under torchrun and mpirun).
"""

import argparse
import json

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hvdtorch as hvd

CLASSES, SIDE = 4, 12


def synthetic_dataset(n: int, seed: int) -> TensorDataset:
    """`n` noisy 1 x SIDE x SIDE images of CLASSES fixed patterns, and their labels; the same on every rank."""
    patterns = torch.randn(CLASSES, 1, SIDE, SIDE, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    images = patterns[labels] + 2.0 * torch.randn(n, 1, SIDE, SIDE, generator=g)
    return TensorDataset(images, labels)


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * (SIDE // 2) ** 2, CLASSES),
    )


def evaluate(model, loader) -> float:
    """The accuracy on the whole validation set: each rank scores its shard, hvd.allreduce averages."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            total += len(y)
    model.train()
    # Equal shards (the set splits evenly over the ranks), so the average of the ranks' accuracies is the accuracy.
    return hvd.allreduce(torch.tensor(correct / total), op=hvd.Average, name="val.accuracy").item()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--global-batch", type=int, default=64, help="samples per step, over all ranks together")
    p.add_argument("--lr", type=float, default=0.02, help="the learning rate for the global batch")
    p.add_argument("--train-size", type=int, default=2048)
    p.add_argument("--val-size", type=int, default=512)
    p.add_argument("--checkpoint", default="quickstart.pt", help="written by rank 0 after every epoch")
    p.add_argument("--out", help="rank 0 writes the losses, accuracies and a parameter checksum here (JSON)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    hvd.init()  # hvd: join the job (torchrun, mpirun, srun or plain python)
    if args.global_batch % hvd.size():
        raise SystemExit(f"quickstart: --global-batch {args.global_batch} does not split over {hvd.size()} ranks")

    torch.manual_seed(0)
    model = make_model()
    # hvd: BatchNorm's statistics over the global batch, so that N ranks train as one process (plain
    # BatchNorm would normalise each rank's share by its own statistics: a different, noisier training).
    model = hvd.SyncBatchNorm.convert_sync_batchnorm(model)
    # hvd: rank 0's parameters and buffers go to every rank here; backward averages the gradients.
    model = hvd.DistributedModel(model)

    train, val = synthetic_dataset(args.train_size, seed=1), synthetic_dataset(args.val_size, seed=2)
    # hvd: each rank reads its 1/size of the samples, in an order shuffled alike on every rank.
    sampler = DistributedSampler(train, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=42)
    per_rank_batch = args.global_batch // hvd.size()  # hvd: the global batch split over the ranks
    loader = DataLoader(train, batch_size=per_rank_batch, sampler=sampler)
    # DistributedSampler pads a set that does not split evenly with repeated samples; these sizes split.
    val_sampler = DistributedSampler(val, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    val_loader = DataLoader(val, batch_size=256, sampler=val_sampler)
    # The learning rate of the global batch: the global batch is fixed, so it does not change with the
    # ranks. (A script that keeps its per-rank batch instead grows the global batch with the ranks,
    # and then usually scales the learning rate by hvd.size().)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    losses, accuracies = [], []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # hvd: a new shuffle each epoch, the same on every rank
        total, steps = torch.zeros(()), 0
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()  # the gradients are averaged over the ranks while backward runs
            opt.step()
            total += loss.detach()
            steps += 1
        # The epoch's loss over the global batches: the average of the ranks' (equal shares).
        losses.append(hvd.allreduce(total / steps, op=hvd.Average, name="train.loss").item())
        accuracies.append(evaluate(model, val_loader))  # every rank evaluates its shard
        if hvd.rank() == 0:  # hvd: log and save on rank 0 only
            print(f"epoch {epoch + 1}: loss {losses[-1]:.4f}, val accuracy {accuracies[-1] * 100:.1f}%", flush=True)
            # Every rank holds the same weights, so rank 0 saves them the usual way (model.module is
            # the model you wrapped). No barrier is needed; a script whose other ranks read the file
            # next calls hvd.barrier() after the save.
            checkpoint = {"model": model.module.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch + 1}
            torch.save(checkpoint, args.checkpoint)
            # To resume: torch.load the file on every rank and load_state_dict before the wrap.

    if hvd.rank() == 0 and args.out:
        checksum = sum(p.double().sum().item() for p in model.module.parameters())
        with open(args.out, "w") as f:
            json.dump({"size": hvd.size(), "losses": losses, "accuracies": accuracies, "checksum": checksum}, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
