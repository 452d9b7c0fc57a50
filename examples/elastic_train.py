"""Elastic training: survives a lost worker or host by resuming from the last commit.

    export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1   # docs/guide.md, Elastic training: a new rendezvous store per restart
    torchrun --nproc_per_node=2 --max-restarts=3 examples/elastic_train.py --commit-dir /tmp/elastic-demo
    # in another shell, kill -9 one of the workers (python ... elastic_train.py): the agent
    # restarts both, and training goes on from the last commit

Several hosts, with hosts allowed to leave (and join) between 1 and 2 nodes:

    torchrun --nnodes=1:2 --nproc_per_node=2 --max-restarts=3 --rdzv-backend=c10d \\
        --rdzv-endpoint=HOST0:29400 --rdzv-id=demo examples/elastic_train.py --commit-dir /shared/elastic-demo

A small deterministic model on synthetic data. The state (model, optimizer,
ElasticSampler, epoch, step, and a per-sample count of the current epoch) is
committed every --commit-every steps and at the end of each epoch. With
--check-samples (default) every rank verifies at the end of each epoch that
every sample was trained on exactly once across the restarts. Rank 0 prints
progress and, with --out, saves the final parameters.
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F

import hvdtorch as hvd


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--commit-dir",
        default=os.environ.get("HVDTORCH_ELASTIC_DIR"),
        help="where commits persist (default: $HVDTORCH_ELASTIC_DIR)",
    )
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=96, help="dataset size")
    p.add_argument("--batch-size", type=int, default=4, help="per rank")
    p.add_argument("--commit-every", type=int, default=3, help="steps between commits")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per step (demos)")
    p.add_argument("--no-check-samples", dest="check_samples", action="store_false")
    p.add_argument("--out", help="rank 0 saves the final parameters here")
    return p.parse_args(argv)


def dataset(n: int):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 4, generator=g)
    y = (x @ w).argmax(dim=1)
    return torch.utils.data.TensorDataset(x, y, torch.arange(n))


@hvd.elastic.run
def train(state, loader, args):
    model, opt = state.model, state.optimizer
    rank = hvd.rank()
    if rank == 0 and state.commit_count:
        print(f"resumed from commit {state.commit_count}: epoch {state.epoch}, step {state.step}", flush=True)
    while state.epoch < args.epochs:
        for batch_idx, (x, y, idx) in enumerate(loader):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            state.sampler.record_batch(batch_idx, args.batch_size)
            if args.check_samples:
                counts = torch.zeros(args.samples)
                counts.index_add_(0, idx, torch.ones(len(idx)))
                state.seen += hvd.allreduce(counts, op=hvd.Sum, name="elastic.seen")
            state.step += 1
            if rank == 0:
                print(f"epoch {state.epoch} step {state.step} loss {loss.item():.4f}", flush=True)
            if state.step % args.commit_every == 0:
                state.commit()
            time.sleep(args.step_delay)
        if args.check_samples:
            wrong = (state.seen != 1).nonzero().flatten().tolist()
            assert not wrong, f"rank {rank}: epoch {state.epoch}: samples {wrong[:10]} not seen exactly once"
            if rank == 0:
                print(f"epoch {state.epoch}: every sample trained on exactly once", flush=True)
        state.epoch += 1
        state.sampler.set_epoch(state.epoch)
        state.seen = torch.zeros(args.samples)
        state.commit()


def main(argv=None):
    args = parse_args(argv)
    hvd.init()
    torch.manual_seed(0)
    model = hvd.DistributedModel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    data = dataset(args.samples)
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=7)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    state = hvd.elastic.TorchState(
        model, opt, commit_dir=args.commit_dir, sampler=sampler, epoch=0, step=0, seen=torch.zeros(args.samples)
    )
    state.register_reset_callbacks([lambda: print(f"rank {hvd.rank()}: resuming on {hvd.size()} ranks", flush=True)])
    if hvd.rank() == 0:
        restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        print(f"start: {hvd.size()} ranks, restart {restarts}, commit dir {args.commit_dir}", flush=True)
    train(state, loader, args)
    if hvd.rank() == 0:
        print(f"done: {state.epoch} epochs, {state.step} steps, {state.commit_count} commits", flush=True)
        if args.out:
            torch.save({k: v.clone() for k, v in model.state_dict().items()}, args.out)
    hvd.shutdown()


if __name__ == "__main__":
    main()
