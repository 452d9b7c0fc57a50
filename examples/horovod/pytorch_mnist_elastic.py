"""Elastic MNIST training written as a Horovod user writes it; only the import
names hvdtorch. Under torchrun a lost worker makes the agent restart every
worker, and training resumes from the last commit (the commit directory is
HVDTORCH_ELASTIC_DIR; see hvdtorch.elastic).

    export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 HVDTORCH_ELASTIC_DIR=/tmp/mnist-commits
    torchrun --nproc_per_node=2 --max-restarts=3 examples/horovod/pytorch_mnist_elastic.py --epochs 2
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from filelock import FileLock
from torchvision import datasets, transforms

import hvdtorch as hvd

parser = argparse.ArgumentParser(description="PyTorch elastic MNIST example")
parser.add_argument("--batch-size", type=int, default=64, help="input batch size for training")
parser.add_argument("--test-batch-size", type=int, default=1000, help="input batch size for testing")
parser.add_argument("--epochs", type=int, default=10, help="number of epochs to train")
parser.add_argument("--lr", type=float, default=0.01, help="learning rate")
parser.add_argument("--momentum", type=float, default=0.5, help="SGD momentum")
parser.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
parser.add_argument("--seed", type=int, default=42, help="random seed")
parser.add_argument("--log-interval", type=int, default=10, help="batches between training logs")
parser.add_argument("--batches-per-commit", type=int, default=1, help="batches between commits of the state")
parser.add_argument("--fp16-allreduce", action="store_true", default=False, help="fp16 compression in allreduce")
parser.add_argument("--use-adasum", action="store_true", default=False, help="use Adasum to combine updates")
parser.add_argument("--data-dir", help="where the MNIST dataset is (downloaded there if needed)")
args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

hvd.init()
torch.manual_seed(args.seed)
if args.cuda:
    torch.cuda.set_device(hvd.local_rank())
    torch.cuda.manual_seed(args.seed)
torch.set_num_threads(1)

kwargs = {"num_workers": 1, "pin_memory": True} if args.cuda else {}
data_dir = args.data_dir or "./data"
normalize = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
with FileLock(os.path.expanduser("~/.horovod_lock")):
    train_dataset = datasets.MNIST(data_dir, train=True, download=True, transform=normalize)
train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler, **kwargs)
test_dataset = datasets.MNIST(data_dir, train=False, transform=normalize)
test_sampler = torch.utils.data.distributed.DistributedSampler(test_dataset, num_replicas=hvd.size(), rank=hvd.rank())
test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size, sampler=test_sampler, **kwargs)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


model = Net()
lr_scaler = hvd.size() if not args.use_adasum else 1
if args.cuda:
    model.cuda()
    if args.use_adasum and hvd.nccl_built():
        lr_scaler = hvd.local_size()
optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none


def metric_average(val, name):
    return hvd.allreduce(torch.tensor(val), name=name).item()


@hvd.elastic.run
def train(state):
    if hvd.rank() == 0:
        print(f"Starting at epoch {state.epoch} batch {state.batch} on {hvd.size()} ranks", flush=True)
    for state.epoch in range(state.epoch, args.epochs + 1):  # noqa: B020  (Horovod's idiom: the state tracks the loop)
        state.model.train()
        train_sampler.set_epoch(state.epoch)
        steps_remaining = len(train_loader) - state.batch
        for state.batch, (data, target) in enumerate(train_loader):
            if state.batch >= steps_remaining:
                break
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            state.optimizer.zero_grad()
            loss = F.nll_loss(state.model(data), target)
            loss.backward()
            state.optimizer.step()
            if state.batch % args.log_interval == 0:
                print(
                    f"Train Epoch: {state.epoch} [{state.batch * len(data)}/{len(train_sampler)} "
                    f"({100.0 * state.batch / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}",
                    flush=True,
                )
            if (state.batch + 1) % args.batches_per_commit == 0:
                state.commit()
        state.batch = 0


def test():
    model.eval()
    test_loss, test_accuracy = 0.0, 0.0
    with torch.no_grad():
        for data, target in test_loader:
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.max(1, keepdim=True)[1]
            test_accuracy += pred.eq(target.view_as(pred)).cpu().float().sum().item()
    test_loss = metric_average(test_loss / len(test_sampler), "avg_loss")
    test_accuracy = metric_average(test_accuracy / len(test_sampler), "avg_accuracy")
    if hvd.rank() == 0:
        print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {100.0 * test_accuracy:.2f}%\n", flush=True)


optimizer = hvd.DistributedOptimizer(
    optimizer,
    named_parameters=model.named_parameters(),
    compression=compression,
    op=hvd.Adasum if args.use_adasum else hvd.Average,
)


def on_state_reset():
    # The number of ranks may have changed: scale the learning rate again.
    for param_group in optimizer.param_groups:
        param_group["lr"] = args.lr * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, epoch=1, batch=0)
state.register_reset_callbacks([on_state_reset])
train(state)
test()
