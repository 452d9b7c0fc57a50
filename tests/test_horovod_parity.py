"""Horovod's behaviours a script relies on beyond the values of the
collectives: argument errors catchable as RuntimeError, optimizer state
broadcast with frozen parameters, DistributedOptimizer._parameter_names,
Horovod's warning text, and the horovod.torch submodules as aliases."""

import importlib

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [1, 2])
def test_argument_errors_are_runtime_errors_too(nranks):
    run_ranks("tests.workers.horovod_parity:check_argument_errors", nranks, timeout=120)


@pytest.mark.parametrize("nranks", [1, 3])
def test_optimizer_state_broadcast_with_frozen_parameters(nranks):
    run_ranks("tests.workers.horovod_parity:check_frozen_state_broadcast", nranks, timeout=120)


@pytest.mark.parametrize("nranks", [1, 2])
def test_parameter_names(nranks):
    run_ranks("tests.workers.horovod_parity:check_parameter_names", nranks, timeout=120)


def test_step_after_synchronize_warns_in_horovods_words():
    run_ranks("tests.workers.horovod_parity:check_step_warning", 2, timeout=120)


# horovod.torch's submodules and the names scripts import from them.
SUBMODULE_NAMES = {
    "mpi_ops": [
        "allreduce", "allreduce_async", "allreduce_", "allreduce_async_", "grouped_allreduce",
        "grouped_allreduce_async", "grouped_allreduce_", "grouped_allreduce_async_", "sparse_allreduce_async",
        "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async", "broadcast",
        "broadcast_async", "broadcast_", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
        "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async", "join", "barrier", "poll",
        "synchronize", "init", "shutdown", "is_initialized", "start_timeline", "stop_timeline", "size",
        "local_size", "cross_size", "rank", "local_rank", "cross_rank", "mpi_threads_supported", "mpi_enabled",
        "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
        "rocm_built", "ProcessSet", "global_process_set", "add_process_set", "remove_process_set", "Average",
        "Sum", "Adasum", "Min", "Max", "Product", "HorovodInternalError", "Compression",
    ],
    "functions": ["allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters"],
    "compression": ["Compression", "Compressor", "NoneCompressor", "FP16Compressor"],
    "optimizer": ["DistributedOptimizer"],
    "sync_batch_norm": ["SyncBatchNorm"],
    "elastic": ["run", "TorchState", "ElasticSampler", "ObjectState", "State"],
    "elastic.state": ["TorchState", "ObjectState", "State"],
    "elastic.sampler": ["ElasticSampler"],
}  # fmt: skip


@pytest.mark.parametrize("submodule", sorted(SUBMODULE_NAMES))
def test_horovod_submodules_are_aliases(submodule):
    import hvdtorch

    module = importlib.import_module(f"hvdtorch.{submodule}")
    for name in SUBMODULE_NAMES[submodule]:
        assert hasattr(module, name), f"hvdtorch.{submodule} has no {name}"
        if hasattr(hvdtorch, name) and submodule != "compression":
            assert getattr(module, name) is getattr(hvdtorch, name), f"hvdtorch.{submodule}.{name}"
    from hvdtorch.mpi_ops import synchronize  # the form scripts use

    assert synchronize is hvdtorch.synchronize
