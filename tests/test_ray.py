"""hvdtorch inside Ray Train: a 2-worker TorchTrainer on a local Ray cluster the test starts.

`make test` installs Ray (requirements-ray.txt, about 500 MB); where it
cannot be installed, this test skips and says so.
"""

import json
import os
import tempfile

import pytest
import torch
import torch.nn.functional as F

from tests.harness import ROOT
from tests.workers import ray_train

ray = pytest.importorskip(
    "ray",
    reason="ray could not be installed here (make test tries: pip install --no-deps -r requirements-ray.txt)",
)


@pytest.fixture
def local_ray(monkeypatch):
    # Workers are started by Ray from this process's environment: they find hvdtorch and the tests here.
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("HVDTORCH_TIMEOUT", "60")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    except Exception as e:  # e.g. no shared memory or no free ports for Ray's services
        pytest.skip(f"a local Ray cluster cannot start here: {e}")
    try:
        yield
    finally:
        ray.shutdown()


def test_two_worker_torch_trainer_trains_like_one_process(local_ray, tmp_path):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        ray_train.train_loop,
        train_loop_config={"out": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=tempfile.mkdtemp(dir=tmp_path)),
    )
    trainer.fit()
    infos = [json.load(open(tmp_path / f"rank-{r}.json")) for r in range(2)]
    for r, info in enumerate(infos):
        assert (info["rank"], info["size"], info["local_rank"]) == (r, 2, r)
        assert info["group_before_init"] and info["adopted"]  # Ray's process group, adopted
        assert info["links"] == {str(1 - r): ["shm"]}  # same host: shared memory between the workers
    # the reference: one process on every global batch
    net = ray_train.model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for step in range(ray_train.STEPS):
        x, y = ray_train.batch(step)
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
    expected = torch.cat([p.detach().flatten() for p in net.parameters()])
    for info in infos:
        assert torch.allclose(torch.tensor(info["weights"]), expected, atol=1e-6)
