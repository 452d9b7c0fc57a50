"""Several hosts for real: torchrun agents in network namespaces, TCP between hosts, shm inside."""

import json
import re


def test_torchrun_agents_on_two_namespaced_hosts(netns_hosts):
    """Two hosts of two ranks each: local/cross sizes follow the hosts, the
    node reducer's cross-host phase goes over the c10d link (TCP through the
    bridge), the same-host peer over shared memory."""
    hosts = netns_hosts(2)
    outs = hosts.torchrun("examples/topology.py", nproc=2).wait(timeout=150)
    lines = [line for o in outs for line in o.splitlines() if line.startswith("TOPOLOGY")]
    assert len(lines) == 4, outs
    for line in lines:
        f = dict(kv.split("=", 1) for kv in line.split()[1:8])
        rank = int(f["rank"])
        assert f["size"] == "4" and f["local_size"] == "2" and f["cross_size"] == "2", line
        assert f["local_rank"] == str(rank % 2) and f["cross_rank"] == str(rank // 2), line
        assert f["node_allreduce"] == "ok", line
        peer_other_host = (rank + 2) % 4
        assert re.search(rf"\({peer_other_host}, \('c10d',\)\)", line), line
        peer_same_host = rank ^ 1
        assert re.search(rf"\({peer_same_host}, \('shm',", line), line


def test_auto_measures_the_link_and_spares_reducers_that_send_more_over_it(netns_hosts):
    """Two hosts of two ranks on a 100 Mbit/s cable: calibration measures the
    link (the same on every rank, at most the cable's rate); `auto` starts
    every band from 256 KiB up on the node reducer, which sends the fewest
    bytes between hosts, and never tries ring, native (1.5x the bytes) or
    central (2x) on real ops there: with the link in their priors, they are
    not worth a 1 MiB op."""
    hosts = netns_hosts(2)
    hosts.shape("100mbit")
    outs = hosts.torchrun("tests/workers/link_cost.py", nproc=2).wait(timeout=150)
    rows = [json.loads(line.split(" ", 1)[1]) for o in outs for line in o.splitlines() if line.startswith("LINKCOST")]
    assert sorted(r["rank"] for r in rows) == [0, 1, 2, 3], outs
    links = {json.dumps(r["link"], sort_keys=True) for r in rows}
    assert len(links) == 1, f"the ranks measured different links: {links}"
    link = rows[0]["link"]
    rate = 100e6 / 8
    assert link is not None and rate / 4 <= link["bytes_per_s"] <= rate * 1.15, link
    for r in rows:
        for size, choice in r["choice"].items():
            if int(size) >= 256 << 10:
                assert choice == "node", (r["rank"], size, r["choice"])
        samples = r["samples"]
        assert samples["node"] == 8 and samples["ring"] == samples["central"] == samples["native"] == 0, samples
