"""Models used by the examples and benchmarks (defined here: nothing is downloaded)."""

from .fc_heavy import FCHeavyNet
from .googlenet import GoogLeNet

__all__ = ["GoogLeNet", "FCHeavyNet"]
