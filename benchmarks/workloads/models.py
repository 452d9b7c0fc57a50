"""Model factories: torchvision's definition where torchvision imports, this
package's identical fallback where it does not."""

import torch.nn as nn

from .googlenet import GoogLeNet
from .torchvision_compat import load as load_torchvision


def googlenet(num_classes: int, prefer_torchvision: bool = True) -> nn.Module:
    """GoogLeNet without auxiliary classifiers, torchvision's weight
    initialisation; seed torch before calling for equal weights on every rank."""
    tv, _ = load_torchvision()
    if tv is not None and prefer_torchvision:
        return tv.models.googlenet(num_classes=num_classes, aux_logits=False, init_weights=True)
    return GoogLeNet(num_classes=num_classes)


def googlenet_source(prefer_torchvision: bool = True) -> str:
    """Which definition googlenet() builds here, for printing next to results."""
    tv, why = load_torchvision()
    if tv is not None and prefer_torchvision:
        return f"torchvision {tv.__version__}"
    return "benchmarks/workloads/googlenet.py" + (f" ({why})" if why else "")
