"""Minimal image data for examples and benchmarks (no torchvision needed):
an ImageFolder reader (root/<class>/<image>.jpg), per-rank sharding, and
the batch stream both use."""

import os
from typing import List, Tuple

import torch

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp")


class ImageFolder(torch.utils.data.Dataset):
    """Images under root/<class>/; labels are class directories in sorted order."""

    def __init__(self, root: str, image_size: int):
        classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        if not classes:
            raise ValueError(f"hvdtorch: no class directories under {root!r}")
        self.samples: List[Tuple[str, int]] = []
        for label, c in enumerate(classes):
            for f in sorted(os.listdir(os.path.join(root, c))):
                if f.lower().endswith(IMAGE_EXTENSIONS):
                    self.samples.append((os.path.join(root, c, f), label))
        self.classes = classes
        self.image_size = image_size

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        from PIL import Image

        path, label = self.samples[i]
        with Image.open(path) as img:
            img = img.convert("RGB").resize((self.image_size, self.image_size))
            data = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
        x = data.view(self.image_size, self.image_size, 3).permute(2, 0, 1).float().div_(255)
        return (x - 0.45) / 0.225, label


class Shard(torch.utils.data.Sampler):
    """Every size-th sample starting at rank, reshuffled per epoch with a shared seed."""

    def __init__(self, length: int, rank: int, size: int, seed: int = 0):
        self.length, self.rank, self.size, self.seed, self.epoch = length, rank, size, seed, 0

    def set_epoch(self, epoch: int):
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.length, generator=g).tolist()
        usable = self.length - self.length % self.size  # equal shard sizes: no rank waits for another
        return iter(order[self.rank : usable : self.size])

    def __len__(self):
        return self.length // self.size


def batches(data_dir, image_size: int, batch_size: int, num_classes: int, rank: int, size: int):
    """Yields (images, labels) forever: this rank's shard of an ImageFolder
    (``data_dir``, reshuffled every epoch, no loader workers), or, without
    ``data_dir``, one fixed synthetic batch seeded by the rank."""
    if data_dir:
        ds = ImageFolder(data_dir, image_size)
        sampler = Shard(len(ds), rank, size)
        loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, sampler=sampler, drop_last=True)
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from loader
            epoch += 1
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(batch_size, 3, image_size, image_size, generator=g)
    y = torch.randint(0, num_classes, (batch_size,), generator=g)
    while True:
        yield x, y
