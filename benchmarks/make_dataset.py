"""Writes an ImageFolder dataset of JPEGs for the real-data benchmark:
root/<class>/<n>.jpg, N classes x M images (25 classes by default, like the
ImageNet subset of the Horovod reproduction study). Images are random
textures with a per-class tint, so decoding and resizing cost what real
photos of the same size cost.

    python benchmarks/make_dataset.py /tmp/hvd-images --classes 25 --per-class 40 --size 128
"""

import argparse
import os

import numpy as np
from PIL import Image


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root")
    p.add_argument("--classes", type=int, default=25)
    p.add_argument("--per-class", type=int, default=40)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    for c in range(args.classes):
        d = os.path.join(args.root, f"class_{c:03d}")
        os.makedirs(d, exist_ok=True)
        tint = rng.integers(0, 256, size=3)
        for i in range(args.per_class):
            noise = rng.integers(0, 256, size=(args.size, args.size, 3))
            img = ((noise + tint) // 2).astype(np.uint8)
            Image.fromarray(img).save(os.path.join(d, f"{i:05d}.jpg"), quality=90)
    print(f"wrote {args.classes * args.per_class} images to {args.root}")


if __name__ == "__main__":
    main()
