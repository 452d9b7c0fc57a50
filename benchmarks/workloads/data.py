"""Image data for the examples and benchmarks: an ImageFolder tree
(root/<class>/<image>.jpg) read through torchvision's ImageFolder and
transforms where torchvision imports, through the small reader below where
it does not (same resize and normalisation), sharded across ranks by
torch's DistributedSampler; or one synthetic batch."""

import os
from typing import List, Tuple

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from .torchvision_compat import load as load_torchvision

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp")
# ImageNet's channel statistics, the normalisation torchvision's models expect.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class ImageFolder(Dataset):
    """Images under root/<class>/, resized to image_size x image_size and
    normalised; labels are the class directories in sorted order. The
    fallback for torchvision.datasets.ImageFolder with Resize, ToTensor and
    Normalize."""

    def __init__(self, root: str, image_size: int):
        classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        if not classes:
            raise ValueError(f"no class directories under {root!r}")
        self.samples: List[Tuple[str, int]] = []
        for label, c in enumerate(classes):
            for f in sorted(os.listdir(os.path.join(root, c))):
                if f.lower().endswith(IMAGE_EXTENSIONS):
                    self.samples.append((os.path.join(root, c, f), label))
        self.classes = classes
        self.image_size = image_size
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        from PIL import Image

        path, label = self.samples[i]
        with Image.open(path) as img:
            img = img.convert("RGB").resize((self.image_size, self.image_size), Image.BILINEAR)
            data = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
        x = data.view(self.image_size, self.image_size, 3).permute(2, 0, 1).float().div_(255)
        return (x - self.mean) / self.std, label


def image_folder(root: str, image_size: int) -> Dataset:
    """torchvision's ImageFolder with the transforms above where torchvision
    imports, else this module's reader."""
    tv, _ = load_torchvision()
    if tv is None:
        return ImageFolder(root, image_size)
    t = tv.transforms
    transform = t.Compose([t.Resize((image_size, image_size)), t.ToTensor(), t.Normalize(MEAN, STD)])
    return tv.datasets.ImageFolder(root, transform=transform)


def image_batches(data_dir, image_size: int, batch_size: int, num_classes: int, rank: int, size: int, seed: int = 0):
    """Yields (images, labels) forever.

    With ``data_dir``: this rank's shard of the ImageFolder, through
    DistributedSampler(num_replicas=size, rank=rank): reshuffled every epoch
    with the same seed on every rank, equal shards (drop_last), no loader
    workers (the benchmark measures the training process alone). Without:
    one fixed synthetic batch, seeded by the rank.
    """
    if data_dir:
        ds = image_folder(data_dir, image_size)
        if len(ds) < size * batch_size:
            raise ValueError(f"{data_dir!r} holds {len(ds)} images: fewer than one batch of {batch_size} per rank")
        sampler = DistributedSampler(ds, num_replicas=size, rank=rank, shuffle=True, seed=seed, drop_last=True)
        loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, drop_last=True)
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
