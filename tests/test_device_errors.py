"""Tensors on a device hvdtorch does not serve are refused by name, before
anything is sent (one process: plain `python` is a job of size 1)."""

import subprocess
import sys
import textwrap


def test_unserved_devices_are_refused_naming_op_tensor_and_parameter():
    code = textwrap.dedent(
        """
        import torch
        import hvdtorch as hvd

        hvd.init()
        try:
            hvd.allreduce(torch.ones(3, device="meta"), name="on.meta")
            raise SystemExit("a meta tensor was accepted")
        except hvd.InvalidArgumentError as e:
            assert "allreduce 'on.meta'" in str(e) and "tensor is on meta" in str(e), str(e)
        # A model on meta wraps (shard=3 makes its shards, zero/meta_init.py) but runs nothing before.
        model = hvd.DistributedModel(torch.nn.Sequential(torch.nn.Linear(2, 2)).to("meta"))
        try:
            model(torch.ones(1, 2))
            raise SystemExit("a model on meta ran")
        except ValueError as e:
            assert "built on the meta device" in str(e) and "shard=3" in str(e), str(e)
        # Nothing was sent: the job still works.
        assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after").tolist() == [1.0, 1.0]
        hvd.shutdown()
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr
