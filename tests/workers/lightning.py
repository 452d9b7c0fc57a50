"""Lightning with strategy="hvdtorch" on N ranks against a single-process Lightning fit on the global batch."""

import os

import torch
import torch.nn.functional as F

import hvdtorch as hvd

PER_RANK = 4
SAMPLES = 64


def _lightning():
    import lightning as L

    import hvdtorch.integrations.lightning  # noqa: F401  (registers "hvdtorch")

    return L


def _module(manual=False):
    L = _lightning()

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.body = torch.nn.Linear(8, 16)
            self.head = torch.nn.Linear(16, 4)
            self.automatic_optimization = not manual

        def forward(self, x):
            return self.head(F.relu(self.body(x)))

        def training_step(self, batch, _):
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            if not manual:
                return loss
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()

        def validation_step(self, batch, _):
            x, y = batch
            self.log("val_loss", F.cross_entropy(self(x), y), sync_dist=True)
            self.log("val_samples", float(len(y)), reduce_fx="sum", sync_dist=True)
            self.log("val_max_rank", float(self.global_rank), reduce_fx="max", sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    return Net()


def _data(n=SAMPLES, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g))


def _trainer(strategy, epochs, accelerator="cpu", **kw):
    L = _lightning()
    return L.Trainer(
        strategy=strategy,
        accelerator=accelerator,
        max_epochs=epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        **kw,
    )


def _flat(module):
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def _same_on_every_rank(t):
    rows = hvd.allgather(t.unsqueeze(0))
    for r in range(1, hvd.size()):
        assert torch.equal(rows[0], rows[r]), f"rank {r} ends with other weights than rank 0"


def check_fit_equals_single_process(mode, accelerator="cpu"):
    """mode: automatic | manual | accumulate. accelerator "gpu": every
    process trains on the GPU of its local rank (round-robin over those
    visible: all on cuda:0 on a machine with one), against one process on
    the CPU."""
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.strategies import SingleDeviceStrategy

    manual, accumulate = mode == "manual", 2 if mode == "accumulate" else 1
    seen = {}

    class Wrapped(Callback):
        def on_train_batch_end(self, trainer, *args):
            seen["model"] = type(trainer.strategy.model).__name__
            seen["optimizer"] = type(trainer.strategy.optimizers[0]).__mro__[1].__name__ if manual else None

    model = _module(manual)
    trainer = _trainer("hvdtorch", 2, accelerator, accumulate_grad_batches=accumulate, callbacks=[Wrapped()])
    trainer.fit(model, torch.utils.data.DataLoader(_data(), batch_size=PER_RANK))
    size = hvd.size()
    assert trainer.world_size == size and trainer.global_rank == hvd.rank()
    if accelerator == "gpu":
        local_rank = int(os.environ.get("LOCAL_RANK", hvd.local_rank()))
        want = torch.device("cuda", local_rank % torch.cuda.device_count())
        assert trainer.strategy.root_device == want, (trainer.strategy.root_device, want)
        where = {p.device for p in model.parameters()}
        assert where == {want}, f"rank {hvd.rank()}: parameters on {where}, want {want}"
    assert seen["model"] == ("Net" if manual else "DistributedModel"), seen
    if manual:  # the DistributedOptimizer subclass sits on top of SGD
        assert type(trainer.strategy.optimizers[0]).__name__ == "SGD" and hasattr(
            trainer.strategy.optimizers[0], "synchronize"
        )
    _same_on_every_rank(_flat(model))
    if hvd.rank() == 0:
        trained = _flat(model).cpu()
        # Lightning shuffles training data under a distributed strategy (DistributedSampler, seed 0, reshuffled
        # per epoch); one process sees the same global batches through a one-replica DistributedSampler.
        ds = _data()
        order = torch.utils.data.DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
        ref = _module(manual)
        _trainer(SingleDeviceStrategy(device="cpu"), 2, accumulate_grad_batches=accumulate).fit(
            ref, torch.utils.data.DataLoader(ds, batch_size=PER_RANK * size, sampler=order)
        )
        diff = (trained - _flat(ref)).abs().max().item()
        # The GPU's float32 kernels sum in another order than the CPU's.
        tolerance = 1e-5 if accelerator == "cpu" else 1e-4
        assert diff < tolerance, f"{mode}: {size} ranks differ from one process on the global batch by {diff}"
        assert not torch.equal(_flat(ref), _flat(_module(manual))), "training did not change the weights"


def check_validation_metrics_reduced():
    model = _module()
    trainer = _trainer("hvdtorch", 1)
    val = _data(40, seed=2)
    trainer.fit(
        model, torch.utils.data.DataLoader(_data(), batch_size=PER_RANK), torch.utils.data.DataLoader(val, batch_size=5)
    )
    metrics = trainer.callback_metrics
    x, y = val.tensors
    with torch.no_grad():
        whole = F.cross_entropy(model(x), y).item()  # the mean over the whole set, one process
    assert abs(metrics["val_loss"].item() - whole) < 1e-5, (metrics["val_loss"].item(), whole)
    assert metrics["val_samples"].item() == 40  # every rank's samples summed
    assert metrics["val_max_rank"].item() == hvd.size() - 1
    # trainer.validate on its own (no fitting: the model is not wrapped) reduces the same way
    out = trainer.validate(model, torch.utils.data.DataLoader(val, batch_size=5), verbose=False)
    assert abs(out[0]["val_loss"] - whole) < 1e-5
    # The strategy's own reduce (default "mean", integers averaged in float) and all_gather (one row per rank).
    r, n = hvd.rank(), hvd.size()
    strategy = trainer.strategy
    mean = sum(range(n)) / n
    assert strategy.reduce(torch.tensor(float(r))).item() == mean
    assert strategy.reduce(torch.tensor(r)).item() == mean
    assert strategy.reduce(torch.tensor(float(r)), reduce_op="sum").item() == sum(range(n))
    gathered = strategy.all_gather(torch.full((2,), float(r)))
    assert torch.equal(gathered, torch.arange(n, dtype=torch.float32)[:, None].expand(n, 2)), gathered


def check_checkpoint_resume(directory):
    def loader():
        return torch.utils.data.DataLoader(_data(), batch_size=PER_RANK, shuffle=True)

    straight = _module()
    torch.manual_seed(5)
    _trainer("hvdtorch", 4).fit(straight, loader())

    first = _module()
    torch.manual_seed(5)
    trainer = _trainer("hvdtorch", 2)
    trainer.fit(first, loader())
    path = os.path.join(directory, "two-epochs.ckpt")
    trainer.save_checkpoint(path)  # rank 0 writes, then every rank passes a barrier
    assert os.path.exists(path)

    resumed = _module()  # fresh weights: everything must come from the checkpoint
    _trainer("hvdtorch", 4).fit(resumed, loader(), ckpt_path=path)
    diff = (_flat(straight) - _flat(resumed)).abs().max().item()
    assert diff < 1e-6, f"resumed run differs from the uninterrupted one by {diff}"
    halfway = torch.load(path, weights_only=False)
    assert halfway["global_step"] == 2 * SAMPLES // (PER_RANK * hvd.size())
    assert halfway["optimizer_states"][0]["state"], "momentum missing from the checkpoint"
    _same_on_every_rank(_flat(resumed))
