"""Loading a wrapped optimizer's state without replacing its group dicts.

hvd.DistributedOptimizer's wrappers hold the wrapped optimizer's own
param_group dicts (torch's Optimizer.__init__ keeps the dicts it is given),
so a learning-rate scheduler built on the wrapped optimizer, before or after
the wrap, drives the wrapper. torch's load_state_dict() puts new dicts in
place; this keeps the shared ones, with the loaded values in them.
"""

from typing import Callable


def load_keeping_groups(optimizer, load: Callable, state_dict, *args, **kwargs):
    """``load(state_dict, *args, **kwargs)``: torch's load_state_dict of ``optimizer``'s class."""
    shared = list(optimizer.param_groups)
    result = load(state_dict, *args, **kwargs)
    for mine, loaded in zip(shared, optimizer.param_groups):
        mine.update(loaded)
    optimizer.param_groups = shared
    return result
