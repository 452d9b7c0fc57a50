"""Several hosts for real: torchrun agents in network namespaces, TCP between hosts, shm inside."""

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
