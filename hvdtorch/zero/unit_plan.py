"""shard=3's units, planned from the module tree: which parameters are
gathered together, and which unit each hooked module's forward needs.

Contract (plan_units):
  * Walking down from the root, the first module whose subtree's parameters
    fit one bucket (the optimizer's fusion_bytes) is a unit with its whole
    subtree (a block of a deep network, a Linear of a wide MLP: one gather
    for the block, not one per layer); a module above that with parameters
    of its own is a unit of those alone. A parameter that modules of
    different units hold (tied weights), and the root's own, belong to the
    root's unit, gathered for the whole forward.
  * The shard layout's buckets never span units (zero/layout.py's plan, the
    unit in each bucket's key), so a unit is a set of buckets, and a bucket
    is gathered and freed as a whole (zero/parameter_units.py).
  * Every module of a unit with parameters of its own is hooked too, and
    the unit is gathered while any of their forwards runs (counted), so a
    module called on its own (outside its unit's forward) finds its
    parameters.
  * A parameter the optimizer steps that is not a parameter of the module
    raises: nothing would gather it.
  * Local and without state: the plan is read from the module tree and the
    parameters' sizes alone, so ranks holding the same model plan the same
    units.
"""

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch


@dataclass
class UnitPlan:
    """Which unit each parameter belongs to, and which unit each hooked
    module's forward needs gathered (unit 0: the root module's)."""

    of_param: Dict[int, int]  # parameter index -> unit
    of_module: Dict[int, int]  # id(module) -> unit, for every module in ``hooked``
    hooked: List[torch.nn.Module]


def plan_units(module: torch.nn.Module, params: Sequence[Optional[torch.Tensor]], cap_bytes: int) -> UnitPlan:
    """The units of ``module`` (see the top): walking down from the root, the
    first module whose subtree's parameters take at most ``cap_bytes`` is a
    unit with its whole subtree; a module above that with parameters of its
    own is a unit of those alone; the root's own parameters, and any held by
    modules of different units (tied weights), are the root's unit.
    ``params[i]`` None is not sharded. A parameter that is not the module's
    raises: nothing would gather it."""
    index = {id(p): i for i, p in enumerate(params) if p is not None}

    def own(m):
        return [index[id(p)] for p in m.parameters(recurse=False) if id(p) in index]

    def subtree_bytes(m):
        mine = {index[id(p)] for p in m.parameters() if id(p) in index}
        return sum(params[i].numel() * params[i].element_size() for i in mine)

    of_module: Dict[int, int] = {id(module): 0}
    hooked = [module]
    seen = {id(module)}
    count = 1

    def visit(m, unit):
        nonlocal count
        for child in m.children():
            if id(child) in seen:
                continue
            seen.add(id(child))
            u = unit
            if u is None and 0 < subtree_bytes(child) <= cap_bytes:
                u = count  # the child's whole subtree
                count += 1
                of_module[id(child)], _ = u, hooked.append(child)
            elif own(child):
                if u is None:
                    of_module[id(child)] = count  # its own parameters only
                    count += 1
                else:
                    of_module[id(child)] = u  # inside a unit: called alone, its forward gathers the unit
                hooked.append(child)
            visit(child, u)

    visit(module, 0 if 0 < subtree_bytes(module) <= cap_bytes else None)
    holders: Dict[int, set] = {}
    for m in hooked:
        for i in own(m):
            holders.setdefault(i, set()).add(of_module[id(m)])
    of_param = {}
    for i, p in enumerate(params):
        if p is None:
            continue
        units = holders.get(i)
        if units is None:
            raise ValueError(
                f"hvdtorch: shard=3: the optimizer steps a parameter of shape {tuple(p.shape)} that is not a "
                "parameter of the model: shard=3 gathers parameters around their module's forward, and nothing "
                "would gather this one; register it on a module of the model"
            )
        of_param[i] = next(iter(units)) if len(units) == 1 else 0
    return UnitPlan(of_param, of_module, hooked)
