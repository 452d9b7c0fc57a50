"""The collectives, DistributedModel, the sharded optimizer, PowerSGD, the
optimizer stepped bucket by bucket, the Adasum optimizer, compiled models and
the Lightning strategy on CUDA tensors, at 1 to 4 processes sharing cuda:0. Needs a GPU and a CUDA
build of hvdtorch: make gpu-check runs these on the GPU machine; elsewhere
they are skipped, saying why. Everything device-generic they exercise also
runs on every CI machine through the simulated device
(test_sim_device_mode.py, test_engine_sim)."""

import pytest
import torch

import hvdtorch as hvd
from tests.harness import run_ranks
from tests.workers.device_ring_faults import run_with_the_last_rank_killed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch"),
    pytest.mark.skipif(not hvd.cuda_built(), reason="this hvdtorch build has no CUDA device"),
]


@pytest.mark.parametrize("nranks", [1, 2, 4])
def test_collectives_on_cuda_tensors(nranks):
    # Every reducer, dtype and op; at 1 rank NCCL, at 2 and 4 the device ring over CUDA IPC.
    run_ranks("tests.workers.gpu:check_collectives", nranks, timeout=150)


@pytest.mark.parametrize("nranks", [2, 4])
def test_device_ring_with_small_slots(nranks):
    # 4 KiB slots: every all-reduce is many segments, each slot and its
    # stream flags reused many times, the segment numbers going on across
    # all-reduces.
    env = {"HVDTORCH_DEVICE_RING_SLOT_BYTES": "4096"}
    run_ranks("tests.workers.gpu:check_collectives", nranks, timeout=200, env=env)


def test_a_rank_dying_in_the_device_ring_releases_its_peers():
    run_with_the_last_rank_killed("cuda", {"HVDTORCH_DEVICE_RING_SLOT_BYTES": "65536"})


@pytest.mark.parametrize("nranks", [1, 2])
def test_distributed_model_on_cuda_equals_one_process(nranks):
    run_ranks("tests.workers.gpu:check_distributed_model", nranks, timeout=100)


@pytest.mark.parametrize("nranks", [2, 3])
def test_sharded_optimizer_on_cuda_equals_one_process(nranks):
    run_ranks("tests.workers.gpu:check_sharded_optimizer", nranks, timeout=100)


@pytest.mark.parametrize("nranks", [1, 2])
def test_powersgd_on_cuda_matches_the_reference(tmp_path, nranks):
    # PowerSGD's factors, orthogonalisation and error feedback on device tensors, against the
    # one-process float64 reference on the CPU (the configurations tests/workers/powersgd.py runs at that size).
    from tests.test_powersgd import reference
    from tests.workers.powersgd import CONFIGS, OPTIONS, STEPS, configs_for

    run_ranks("tests.workers.powersgd:train", nranks, timeout=120, args=[str(tmp_path), "cuda"])
    for name in configs_for(nranks):
        got = torch.load(tmp_path / f"{name}.pt")
        options = {**OPTIONS, **CONFIGS[name][1]}
        op_sum = options.pop("sum", False)
        want = reference(nranks, options, op_sum=op_sum)
        # float64 on the GPU sums in another order than on the CPU; float16 factors are close, not equal.
        rtol, atol = (1e-2, 1e-4) if options.get("fp16") else (1e-7, 1e-10)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
        if nranks > 1 and name == "model":
            plain = reference(nranks, {**options, "start_iter": STEPS})
            assert any((g - w).abs().max() > 1e-6 for g, w in zip(got, plain)), "no compression showed"


@pytest.mark.parametrize("check", ["check_stepping_in_pieces", "check_pieces_with_fp16_and_accumulation"])
def test_stepping_in_pieces_on_cuda_equals_one_process(check):
    # The optimizer stepped bucket by bucket (torch's CUDA Adam and SGD over subsets of each group).
    run_ranks(f"tests.workers.bucketed_step:{check}", 2, timeout=150, args=["cuda"])


@pytest.mark.parametrize("nranks", [1, 2])
def test_adasum_optimizer_on_cuda_equals_the_reference(nranks):
    run_ranks("tests.workers.adasum_optimizer:check_equivalence_on", nranks, timeout=150, args=["cuda"])


def _inductor_or_skip():
    from torch.utils._triton import has_triton

    if not has_triton():
        pytest.skip("torch.compile's GPU backend needs Triton, which this machine's torch lacks")


@pytest.mark.parametrize("check", ["every_route_compiled", "compiled_autograd"])
def test_compiled_models_on_cuda_equal_eager(check):
    # torch.compile (inductor on the GPU) of DistributedModel, DistributedOptimizer and shard=1/2, and
    # DistributedModel under compiled autograd, at 2 ranks sharing the GPU: the parameters of the same
    # route run eagerly (tests/workers/compiled.py).
    _inductor_or_skip()
    run_ranks(f"tests.workers.compiled:{check}", 2, timeout=300, args=["cuda"])


@pytest.mark.parametrize("mode", ["automatic", "manual"])
def test_lightning_on_the_gpu_equals_one_process(mode):
    # strategy="hvdtorch" with accelerator="gpu": each process takes the GPU of its local rank
    # (round-robin over those visible: both on cuda:0 here) and trains there; equal to one process
    # on the CPU on the global batch.
    pytest.importorskip("lightning", reason="Lightning is not installed (make gpu-wheels carries it)")
    run_ranks("tests.workers.lightning:check_fit_equals_single_process", 2, timeout=200, args=[mode, "gpu"])
