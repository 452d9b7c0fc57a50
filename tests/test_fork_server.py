"""tests/fork_server.py: a rank forked from the warm server is the process a
fresh `python -m tests.rank_main` would be (its own session, the rank's
environment and argv, stdin /dev/null, stdout and stderr captured, exit code
and signal reported, atexit handlers run at its end), and a rank whose
environment differs in what may be read at import starts fresh."""

import json
import os
import signal

import pytest

from tests.harness import ROOT, RanksFailed, run_ranks

W = "tests.workers.fork_server"


def _facts(folder, n):
    return [json.load(open(folder / f"rank-{r}.json")) for r in range(n)]


@pytest.fixture
def forking(monkeypatch):
    monkeypatch.delenv("HVDTORCH_TEST_FRESH_RANKS", raising=False)


def test_a_forked_rank_is_the_process_a_fresh_one_would_be(tmp_path, forking):
    results = run_ranks(f"{W}:describe", 2, args=[str(tmp_path)], env={"HVDTORCH_TEST_MARK": "m"}, timeout=120)
    facts = _facts(tmp_path, 2)
    for r, (f, res) in enumerate(zip(facts, results)):
        assert f["ppid"] != os.getpid(), "not forked from the server"  # the server's child, not pytest's
        assert f["sid"] == f["pid"], f  # its own session: killpg(pid) reaches what it starts
        assert f["argv"] == [f"{W}:describe", str(tmp_path)] and f["cwd"] == ROOT and f["mark"] == "m", f
        assert f["stdin_is_null"], f
        assert f"rank {r} on stdout" in res.output and f"rank {r} on stderr" in res.output, res.output
        assert res.returncode == 0
        assert (tmp_path / f"rank-{r}.exited").exists(), "the rank's atexit handlers did not run"
    assert facts[0]["ppid"] == facts[1]["ppid"]


def test_another_environment_starts_fresh(tmp_path, forking):
    run_ranks(f"{W}:describe", 2, args=[str(tmp_path)], env={"TEST_FORK_SERVER_OTHER": "1"}, timeout=120)
    assert all(f["ppid"] == os.getpid() for f in _facts(tmp_path, 2))


def test_exit_codes_and_signals_are_reported(forking):
    with pytest.raises(RanksFailed, match=r"failed on ranks \[1\]"):
        run_ranks(f"{W}:fail_on_rank_1", 2, timeout=120)
    results = run_ranks(f"{W}:fail_on_rank_1", 2, timeout=120, expect_success=False)
    assert [r.returncode for r in results] == [0, 1] and "rank 1 fails on purpose" in results[1].output
    results = run_ranks(
        f"{W}:wait_to_be_killed", 1, timeout=120, expect_success=False, kill_rank=0, kill_after="waiting"
    )
    assert results[0].returncode == -signal.SIGKILL, results[0]
