"""The benchmarks' and examples' workloads (benchmarks/workloads/): the
fallback GoogLeNet is torchvision's architecture, and image batches are
sharded across ranks by DistributedSampler."""

import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks.workloads import GoogLeNet, googlenet, googlenet_source, image_batches, load_torchvision
from benchmarks.workloads.data import ImageFolder, image_folder
from tests.harness import ROOT, free_port

# torchvision's published parameter count of GoogLeNet without auxiliary
# classifiers, 1000 classes (GoogLeNet_Weights.IMAGENET1K_V1.meta["num_params"]).
TORCHVISION_GOOGLENET_PARAMS = 6_624_904


# Output shape of every layer for one 224 px image, as torchvision documents
# them in its GoogLeNet's forward().
IMAGENET_LAYER_SHAPES = {
    "conv1": (64, 112, 112),
    "maxpool1": (64, 56, 56),
    "conv2": (64, 56, 56),
    "conv3": (192, 56, 56),
    "maxpool2": (192, 28, 28),
    "inception3a": (256, 28, 28),
    "inception3b": (480, 28, 28),
    "maxpool3": (480, 14, 14),
    "inception4a": (512, 14, 14),
    "inception4b": (512, 14, 14),
    "inception4c": (512, 14, 14),
    "inception4d": (528, 14, 14),
    "inception4e": (832, 14, 14),
    "maxpool4": (832, 7, 7),
    "inception5a": (832, 7, 7),
    "inception5b": (1024, 7, 7),
    "avgpool": (1024, 1, 1),
    "dropout": (1024,),
    "fc": (1000,),
}


def shapes(model):
    return [(k, tuple(v.shape)) for k, v in model.state_dict().items()]


def layer_shapes(model, x):
    """Output shape (without the batch dimension) of each top-level layer."""
    out = {}
    hooks = [
        m.register_forward_hook(lambda _m, _i, y, name=name: out.__setitem__(name, tuple(y.shape[1:])))
        for name, m in model.named_children()
    ]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return out


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def test_googlenet_has_torchvisions_parameter_count_and_output():
    model = GoogLeNet(num_classes=1000)
    assert n_params(model) == TORCHVISION_GOOGLENET_PARAMS
    model.eval()
    assert layer_shapes(model, torch.randn(1, 3, 224, 224)) == IMAGENET_LAYER_SHAPES
    for px in (32, 64):  # the benchmark's sizes
        assert model(torch.randn(2, 3, px, px)).shape == (2, 1000)


def test_googlenet_initialises_like_torchvision():
    torch.manual_seed(0)
    model = GoogLeNet(num_classes=25)
    for name, p in model.named_parameters():
        if name.endswith("conv.weight") or name == "fc.weight":
            assert p.abs().max() <= 0.02 and 0.005 < p.std() < 0.015, name  # N(0, 0.01) cut at 2 sigma
        elif name.endswith("bn.weight"):
            assert torch.all(p == 1), name


def test_googlenet_matches_torchvision():
    tv, why = load_torchvision()
    if tv is None:
        pytest.skip(why)
    for num_classes in (1000, 25):
        ours = GoogLeNet(num_classes=num_classes)
        theirs = tv.models.googlenet(num_classes=num_classes, aux_logits=False, init_weights=True)
        assert shapes(ours) == shapes(theirs)  # weights layer by layer: names, order, shapes (buffers included)
        assert n_params(ours) == n_params(theirs)
        for px in (32, 64, 224):
            x = torch.randn(1, 3, px, px)
            assert layer_shapes(ours.eval(), x) == layer_shapes(theirs.eval(), x), px
        # Same weights, same function: pools, padding and batch-norm eps agree
        # too. In training mode, so that batch statistics keep every layer's
        # activations at unit scale (with the initial weights, eval-mode
        # activations fade towards zero and would hide a difference); the
        # same seed gives both the same dropout mask.
        ours.load_state_dict(theirs.state_dict())
        x = torch.randn(4, 3, 64, 64)
        outputs = []
        for model in (ours.train(), theirs.train()):
            torch.manual_seed(1)
            outputs.append(model(x))
        torch.testing.assert_close(outputs[0], outputs[1])
    assert googlenet_source().startswith("torchvision")
    assert type(googlenet(25)) is type(theirs)


def test_googlenet_factory_falls_back_without_torchvision():
    tv, why = load_torchvision()
    model = googlenet(25, prefer_torchvision=False)
    assert isinstance(model, GoogLeNet)
    if tv is None:
        assert isinstance(googlenet(25), GoogLeNet)
        assert why in googlenet_source()


def write_image_folder(root, classes=3, per_class=7, size=12):
    from PIL import Image

    for c in range(classes):
        d = root / f"class_{c}"
        d.mkdir()
        for i in range(per_class):
            # A pixel encodes the image's index, so a batch tells which images it holds.
            img = Image.new("RGB", (size, size), (10 * c, 10 * i, 0))
            img.save(d / f"{i:03d}.png")
    return classes * per_class


def ids(images):
    # Undo the normalisation of channels 0 and 1: 10*class and 10*index.
    mean = torch.tensor([0.485, 0.456]).view(2, 1, 1)
    std = torch.tensor([0.229, 0.224]).view(2, 1, 1)
    rgb = ((images[:, :2] * std + mean) * 255).round()[:, :, 0, 0]
    return [(int(c) // 10, int(i) // 10) for c, i in rgb.tolist()]


def test_image_batches_shard_disjointly_and_cover_each_epoch(tmp_path):
    total = write_image_folder(tmp_path)  # 21 images, 2 ranks, batch 2: 5 batches per rank, 1 image dropped
    size, batch = 2, 2
    streams = [image_batches(str(tmp_path), 8, batch, 3, rank, size) for rank in range(size)]
    per_rank = (total // size) // batch
    epoch = [[ids(next(s)[0]) for _ in range(per_rank)] for s in streams]
    seen = [set(img for b in rank_batches for img in b) for rank_batches in epoch]
    assert not seen[0] & seen[1]
    assert len(seen[0]) == len(seen[1]) == per_rank * batch
    assert len(seen[0] | seen[1]) >= total - size * batch  # drop_last loses less than one batch per rank
    # The next epoch is a different order of the same images (set_epoch reshuffles).
    again = [[ids(next(s)[0]) for _ in range(per_rank)] for s in streams]
    assert again != epoch


def test_image_batches_labels_follow_class_directories(tmp_path):
    write_image_folder(tmp_path)
    x, y = next(image_batches(str(tmp_path), 8, 4, 3, 0, 1))
    assert x.shape == (4, 3, 8, 8)
    assert [c for c, _ in ids(x)] == y.tolist()


def test_image_batches_refuse_a_folder_smaller_than_a_batch_per_rank(tmp_path):
    write_image_folder(tmp_path, classes=1, per_class=3)
    with pytest.raises(ValueError, match="fewer than one batch"):
        next(image_batches(str(tmp_path), 8, 2, 1, 0, 2))


def test_image_folder_is_torchvisions_where_it_imports(tmp_path):
    write_image_folder(tmp_path)
    tv, _ = load_torchvision()
    dataset = image_folder(str(tmp_path), 8)
    assert isinstance(dataset, tv.datasets.ImageFolder if tv is not None else ImageFolder)
    assert len(dataset) == 21


def test_training_benchmark_runs_under_torchrun_on_an_image_folder(tmp_path):
    # The benchmark's whole path at its smallest: GoogLeNet (torchvision's where it imports) trained by
    # hvdtorch and by DDP on a sharded ImageFolder, 2 ranks, one window each.
    data, out = tmp_path / "images", tmp_path / "results"
    data.mkdir()
    write_image_folder(data)
    env = dict(os.environ, OMP_NUM_THREADS="1", HVDTORCH_TIMEOUT="60", PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}"]
    cmd += ["benchmarks/googlenet.py", "--setting", "small", "--configs", "auto:P+F,ddp"]
    cmd += ["--rounds", "1", "--iters", "1", "--warmup", "1", "--data", str(data), "--out", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert f"GoogLeNet: {googlenet_source()}" in p.stdout
    with open(out / "small.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [r["config"] for r in rows] == ["auto:P+F", "ddp"]
    for r in rows:
        assert r["model"] == googlenet_source() and r["data"] == "jpeg" and r["ranks"] == 2
        assert r["img_per_s"] > 0
