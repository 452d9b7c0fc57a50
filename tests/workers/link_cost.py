"""Rank side of tests/test_hosts.py's link test, run by torchrun on namespaced hosts: prints one line
LINKCOST <json> per rank with the measured link, the `auto` choice per size band after a few 1 MiB auto
all-reduces, and how many samples each reducer has in that band."""

import json
import os

import torch

import hvdtorch as hvd

OPS = 8  # auto all-reduces of 1 MiB: exploration would have run each near candidate 2 of them by now

hvd.init()
x = torch.ones(1 << 18)  # 1 MiB of float32
for i in range(OPS):
    hvd.allreduce_(x, op=hvd.Sum, name=f"linkcost.{i}")
assert float(x[0]) == hvd.size() ** OPS, float(x[0])
engine = hvd.runtime.state().engine
choices = engine.reducer_choices()
band = next(row for row in choices if row["bytes"] == 1 << 20)
out = {
    "rank": hvd.rank(),
    "link": engine.link_cost(),
    "choice": {row["bytes"]: row["choice"] for row in choices},
    "samples": band["samples"],
}
os.write(1, ("LINKCOST " + json.dumps(out) + "\n").encode())  # one atomic write per rank
hvd.shutdown()
