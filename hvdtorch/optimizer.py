"""Horovod's DistributedOptimizer: wraps a torch optimizer so that step()
applies gradients averaged across ranks.

    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    loss.backward()
    opt.step()

Gradient hooks start each bucket's all-reduce during backward; step() (or
synchronize()) waits for them. Implemented on the same C++ gradient reducer
as DistributedModel.
"""
import contextlib
import itertools
import warnings

import torch

from . import _C, ops, runtime
from .buckets import plan_buckets
from .compression import Compression

_instance_ids = itertools.count()


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, fusion_bytes, reducer):
        super(self.__class__, self).__init__(params)
        if op not in (ops.Average, ops.Sum):
            raise ValueError("hvdtorch: DistributedOptimizer supports op=hvd.Average or hvd.Sum")
        all_params = []
        seen = set()
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    all_params.append(p)
        if named_parameters is not None:
            named = list(named_parameters)
            names = [n for n, _ in named]
            if len(set(names)) != len(names):
                raise ValueError("hvdtorch: named_parameters contains duplicate names")
            known = {id(p) for _, p in named}
            missing = [p for p in all_params if id(p) not in known]
            if missing:
                raise ValueError(f"hvdtorch: {len(missing)} optimizer parameters are missing from named_parameters")
        index = {id(p): i for i, p in enumerate(all_params)}
        if groups is None:
            layout = plan_buckets(all_params, reversed(range(len(all_params))), fusion_bytes, 1 << 20)
        elif isinstance(groups, int):
            if groups <= 0:
                raise ValueError("hvdtorch: groups must be a positive number of groups")
            indices = list(range(len(all_params)))
            layout = _split_by_dtype(all_params, [b for b in (indices[k::groups] for k in range(groups)) if b])
        else:
            layout = _split_by_dtype(all_params, [[index[id(p)] for p in g] for g in groups])
            grouped = {i for b in layout for i in b}
            layout += [[i] for i in range(len(all_params)) if i not in grouped]
        f = float(gradient_predivide_factor)
        self._hvd_params = all_params
        self._hvd_skip_sync = False
        self._hvd_reducer = _C.GradientReducer(
            runtime.state().engine, all_params, layout, f"optimizer{next(_instance_ids)}", reducer or "", op,
            1.0 / f, f, True, False, fusion_bytes > 0, int(backward_passes_per_step),
            compression is Compression.fp16)

    def synchronize(self):
        """Waits until every gradient of the last backward pass is reduced."""
        self._hvd_reducer.finalize()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside does not synchronize (call synchronize() yourself first)."""
        self._hvd_skip_sync = True
        try:
            yield
        finally:
            self._hvd_skip_sync = False

    def step(self, closure=None):
        if not self._hvd_skip_sync:
            self.synchronize()
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none: bool = True):
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)


def _split_by_dtype(params, layout):
    out = []
    for bucket in layout:
        by_dtype = {}
        for i in bucket:
            by_dtype.setdefault(params[i].dtype, []).append(i)
        out.extend(by_dtype.values())
    return out


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=ops.Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False, process_set=None,
                         fusion_bytes=25 << 20, reducer=None):
    """Returns ``optimizer`` turned distributed (Horovod's signature).

    num_groups / groups: as in Horovod, how parameters are grouped into
    all-reduces (an int, or lists of parameters); default: fusion buckets
    of ``fusion_bytes``."""
    if process_set is not None and process_set is not ops.global_process_set:
        raise ValueError("hvdtorch supports only the global process set")
    if num_groups and groups is None:
        groups = num_groups
    if sparse_as_dense:
        warnings.warn("hvdtorch: sparse_as_dense has no effect; gradients are dense", stacklevel=2)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, fusion_bytes, reducer)
