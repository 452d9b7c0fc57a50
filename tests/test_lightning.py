"""Lightning's Trainer with strategy="hvdtorch" (hvdtorch/integrations/lightning.py)."""

import pytest

from tests.harness import run_ranks

pytest.importorskip(
    "lightning",
    reason="lightning is not installed (pip install --no-deps lightning==2.6.6 ...; see requirements-dev.txt)",
)


@pytest.mark.parametrize("mode", ["automatic", "manual", "accumulate"])
def test_two_rank_fit_equals_single_process_on_the_global_batch(mode):
    run_ranks("tests.workers.lightning:check_fit_equals_single_process", 2, timeout=150, args=[mode])


def test_validation_metrics_reduced_across_ranks():
    run_ranks("tests.workers.lightning:check_validation_metrics_reduced", 2, timeout=150)


def test_checkpoint_save_and_resume(tmp_path):
    run_ranks("tests.workers.lightning:check_checkpoint_resume", 2, timeout=150, args=[str(tmp_path)])


def test_strategy_name_registered():
    import lightning as L

    import hvdtorch.integrations.lightning

    trainer = L.Trainer(strategy="hvdtorch", accelerator="cpu", logger=False, enable_progress_bar=False)
    assert isinstance(trainer.strategy, hvdtorch.integrations.lightning.HvdtorchStrategy)


def test_each_process_takes_the_device_of_its_local_rank(monkeypatch):
    import torch

    from hvdtorch.integrations.lightning import device_of_process

    cpu, gpus = [torch.device("cpu")], [torch.device("cuda", i) for i in range(4)]
    assert device_of_process(None, 1, 2) == torch.device("cpu")
    assert device_of_process(cpu, 3, 4) == torch.device("cpu")
    # One device listed per local process (devices="auto" or devices=N): the local rank's.
    assert device_of_process(gpus, 2, 4) == torch.device("cuda", 2)
    assert device_of_process(gpus[:2], 1, 2) == torch.device("cuda", 1)
    # devices=1: the local rank's GPU, shared round-robin when fewer are visible.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_of_process(gpus[:1], 1, 4) == torch.device("cuda", 1)
    assert device_of_process(gpus[:1], 3, 4) == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"devices=2 for 4 processes on this host"):
        device_of_process(gpus[:2], 0, 4)
    with pytest.raises(ValueError, match=r"one CPU device per process, got devices=2"):
        device_of_process(cpu * 2, 0, 1)
