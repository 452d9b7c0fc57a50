"""A horovod.torch training script (process sets, alltoall, reducescatter,
join with uneven data, DistributedOptimizer) runs unchanged on hvdtorch, and
what it prints is right."""

import ast
import os
import re

import pytest

from tests.harness import ROOT, run_ranks

SCRIPT = os.path.join(ROOT, "examples", "horovod", "train_horovod.py")


@pytest.mark.parametrize("nranks", [3])
def test_horovod_training_script_runs_unchanged(nranks):
    with open(SCRIPT) as f:
        assert re.search(r"^import horovod\.torch as hvd$", f.read(), re.M)  # really the Horovod import
    results = run_ranks("tests.workers.horovod_script:run", nranks, args=[SCRIPT], timeout=150)
    out = {r.rank: r.output for r in results}
    epochs = re.findall(r"epoch (\d) loss ([0-9.]+) last_joined (\d)", out[0])
    assert [e[0] for e in epochs] == ["0", "1", "2"], out[0]
    assert all(int(last) == nranks - 1 for _, _, last in epochs), epochs
    for r in range(nranks):
        spread = float(re.search(r"weights_spread (\S+)", out[r]).group(1))
        assert spread == 0.0, (r, spread)
        m = re.search(r"alltoall_received (\[[^]]*\]) first_rows (\[[^]]*\])", out[r])
        assert ast.literal_eval(m.group(1)) == [k + 1 for k in range(nranks)], m.group(0)
        # From rank k: its rows r*(k+1) .. (r+1)*(k+1)-1, plus 100 k.
        want = [float(100 * k + i) for k in range(nranks) for i in range(r * (k + 1), (r + 1) * (k + 1))]
        assert ast.literal_eval(m.group(2)) == want, (m.group(0), want)
        m = re.search(r"reducescatter (\d+)x3 value (\S+)", out[r])
        assert int(m.group(1)) == 2 and float(m.group(2)) == sum(range(1, nranks + 1)), m.group(0)
    assert "evens_rank 0 evens_sum 2" in out[0] and "evens_rank 1 evens_sum 2" in out[2], out
    assert "evens_sum" not in out[1]
