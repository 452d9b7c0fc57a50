"""Synthetic-data throughput of a torchvision model, written as a Horovod user
writes it; only the import names hvdtorch.

    torchrun --nproc_per_node=2 examples/horovod/pytorch_synthetic_benchmark.py --model resnet18
    torchrun --nproc_per_node=2 examples/horovod/pytorch_synthetic_benchmark.py --fp16-allreduce
    torchrun --nproc_per_node=2 examples/horovod/pytorch_synthetic_benchmark.py --use-adasum

--image-size and --num-classes make it small enough for a CPU test
(tests/test_horovod_examples.py).
"""

import argparse
import timeit

import numpy as np
import torch
import torch.backends.cudnn as cudnn
import torch.nn.functional as F
import torch.optim as optim
from torchvision import models

import hvdtorch as hvd

parser = argparse.ArgumentParser(
    description="PyTorch synthetic benchmark", formatter_class=argparse.ArgumentDefaultsHelpFormatter
)
parser.add_argument("--fp16-allreduce", action="store_true", default=False, help="fp16 compression in allreduce")
parser.add_argument("--model", type=str, default="resnet50", help="torchvision model to benchmark")
parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
parser.add_argument("--image-size", type=int, default=224, help="height and width of the synthetic images")
parser.add_argument("--num-classes", type=int, default=1000, help="classes of the model's output")
parser.add_argument("--num-warmup-batches", type=int, default=10, help="warm-up batches, not timed")
parser.add_argument("--num-batches-per-iter", type=int, default=10, help="batches per timed iteration")
parser.add_argument("--num-iters", type=int, default=10, help="timed iterations")
parser.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
parser.add_argument("--use-adasum", action="store_true", default=False, help="use Adasum to combine updates")
args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

hvd.init()
if args.cuda:
    torch.cuda.set_device(hvd.local_rank())
cudnn.benchmark = True

model = getattr(models, args.model)(num_classes=args.num_classes)

# Adasum needs no learning-rate scaling; averaging does.
lr_scaler = hvd.size() if not args.use_adasum else 1
if args.cuda:
    model.cuda()
    if args.use_adasum and hvd.nccl_built():
        lr_scaler = hvd.local_size()

optimizer = optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(
    optimizer,
    named_parameters=model.named_parameters(),
    compression=compression,
    op=hvd.Adasum if args.use_adasum else hvd.Average,
)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
target = torch.LongTensor(args.batch_size).random_() % args.num_classes
if args.cuda:
    data, target = data.cuda(), target.cuda()


def benchmark_step():
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()


def log(s):
    if hvd.rank() == 0:
        print(s, flush=True)


device = "GPU" if args.cuda else "CPU"
log(f"Model: {args.model}")
log(f"Batch size: {args.batch_size}")
log(f"Number of {device}s: {hvd.size()}")
log("Running warmup...")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)
log("Running benchmark...")
img_secs = []
for i in range(args.num_iters):
    elapsed = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / elapsed
    log(f"Iter #{i}: {img_sec:.1f} img/sec per {device}")
    img_secs.append(img_sec)

mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
log(f"Img/sec per {device}: {mean:.1f} +-{conf:.1f}")
log(f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")

# Every rank must hold the same weights after training.
flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
spread = (hvd.allreduce(flat, op=hvd.Max) - hvd.allreduce(flat, op=hvd.Min)).abs().max().item()
log(f"Max weight difference across ranks: {spread:.3g}")
