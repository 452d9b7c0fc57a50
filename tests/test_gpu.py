"""The collectives, DistributedModel and the sharded optimizer on CUDA
tensors, at 1, 2 and 4 processes sharing cuda:0. Needs a GPU and a CUDA
build of hvdtorch: make gpu-check runs these on the GPU machine; elsewhere
they are skipped, saying why. Everything device-generic they exercise also
runs on every CI machine through the simulated device
(test_sim_device_mode.py, test_engine_sim)."""

import pytest
import torch

import hvdtorch as hvd
from tests.harness import run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch"),
    pytest.mark.skipif(not hvd.cuda_built(), reason="this hvdtorch build has no CUDA device"),
]


@pytest.mark.parametrize("nranks", [1, 2, 4])
def test_collectives_on_cuda_tensors(nranks):
    # Every reducer, dtype and op; at 1 rank NCCL, at 2 and 4 the device ring over CUDA IPC.
    run_ranks("tests.workers.gpu:check_collectives", nranks, timeout=150)


@pytest.mark.parametrize("nranks", [1, 2])
def test_distributed_model_on_cuda_equals_one_process(nranks):
    run_ranks("tests.workers.gpu:check_distributed_model", nranks, timeout=100)


@pytest.mark.parametrize("nranks", [2, 3])
def test_sharded_optimizer_on_cuda_equals_one_process(nranks):
    run_ranks("tests.workers.gpu:check_sharded_optimizer", nranks, timeout=100)
