"""A DDP user's patterns on 2 ranks: each trains as under
DistributedDataParallel, or is refused with a message naming the fix
(tests/workers/from_ddp.py; docs/guide.md, "Coming from DDP")."""

import os
import subprocess
import sys

import pytest

from tests.harness import ROOT, launcher_free_env, run_ranks


@pytest.mark.parametrize(
    "check",
    [
        "equals_ddp_with_batchnorm",
        "buffer_sync_off_and_no_sync",
        "buffer_rules_as_ddp",
        "names_in_messages",
        "models_that_differ_are_named",
        "released_reducers_leave_no_hooks",
        "replaced_grad_is_kept",
        "ddp_arguments",
        "convert_sync_batchnorm",
        "clipping_between_backward_and_step",
        "unused_branch_on_one_rank",
        "torch_clipping_with_shard1",
        "torch_clipping_with_shard2",
        "sharded_checkpoint_the_usual_way",
        "elastic_state_keeps_a_scheduler_in_place",
        "uneven_data_with_join",
        "adasum_state_of_another_rank",
        "powersgd_state_of_another_rank",
        "scheduler_built_before_sharding",
        "sharded_optimizer_before_the_model",
        "one_optimizer_across_sharding",
    ],
)
def test_ddp_pattern(check):
    run_ranks(f"tests.workers.from_ddp:{check}", 2, timeout=120)


def test_device_arguments_name_the_index():
    # device_ids/output_device name a device by type and index, as DDP's do (no GPU needed to compare them).
    import torch

    from hvdtorch.training.coming_from_ddp import _same_device

    assert _same_device(1, torch.device("cuda", 1)) and _same_device("cuda:1", torch.device("cuda", 1))
    assert not _same_device(0, torch.device("cuda", 1)) and not _same_device("cuda:0", torch.device("cuda", 1))
    assert _same_device("cpu", torch.device("cpu")) and not _same_device("cuda:0", torch.device("cpu"))


def test_adasum_commit_of_another_host(tmp_path):
    run_ranks(
        "tests.workers.from_ddp:adasum_commit_of_another_host", 2, timeout=120, args=[str(tmp_path)], hosts=["a", "b"]
    )


def test_mpirun_exports_torch_variables():
    env = launcher_free_env()
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = ["mpirun", "--oversubscribe", "-np", "2", sys.executable, "-m", "tests.workers.from_ddp"]
    out = subprocess.run(cmd + ["torch_env_after_init"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("torch env ok") == 2, out.stdout + out.stderr


# Routes whose update rule is DDP's; adasum's is not (Adasum combines the ranks' updates otherwise).
EQUAL_TO_DDP = ["dm", "opt", "shard1", "shard2", "elastic", "powersgd"]
ROUTES = [*EQUAL_TO_DDP, "adasum", "syncbn"]


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory):
    """tests/workers/ddp_reference.py on 2 ranks, once per route and once with DDP."""
    out = tmp_path_factory.mktemp("ddp_reference")
    for route in ["ddp", "solo", *ROUTES]:
        run_ranks("tests.workers.ddp_reference:train", 2, timeout=180, args=[str(out), route])
    import torch

    return {route: torch.load(out / f"{route}.pt", weights_only=False) for route in ["ddp", "solo", *ROUTES]}


@pytest.mark.parametrize("route", ROUTES)
def test_reference_script_trains_as_under_ddp(reference_runs, route):
    # Every rank's parameters, buffers, EMA and evaluation outputs equal to
    # DDP's same rank (each rank's last training forward updates its own
    # buffers, under DDP too, and DDP's evaluation forward after training
    # takes rank 0's); parameters equal on every rank; the run resumed from
    # rank 0's checkpoint equal to the uninterrupted one.
    import torch

    # SyncBatchNorm's reference is one process over the global batch (torch's refuses CPU tensors under DDP).
    reference = reference_runs["solo" if route == "syncbn" else "ddp"]
    if route in EQUAL_TO_DDP or route == "syncbn":
        # PowerSGD at full rank is exact up to the orthogonalization's rounding.
        rtol, atol = (1e-3, 5e-5) if route == "powersgd" else (1e-5, 1e-6)
        for rank, (got, want) in enumerate(zip(reference_runs[route]["ranks"], reference["ranks"])):
            for part in ("model", "ema"):
                for key, w in want[part].items():
                    torch.testing.assert_close(
                        got[part][key],
                        w,
                        rtol=rtol,
                        atol=atol,
                        msg=lambda m: f"{route}, rank {rank}, {part}.{key} against DDP: {m}",
                    )
            assert [s for s, _ in got["evals"]] == [s for s, _ in want["evals"]], (route, rank)
            for (step, out), (_, w) in zip(got["evals"], want["evals"]):
                torch.testing.assert_close(
                    out, w, rtol=rtol, atol=atol, msg=lambda m: f"{route}, rank {rank}, evaluation after {step}: {m}"
                )
    else:  # it ran its own rule, not DDP's under another name
        got, want = reference_runs[route]["whole"], reference["whole"]
        assert any(not torch.allclose(got["model"][k], w) for k, w in want["model"].items()), f"{route} is DDP's"
    ranks = reference_runs[route]["ranks"]
    for key, p in ranks[0]["model"].items():
        if "running" not in key and "num_batches" not in key:
            assert torch.equal(p, ranks[1]["model"][key]), f"{route}: {key} differs across ranks"
    got = reference_runs[route]["whole"]
    resumed = reference_runs[route]["resumed"]
    # PowerSGD's float32 orthogonalization does not round alike in the
    # uninterrupted and the resumed run on every CPU (up to 1.2e-5 apart on
    # an AVX-512 one): the resumed run is held to its DDP comparison's rounding.
    rtol, atol = (1e-3, 5e-5) if route == "powersgd" else (1e-6, 1e-7)
    for part in ("model", "ema"):
        for key, w in got[part].items():
            torch.testing.assert_close(
                resumed[part][key], w, rtol=rtol, atol=atol, msg=lambda m: f"{route}, resumed {part}.{key}: {m}"
            )
