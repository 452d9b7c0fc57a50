"""The names DistributedOptimizer gives its parameters (Horovod's
``optimizer._parameter_names``, parameter -> name).

With ``named_parameters`` the names are the caller's, checked as Horovod
checks them: (name, parameter) tuples, unique names, every optimizer
parameter named. Without it, a parameter is ``allreduce.noname.<g>.<j>``,
the j-th of parameter group g: unique, and the same on every rank as long as
the ranks build their optimizers' parameter groups in the same order (which
data-parallel training needs anyway), unless the model is known (``module``:
DistributedOptimizer's model=, or the DistributedModel over the
parameters): then a parameter without a given name has the module's own
name for it (``transformer.h.0.attn.c_attn.weight``), which is what errors
and refusals should say."""

from typing import Dict


def names_by_id(param_groups, named_parameters, module=None) -> Dict[int, str]:
    """id(parameter) -> name for every parameter of ``param_groups``."""
    if named_parameters is None:
        names = {
            id(p): f"allreduce.noname.{g}.{j}"
            for g, group in enumerate(param_groups)
            for j, p in enumerate(group["params"])
        }
        if module is not None:
            names.update({id(p): n for n, p in module.named_parameters() if id(p) in names})
        return names
    named = list(named_parameters)
    if any(not isinstance(item, tuple) for item in named):
        raise ValueError(
            "hvdtorch: named_parameters must be (name, parameter) tuples, such as model.named_parameters() gives"
        )
    names = [n for n, _ in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(
            f"hvdtorch: parameter names in named_parameters must be unique; repeated: {', '.join(duplicates)}"
        )
    by_id = {id(p): n for n, p in named}
    params = [p for group in param_groups for p in group["params"]]
    missing = [i for i, p in enumerate(params) if id(p) not in by_id]
    if missing:
        raise ValueError(
            f"hvdtorch: named_parameters was given, but {len(missing)} optimizer parameters are not "
            f"in it (positions {missing[:10]} in the optimizer's parameter groups)"
        )
    return by_id


def names_by_parameter(param_groups, named_parameters, module=None) -> Dict:
    """parameter -> name (tensors hash by identity), Horovod's ``_parameter_names``."""
    by_id = names_by_id(param_groups, named_parameters, module)
    return {p: by_id[id(p)] for group in param_groups for p in group["params"]}
