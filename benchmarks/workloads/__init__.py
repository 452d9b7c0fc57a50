"""Models and data the benchmarks and examples train on; not part of the
hvdtorch library.

``googlenet()`` and ``image_batches()`` use torchvision's GoogLeNet and
ImageFolder where torchvision imports, and this package's equivalents
(googlenet.py, data.py) where it does not; ``FCHeavyNet`` is this package's
own communication-heavy network.
"""

from .data import image_batches
from .fc_heavy import FCHeavyNet
from .googlenet import GoogLeNet
from .models import googlenet, googlenet_source
from .torchvision_compat import load as load_torchvision

__all__ = ["FCHeavyNet", "GoogLeNet", "googlenet", "googlenet_source", "image_batches", "load_torchvision"]
