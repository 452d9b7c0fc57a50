"""shard=3 (parameters sharded at rest): N ranks train exactly like one
process on the global batch in every supported pattern, nothing stays
gathered between uses, full state dicts move between job sizes, and misuse
is named."""

import pytest

from tests.harness import run_ranks


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_training_equals_single_process(nranks):
    run_ranks("tests.workers.zero3:check_training", nranks, args=["all" if nranks == 2 else "quick"], timeout=180)


def test_training_with_the_all_gather_between_hosts():
    run_ranks("tests.workers.zero3:check_training", 2, args=["quick"], timeout=120, env={"HVDTORCH_SHM": "0"})


@pytest.mark.parametrize("nranks", [2, 3])
def test_memory_at_rest(nranks):
    run_ranks("tests.workers.zero3:check_memory_at_rest", nranks, timeout=120)


@pytest.mark.parametrize("nranks", [2, 3])
def test_one_gathered_copy_per_host(nranks):
    run_ranks("tests.workers.zero3:check_one_copy_per_host", nranks, timeout=120)


def test_kept_buckets():
    run_ranks("tests.workers.zero3:check_kept_buckets", 2, timeout=120)


def test_gathered_parameters_and_state_dicts_across_job_sizes(tmp_path):
    env = {"ZERO3_CKPT": str(tmp_path / "full.pt")}
    run_ranks("tests.workers.zero3:check_gathered_parameters_and_state_dicts", 2, timeout=120, env=env)
    run_ranks("tests.workers.zero3:check_load_saved_elsewhere", 3, timeout=120, env=env)


def test_errors():
    run_ranks("tests.workers.zero3:check_errors", 2, timeout=120)


def test_process_set():
    run_ranks("tests.workers.zero3:check_process_set", 3, timeout=120)


@pytest.mark.parametrize("nranks", [2, 3])
def test_join(nranks):
    run_ranks("tests.workers.zero3:check_join", nranks, timeout=180)


def test_join_across_hosts():
    # The host's copy across hosts: a joined rank also gathers its column and puts it into the copy.
    run_ranks("tests.workers.zero3:check_join", 4, timeout=240, hosts=["a", "a", "b", "b"])


def test_eval_and_inference():
    run_ranks("tests.workers.zero3:check_eval_and_inference", 2, timeout=120)


def test_units_plan():
    from hvdtorch.zero.parameter_units import plan_units
    from tests.workers.zero3 import base_model

    net = base_model()
    params = [p if p.requires_grad else None for p in net.parameters()]
    index = {id(p): i for i, p in enumerate(net.parameters())}

    def unit(plan, p):
        return plan.of_param[index[id(p)]]

    block = plan_units(net, params, 600)  # the block's subtree is 528 bytes, the whole model 1560
    assert unit(block, net.block.lin.weight) == unit(block, net.block.scale) != 0
    assert block.of_module[id(net.block.lin)] == block.of_module[id(net.block)]  # hooked, gathers the block
    assert unit(block, net.mid.weight) == 0  # tied: held by mid's unit and out's
    assert len({unit(block, net.inp.weight), unit(block, net.head.weight), unit(block, net.block.scale)}) == 3
    assert index[id(net.frozen)] not in block.of_param  # frozen: not sharded
    each = plan_units(net, params, 0)  # no subtree fits: every module is a unit of its own parameters
    assert unit(each, net.block.lin.weight) != unit(each, net.block.scale)
    whole = plan_units(net, params, 25 << 20)
    assert set(whole.of_param.values()) == {0}


def test_elastic_state_commits_restores_and_resumes_at_another_size(tmp_path):
    run_ranks("tests.workers.zero3:check_elastic", 2, args=[str(tmp_path), "commit"], timeout=120)
    run_ranks("tests.workers.zero3:check_elastic", 3, args=[str(tmp_path), "resume"], timeout=120)


@pytest.mark.parametrize("mode", ["compile", "amp"])
def test_compiled_and_amp(mode):
    run_ranks("tests.workers.zero3:check_compiled_and_amp", 2, args=[mode], timeout=240)


def test_training_across_hosts():
    # Two emulated hosts of two ranks: each unit's gather crosses the link once per host.
    run_ranks("tests.workers.zero3:check_training", 4, args=["quick"], timeout=180, hosts=["a", "a", "b", "b"])


def test_secondary_copy_across_hosts():
    # Two emulated hosts of two ranks: after its first gather in a step, a bucket is gathered within the host.
    run_ranks("tests.workers.zero3:check_secondary_copy", 4, timeout=240, hosts=["a", "a", "b", "b"])


@pytest.mark.parametrize("nranks", [2, 3])
def test_built_on_the_meta_device(nranks):
    run_ranks("tests.workers.zero3:check_built_on_meta", nranks, timeout=180)


# ---- edges: sets without rank 0, hosts of different sizes, strict loads, join while evaluating ------------


def test_gathered_parameters_in_a_set_without_rank_0():
    # modifier_rank is the set's rank: in [1, 2], modifier_rank=1 is global rank 2.
    run_ranks("tests.workers.zero3:check_gathered_parameters_in_a_set", 3, process_set=[1, 2], timeout=120)


def test_built_on_the_meta_device_in_a_set_without_rank_0():
    run_ranks("tests.workers.zero3:check_built_on_meta_in_a_set", 3, process_set=[1, 2], timeout=180)


def test_training_on_hosts_of_different_sizes():
    # Two ranks on one host, one on the other: no host copy (on no rank), and training equal to one process.
    run_ranks("tests.workers.zero3:check_training", 3, args=["quick"], timeout=180, hosts=["a", "a", "b"])


def test_strict_loading():
    run_ranks("tests.workers.zero3:check_strict_loading", 2, timeout=120)


def test_module_state_inside_gathered_parameters():
    run_ranks("tests.workers.zero3:check_module_state_inside_gathered_parameters", 2, timeout=120)


def test_sharded_states_in_any_order():
    run_ranks("tests.workers.zero3:check_sharded_states_in_any_order", 3, timeout=120)


@pytest.mark.parametrize("nranks", [2, 3])
def test_join_while_evaluating(nranks):
    run_ranks("tests.workers.zero3:check_join_while_evaluating", nranks, timeout=180)


def test_gradient_buckets_released_in_backward():
    run_ranks("tests.workers.zero3:check_gradient_buckets_released_in_backward", 2, timeout=120)
