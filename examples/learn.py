"""A small CNN learns to classify synthetic images, data-parallel with hvdtorch.

    torchrun --nproc_per_node=2 examples/learn.py --steps 150
    python examples/learn.py --steps 150          # one process, same global batch
    torchrun --nproc_per_node=2 examples/learn.py --compression powersgd --powersgd-rank 4

The data have structure to learn: every class is a fixed random pattern
(smooth, seeded), and every image is its class's pattern at a random
contrast, shifted by a few pixels and buried in noise, so the class can be
recovered only by looking. Every process builds the same data set from the
same seed; each step takes one global batch (the same whatever the number of
processes) and every rank trains on its slice of it. N processes therefore
follow the loss curve of one process up to rounding -- the demo checks that.

Rank 0 shows a progress bar (tqdm) with the loss of the global batch, prints
the held-out accuracy as it rises, and with --result writes the curve and the
throughput as JSON.
"""

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

import hvdtorch as hvd

CLASSES = 10
IMAGE = 16


def make_data(n: int, seed: int):
    """`n` images (3 x IMAGE x IMAGE) and labels; the class patterns come from seed 0, the samples from `seed`."""
    patterns = F.interpolate(
        torch.randn(CLASSES, 3, 4, 4, generator=torch.Generator().manual_seed(0)),
        size=(IMAGE, IMAGE),
        mode="bilinear",
        align_corners=False,
    )
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    contrast = 0.5 + torch.rand(n, 1, 1, 1, generator=g)
    images = patterns[labels] * contrast
    shifts = torch.randint(-2, 3, (n, 2), generator=g)
    for i in range(n):
        images[i] = torch.roll(images[i], shifts=(int(shifts[i, 0]), int(shifts[i, 1])), dims=(1, 2))
    images += 3.0 * torch.randn(images.shape, generator=g)
    return images, labels


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32 * (IMAGE // 4) ** 2, CLASSES)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def accuracy(model, images, labels, rank, size):
    """Share of the held-out set classified right; each rank scores its slice."""
    with torch.no_grad():
        mine = slice(rank, None, size)
        correct = (model(images[mine]).argmax(1) == labels[mine]).sum().double()
    return hvd.allreduce(correct, op=hvd.Sum, name="learn.correct").item() / len(labels)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--global-batch", type=int, default=64, help="split evenly over the processes")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--train-size", type=int, default=4096)
    p.add_argument("--val-size", type=int, default=1000)
    p.add_argument("--result", help="write the loss curve, accuracies and throughput here (JSON)")
    p.add_argument("--compression", choices=("none", "fp16", "powersgd"), default="none", help="of the gradients")
    p.add_argument("--powersgd-rank", type=int, default=4, help="with --compression powersgd")
    p.add_argument("--powersgd-start-iter", type=int, default=10, help="with --compression powersgd")
    return p.parse_args(argv)


def compression(args):
    """The hvd.Compression --compression names."""
    if args.compression == "powersgd":
        return hvd.Compression.powersgd(rank=args.powersgd_rank, start_iter=args.powersgd_start_iter)
    return getattr(hvd.Compression, args.compression)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if args.global_batch % size:
        raise SystemExit(f"learn: --global-batch {args.global_batch} does not split over {size} processes")
    train_x, train_y = make_data(args.train_size, seed=1)
    val_x, val_y = make_data(args.val_size, seed=2)

    torch.manual_seed(0)
    model = hvd.DistributedModel(SmallCNN(), compression=compression(args))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    order = torch.randperm(args.train_size, generator=torch.Generator().manual_seed(3))

    bar = None
    if rank == 0:
        from tqdm import tqdm

        bar = tqdm(
            total=args.steps,
            desc=f"{size} process{'es' if size > 1 else ''}",
            unit="step",
            dynamic_ncols=True,
            mininterval=0.5,
        )
    losses, accuracies, train_seconds = [], [], 0.0
    for step in range(args.steps):
        start = step * args.global_batch % (args.train_size - args.global_batch + 1)
        batch = order[start : start + args.global_batch][rank::size]  # this rank's slice of the global batch
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(train_x[batch]), train_y[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        train_seconds += time.perf_counter() - t0
        # the loss of the global batch: the mean of the ranks' means (equal slices)
        global_loss = hvd.allreduce(loss.detach(), op=hvd.Average, name="learn.loss").item()
        losses.append(global_loss)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            acc = accuracy(model, val_x, val_y, rank, size)
            accuracies.append((step + 1, acc))
            if bar is not None:
                bar.write(f"  step {step + 1:4d}: loss {global_loss:.3f}, held-out accuracy {acc * 100:5.1f}%")
        if bar is not None:
            bar.set_postfix(loss=f"{global_loss:.3f}", acc=f"{accuracies[-1][1] * 100:.0f}%" if accuracies else "-")
            bar.update(1)
    if bar is not None:
        bar.close()
    # The job runs at the pace of its slowest rank.
    slowest = hvd.allreduce(torch.tensor([train_seconds], dtype=torch.float64), op=hvd.Max, name="learn.time").item()
    result = {
        "processes": size,
        "global_batch": args.global_batch,
        "compression": args.compression,
        "steps": args.steps,
        "losses": losses,
        "accuracies": accuracies,
        "img_per_s": args.steps * args.global_batch / slowest,
    }
    if rank == 0 and args.result:
        with open(args.result, "w") as f:
            json.dump(result, f)
    hvd.shutdown()
    return result


if __name__ == "__main__":
    main()
