"""A short DistributedModel run that writes a timeline per rank (HVDTORCH_TIMELINE=.../trace-{rank}.json).

The model sleeps in backward between its head and its first layer, so the
head's bucket is reduced while backward is still running: the trace must
show communication inside BACKWARD. Each rank writes what it knows about the
run (steps, bucket count) next to its trace.
"""

import json
import os
import time

import torch
import torch.nn.functional as F

import hvdtorch as hvd

STEPS = 5
BACKWARD_SLEEP_S = 0.1


class SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(BACKWARD_SLEEP_S)
        return grad


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(32, 256)
        self.middle = torch.nn.Linear(256, 256)
        self.head = torch.nn.Linear(256, 8)

    def forward(self, x):
        h = SlowBackward.apply(F.relu(self.first(x)))
        return self.head(F.relu(self.middle(h)))


def train_with_timeline(out_dir):
    hvd.init()
    torch.manual_seed(0)
    # One bucket per layer (each well over the first bucket's 1 KiB): the head's goes first.
    model = hvd.DistributedModel(Net(), fusion_bytes=40_000, first_bucket_bytes=1024)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(hvd.rank())
    for _ in range(STEPS):
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 8, (16,), generator=g)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    buckets = len(model.bucket_bytes())
    hvd.shutdown()  # closes the trace file
    with open(os.path.join(out_dir, f"run-{hvd_rank_from_env()}.json"), "w") as f:
        json.dump({"steps": STEPS, "buckets": buckets}, f)


def hvd_rank_from_env():
    return int(os.environ["RANK"])
