"""hvdtorch inside Ray Train: every TorchTrainer worker is an hvdtorch rank.

    pip install --no-deps -r requirements-ray.txt       # Ray is optional (large)
    python examples/ray_train.py --workers 2             # starts a local Ray cluster
    python examples/ray_train.py --address auto          # or joins a running one

Ray Train starts the workers and creates the default torch.distributed
process group in each; ``hvd.init()`` adopts that group (and leaves it to
Ray at shutdown), learns which workers share a host, and from then on the
training loop is the ordinary hvdtorch one: DistributedModel, a broadcast of
rank 0's weights, each worker on its slice of every global batch. Workers on
one host exchange gradients through shared memory.
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_loop(config):
    import ray.train

    import hvdtorch as hvd

    hvd.init()  # adopts the process group Ray Train made
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    model = hvd.DistributedModel(torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    # Data with structure: the class is which of 4 fixed directions the point lies closest to.
    directions = torch.randn(4, 20, generator=torch.Generator().manual_seed(1))
    for step in range(config["steps"]):
        g = torch.Generator().manual_seed(1000 + step)  # every worker draws the same global batch ...
        x = torch.randn(config["global_batch"], 20, generator=g)
        y = (x @ directions.T).argmax(1)
        mine = slice(rank, None, size)  # ... and trains on its slice of it
        loss = F.cross_entropy(model(x[mine]), y[mine])
        opt.zero_grad()
        loss.backward()
        opt.step()
        global_loss = hvd.allreduce(loss.detach(), name="loss").item()
        if step % 20 == 0 or step == config["steps"] - 1:
            ray.train.report({"step": step, "loss": global_loss})
            if rank == 0:
                print(f"step {step:4d}  loss {global_loss:.3f}  ({size} workers)", flush=True)
    hvd.shutdown()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--address", help="a running Ray cluster (default: start a local one)")
    args = p.parse_args()
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    # Workers inherit this environment: let them import hvdtorch from this checkout too.
    os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ray.init(address=args.address, num_cpus=None if args.address else args.workers, include_dashboard=False)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"lr": 0.05, "steps": args.steps, "global_batch": 64},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
        run_config=RunConfig(storage_path=os.path.join(ROOT, "build", "ray_results")),
    )
    trainer.fit()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
