"""Models used by the examples and benchmarks (defined here: nothing is downloaded)."""
from .googlenet import GoogLeNet
from .fc_heavy import FCHeavyNet

__all__ = ["GoogLeNet", "FCHeavyNet"]
