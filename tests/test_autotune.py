"""Autotune: the search alone (synthetic scores), the knobs, and 2-rank training runs under HVDTORCH_AUTOTUNE=1."""

import pytest

from hvdtorch import _C
from hvdtorch.autotune import CoordinateSearch, Setting
from tests.harness import run_ranks

MiB = 1 << 20


def _run(search, score):
    while (s := search.next()) is not None:
        search.report(score(s))
    return search


def test_search_finds_the_best_candidate():
    # A peak at 4 MiB, 0.2 ms; fusion matters more than the cycle time.
    def score(s):
        return 100 - abs(s.fusion_bytes - 4 * MiB) / MiB - 3 * abs(s.cycle_time_ms - 0.2)

    search = _run(CoordinateSearch([0, MiB, 4 * MiB, 16 * MiB, 64 * MiB], [0.2, 1.0, 5.0], 1.0), score)
    assert search.best() == Setting(4 * MiB, 0.2)
    tried = [t.setting for t in search.trials]
    # Phase 1: every fusion size at the starting cycle time; phase 2: the other cycle times at the best size.
    assert tried == [Setting(f, 1.0) for f in (0, MiB, 4 * MiB, 16 * MiB, 64 * MiB)] + [
        Setting(4 * MiB, 0.2),
        Setting(4 * MiB, 5.0),
    ]


def test_search_keeps_the_starting_cycle_time_when_it_is_best():
    search = _run(CoordinateSearch([0, MiB], [0.5, 2.0], 1.0), lambda s: s.fusion_bytes - s.cycle_time_ms)
    assert search.best() == Setting(MiB, 0.5)
    search = _run(CoordinateSearch([0, MiB], [0.5, 2.0], 1.0), lambda s: s.fusion_bytes - abs(s.cycle_time_ms - 1))
    assert search.best() == Setting(MiB, 1.0)
    assert len(search.trials) == 4


def test_search_ties_resolve_to_the_first_trial():
    search = _run(CoordinateSearch([0, MiB, 2 * MiB], [1.0], 1.0), lambda s: 7.0)
    assert search.best() == Setting(0, 1.0) and len(search.trials) == 3
    with pytest.raises(RuntimeError):
        search.report(1.0)


def test_rounds_alternate_and_take_the_median():
    # One wild measurement (a straggling trial) must not decide: 1 MiB is
    # better in two of its three trials, so its median wins.
    wild = {2: 1000.0}  # trial index -> score

    def score_of(search):
        def score(s):
            i = len(search.trials)
            return wild.get(i, {0: 10.0, MiB: 20.0}[s.fusion_bytes])

        return score

    search = CoordinateSearch([0, MiB], [1.0], 1.0, rounds=3)
    _run(search, score_of(search))
    assert [t.setting.fusion_bytes for t in search.trials] == [0, MiB, MiB, 0, 0, MiB]
    assert search.trials[2].score == 1000.0  # the wild one hit 1 MiB...
    wild = {3: 1000.0}  # ...now it hits 0, once: still not enough
    search = CoordinateSearch([0, MiB], [1.0], 1.0, rounds=3)
    _run(search, score_of(search))
    assert search.scores() == {Setting(0, 1.0): 10.0, Setting(MiB, 1.0): 20.0}
    assert search.best() == Setting(MiB, 1.0)
    # Phase 2 alternates too.
    search = _run(CoordinateSearch([0], [0.5, 1.0, 2.0], 1.0, rounds=2), lambda s: 1.0)
    assert [t.setting.cycle_time_ms for t in search.trials] == [1.0, 1.0, 0.5, 2.0, 2.0, 0.5]


def test_knobs_parse_and_default():
    d = _C.resolve_options({})
    assert d["autotune"] is False and d["autotune_log"] == ""
    assert d["autotune_warmup_steps"] == 1 and d["autotune_steps_per_trial"] == 5 and d["autotune_rounds"] == 2
    d = _C.resolve_options({"autotune": "1", "autotune_log": "/tmp/x.csv", "autotune_steps_per_trial": "3"})
    assert d["autotune"] is True and d["autotune_log"] == "/tmp/x.csv" and d["autotune_steps_per_trial"] == 3
    with pytest.raises(ValueError, match="HVDTORCH_AUTOTUNE_STEPS_PER_TRIAL"):
        _C.resolve_options({"autotune_steps_per_trial": "0"})
    with pytest.raises(ValueError, match="HVDTORCH_AUTOTUNE"):
        _C.resolve_options({"autotune": "maybe"})


@pytest.mark.parametrize("kind", ["model", "optimizer"])
def test_autotuned_training_agrees_and_stays_exact(kind, tmp_path, monkeypatch):
    monkeypatch.delenv("HVDTORCH_CYCLE_TIME", raising=False)
    env = {
        "HVDTORCH_AUTOTUNE": "1",
        "HVDTORCH_AUTOTUNE_LOG": str(tmp_path / "autotune.csv"),
        "HVDTORCH_AUTOTUNE_WARMUP_STEPS": "1",
        "HVDTORCH_AUTOTUNE_STEPS_PER_TRIAL": "2",
        "HVDTORCH_AUTOTUNE_ROUNDS": "2",
    }
    run_ranks("tests.workers.autotune:check_autotuned_training", 2, env=env, timeout=90, args=[kind])


def test_autotune_is_off_by_default(monkeypatch):
    monkeypatch.delenv("HVDTORCH_AUTOTUNE", raising=False)
    run_ranks("tests.workers.autotune:check_off_by_default", 2, timeout=60)


def test_a_rank_joining_during_tuning_ends_it_everywhere(monkeypatch):
    monkeypatch.delenv("HVDTORCH_CYCLE_TIME", raising=False)
    env = {
        "HVDTORCH_AUTOTUNE": "1",
        "HVDTORCH_AUTOTUNE_WARMUP_STEPS": "1",
        "HVDTORCH_AUTOTUNE_STEPS_PER_TRIAL": "2",
        "HVDTORCH_AUTOTUNE_ROUNDS": "1",
    }
    run_ranks("tests.workers.autotune:check_join_during_tuning", 2, env=env, timeout=60)
