"""Lightning's Trainer with strategy="hvdtorch" (hvdtorch/lightning.py)."""

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

    import hvdtorch.lightning

    trainer = L.Trainer(strategy="hvdtorch", accelerator="cpu", logger=False, enable_progress_bar=False)
    assert isinstance(trainer.strategy, hvdtorch.lightning.HvdtorchStrategy)
