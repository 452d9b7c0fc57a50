"""Training scripts written as Horovod users write them (examples/horovod/,
`import hvdtorch as hvd` and nothing else of ours) run on 2 ranks under
torchrun: the synthetic-data benchmark with a torchvision model (plain,
--fp16-allreduce, --use-adasum), MNIST on small synthetic data written here
in torchvision's raw idx format, and elastic MNIST with a worker killed once
under --max-restarts. They need torchvision, which the CPU venv lacks."""

import os
import re
import signal
import struct
import subprocess
import sys
import time

import pytest

tv = pytest.importorskip("torchvision", reason="needs torchvision (runs in make test-cuda-build)")

import torch  # noqa: E402

from tests.harness import ROOT, elastic_worker_pid, free_port  # noqa: E402

EXAMPLES = os.path.join(ROOT, "examples", "horovod")
DEADLINE = 420  # seconds per job; every job is killed whole past it


def _env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))}
    # A fresh rendezvous store per restart (see tests/test_elastic.py), a short
    # collective timeout, one thread per rank, and FileLock's ~/.horovod_lock in tmp.
    env.update(
        {
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "HVDTORCH_TIMEOUT": "20",
            "OMP_NUM_THREADS": "1",
            "HOME": str(tmp_path),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _torchrun(tmp_path, script, *args, restarts=0, env=None):
    log_path = tmp_path / f"{script}.{time.monotonic_ns()}.log"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--max-restarts={restarts}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "--monitor-interval=0.2",
        os.path.join(EXAMPLES, script),
        *args,
    ]
    log = open(log_path, "w")
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env={**_env(tmp_path), **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    return proc, log_path


def _wait(proc, log_path, timeout=DEADLINE):
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(
            f"job did not finish within {timeout} s (killed)\n{log_path.read_text()[-6000:]}"
        ) from None
    text = log_path.read_text()
    assert proc.returncode == 0, text[-6000:]
    return text


def _write_idx(path, array, magic):
    with open(path, "wb") as f:
        f.write(struct.pack(">II", magic, array.shape[0]))
        if array.dim() == 3:
            f.write(struct.pack(">II", array.shape[1], array.shape[2]))
        f.write(array.to(torch.uint8).numpy().tobytes())


def _write_mnist(root, train, test):
    """root/MNIST/raw in torchvision's idx format: each digit class is a bright
    6x6 square at its own place on a noisy background (learnable in a few steps)."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    for prefix, n in (("train", train), ("t10k", test)):
        labels = torch.randint(0, 10, (n,), generator=g)
        images = torch.randint(0, 60, (n, 28, 28), generator=g)
        for i, c in enumerate(labels.tolist()):
            r, col = 3 + (c // 5) * 13, 1 + (c % 5) * 5
            images[i, r : r + 6, col : col + 6] = 255
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", images, 2051)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels, 2049)


def _accuracy(text):
    found = re.findall(r"Test set: Average loss: [0-9.]+, Accuracy: ([0-9.]+)%", text)
    assert found, text[-4000:]
    return float(found[-1])


@pytest.mark.parametrize("variant", [[], ["--fp16-allreduce"], ["--use-adasum"]], ids=["plain", "fp16", "adasum"])
def test_synthetic_benchmark(tmp_path, variant):
    proc, log = _torchrun(
        tmp_path,
        "pytorch_synthetic_benchmark.py",
        "--model=resnet18",
        "--batch-size=4",
        "--image-size=32",
        "--num-classes=10",
        "--num-warmup-batches=1",
        "--num-batches-per-iter=2",
        "--num-iters=2",
        "--no-cuda",
        *variant,
    )
    text = _wait(proc, log)
    assert re.search(r"Total img/sec on 2 CPU\(s\): [0-9.]+ \+-", text), text[-4000:]
    assert "Max weight difference across ranks: 0\n" in text, text[-4000:]


def test_mnist(tmp_path):
    _write_mnist(tmp_path / "data", train=768, test=256)
    proc, log = _torchrun(
        tmp_path, "pytorch_mnist.py", "--data-dir", str(tmp_path / "data"), "--epochs=3", "--batch-size=16",
        "--test-batch-size=64", "--lr=0.02", "--no-cuda",
    )  # fmt: skip
    text = _wait(proc, log)
    assert "Train Epoch: 3 [" in text, text[-4000:]
    assert _accuracy(text) > 80.0, text[-4000:]


def test_mnist_elastic_survives_a_killed_worker(tmp_path):
    data = tmp_path / "elastic-data"
    _write_mnist(data, train=1024, test=256)
    proc, log = _torchrun(
        tmp_path, "pytorch_mnist_elastic.py", "--data-dir", str(data), "--epochs=2", "--batch-size=16",
        "--test-batch-size=64", "--lr=0.02", "--log-interval=4", "--no-cuda",
        restarts=2, env={"HVDTORCH_ELASTIC_DIR": str(tmp_path / "commits")},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + DEADLINE
        while "Train Epoch: 1 [128/" not in log.read_text():  # batch 8 of epoch 1
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-6000:]
            time.sleep(0.05)
        pid = elastic_worker_pid(str(data), rank=1)
        assert pid, "the worker of rank 1 was not found"
        os.kill(pid, signal.SIGKILL)
        text = _wait(proc, log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    starts = re.findall(r"Starting at epoch (\d+) batch (\d+) on 2 ranks", text)
    assert len(starts) == 2 and starts[0] == ("1", "0"), (starts, text[-4000:])
    assert starts[1] != ("1", "0"), f"the restarted job did not resume from a commit: {starts}"
    assert "Train Epoch: 2 [" in text, text[-4000:]
    assert _accuracy(text) > 80.0, text[-4000:]
