"""DistributedModel's state dicts and attributes, which are the wrapped
module's; under shard=3 the state dicts and gathered_parameters() go through
the ParameterUnits that hold the parameters sharded.

Contract:
  * Without shard=3: state_dict() and load_state_dict() are the module's
    (its keys, without a prefix of the wrapper's), gathered_parameters() is
    a no-op, and an attribute the wrapper does not have is the module's.
  * shard=3 (hold_parameters_sharded, zero/parameter_units.py): state_dict()
    is collective and gathers the full state (``to``: the ranks that get
    it), sharded_state_dict() is this rank's shards and the rest of the
    module's state, load_state_dict() copies each rank's range into its
    shard; what they cannot honour (a destination, keep_vars, assign=True)
    is refused.
"""

import contextlib
from typing import Optional


class _ModelStateDicts:
    """DistributedModel's state dicts and attributes (a mixin; the state is
    DistributedModel.__init__'s): keeps _parameter_units; reads module."""

    def hold_parameters_sharded(self, units) -> None:
        """From now on ``units`` (shard=3's ParameterUnits) gathers the
        parameters around forward, and state_dict(), load_state_dict() and
        gathered_parameters() go through it. For good."""
        self._parameter_units = units

    def gathered_parameters(self, modifier_rank: Optional[int] = 0):
        """shard=3: a context (collective) inside which every parameter holds
        its full value; on exit each rank takes back the values
        ``modifier_rank`` holds then (None: read only, a write raises)."""
        if self._parameter_units is None:
            return contextlib.nullcontext()
        return self._parameter_units.gathered_parameters(modifier_rank)

    # The wrapper is transparent: keys, attributes and modes are the module's.
    # shard=3: collective, the full state gathered (``to``: the ranks that get it, None every rank).
    def state_dict(self, *args, to=None, **kwargs):
        if self._parameter_units is None:
            if to is not None:
                raise ValueError("hvdtorch: state_dict(to=...) is for shard=3 models, whose state is gathered")
            return self.module.state_dict(*args, **kwargs)
        unsupported = (["positional arguments"] if args else []) + [k for k in kwargs if k != "prefix"]
        if unsupported:
            raise ValueError(
                f"hvdtorch: state_dict() of a shard=3 model takes prefix= and to= only, not {', '.join(unsupported)}: "
                "it returns clones of the gathered parameters (no destination, no live parameters)"
            )
        return self._parameter_units.state_dict(self.module, kwargs.get("prefix", ""), to=to)

    def sharded_state_dict(self):
        """shard=3: this rank's shards and the rest of the module's state
        (local); load_state_dict() takes it back at the same rank and size, or
        every rank's in a list at any number of ranks."""
        if self._parameter_units is None:
            raise ValueError("hvdtorch: sharded_state_dict() is for shard=3 models; use state_dict()")
        return self._parameter_units.sharded_state_dict(self.module)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        if self._parameter_units is not None:
            if assign:
                raise ValueError(
                    "hvdtorch: load_state_dict(assign=True) of a shard=3 model: each rank copies its range of every "
                    "parameter into its shard; the given tensors cannot become the parameters"
                )
            return self._parameter_units.load_state_dict(self.module, state_dict, strict=strict)
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["module"], name)
