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
    assert search.best().setting == Setting(4 * MiB, 0.2)
    tried = [t.setting for t in search.trials]
    # Phase 1: every fusion size at the starting cycle time; phase 2: the other cycle times at the best size.
    assert tried == [Setting(f, 1.0) for f in (0, MiB, 4 * MiB, 16 * MiB, 64 * MiB)] + [
        Setting(4 * MiB, 0.2),
        Setting(4 * MiB, 5.0),
    ]


def test_search_keeps_the_starting_cycle_time_when_it_is_best():
    search = _run(CoordinateSearch([0, MiB], [0.5, 2.0], 1.0), lambda s: s.fusion_bytes - s.cycle_time_ms)
    assert search.best().setting == Setting(MiB, 0.5)
    search = _run(CoordinateSearch([0, MiB], [0.5, 2.0], 1.0), lambda s: s.fusion_bytes - abs(s.cycle_time_ms - 1))
    assert search.best().setting == Setting(MiB, 1.0)
    assert len(search.trials) == 4


def test_search_ties_resolve_to_the_first_trial():
    search = _run(CoordinateSearch([0, MiB, 2 * MiB], [1.0], 1.0), lambda s: 7.0)
    assert search.best().index == 0 and len(search.trials) == 3
    with pytest.raises(RuntimeError):
        search.report(1.0)


def test_knobs_parse_and_default():
    d = _C.resolve_options({})
    assert d["autotune"] is False and d["autotune_log"] == ""
    assert d["autotune_warmup_steps"] == 1 and d["autotune_steps_per_trial"] == 5
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
    }
    run_ranks("tests.workers.autotune:check_autotuned_training", 2, env=env, timeout=90, args=[kind])


def test_autotune_is_off_by_default(monkeypatch):
    monkeypatch.delenv("HVDTORCH_AUTOTUNE", raising=False)
    run_ranks("tests.workers.autotune:check_off_by_default", 2, timeout=60)
