"""The state dicts of a shard=3 model: the full one (gathered bucket by
bucket), the sharded one, their loading, and the refusal of a module's own
while its parameters are stand-ins.

Contract:
  * Full state dicts are gathered bucket by bucket (never the whole model at
    once) and cloned on the ranks that receive them; loading one writes each
    rank's range of every parameter into its shard, locally: any number of
    ranks, any bucket layout. It refuses what torch refuses, in torch's
    words (strict: missing and unexpected keys; a tensor of another shape,
    "size mismatch", even of the same number of elements) and returns the
    keys torch returns. A sharded state dict is this rank's shards and
    the module's other state (buffers, frozen parameters): it loads back at
    the same rank and size, and every rank's, as a list in any order, at
    any size with the same buckets.
  * A sharded state dict is one key, SHARDED_FORMAT, by which
    load_state_dict() tells it from a full one.
  * ``state_dict()`` and ``load_state_dict()`` of the model or any module
    in it raise (the hooks ParameterUnits puts on every hooked module),
    naming the DistributedModel's own and ``gathered_parameters()``; inside
    that, and when this code itself calls them (_own_reads()), they work.
  * A load of either form changes the shards: nothing gathered before is
    read again, and the secondary copies are dropped (after_step()).
"""

import collections
import contextlib
from typing import Dict, List

import torch

from .. import runtime
from ..collectives import ops
from .layout import signature, write_into_shard

# The key of a sharded_state_dict() (what load_state_dict() tells it by).
SHARDED_FORMAT = "hvdtorch.zero3.shards"


class _StateDicts:
    """ParameterUnits' state dicts (a mixin; the state is
    ParameterUnits.__init__'s): reads _buckets, _params, _index_of, _place,
    _process_set, _rank, _size, _name, _full, _pins and _gather_dtype;
    keeps _reading; writes _shards and drops _secondary parts; gathers and
    frees through _finish and _free, and ends a load with after_step()."""

    def _refuse_state_dict(self, module, *_) -> None:
        self._refuse(
            f"state_dict() of a module whose parameters shard=3 holds sharded ({type(module).__name__}): its "
            "parameters are stand-ins outside forward. Use the DistributedModel's state_dict() (the full state, "
            "gathered), or read them"
        )

    def _refuse_load_state_dict(self, module, *_) -> None:
        self._refuse(
            f"load_state_dict() into a module whose parameters shard=3 holds sharded ({type(module).__name__}): "
            "use the DistributedModel's load_state_dict() (every rank takes its shard), or write them"
        )

    def _refuse(self, what: str) -> None:
        """The module state hooks: a read or write of stand-ins raises, except
        inside gathered_parameters() or this code's own (_own_reads())."""
        if self._pins or self._reading:
            return
        raise RuntimeError(f"hvdtorch: rank {runtime.rank()}: {what} inside `with model.gathered_parameters():`")

    @contextlib.contextmanager
    def _own_reads(self):
        """The module's state_dict()/load_state_dict() called by this code, which takes the parameters itself."""
        self._reading += 1
        try:
            yield
        finally:
            self._reading -= 1

    def state_dict(self, module: torch.nn.Module, prefix: str = "", to=None) -> dict:
        """Collective: the module's full state (parameters gathered bucket by
        bucket, cloned) on ``to`` (a global rank, a list of them, or None:
        every rank); an empty dict elsewhere."""
        receivers = None if to is None else {int(r) for r in ([to] if isinstance(to, int) else to)}
        here = receivers is None or runtime.rank() in receivers
        with self._own_reads():
            raw = module.state_dict(prefix=prefix, keep_vars=True)
        keys_of: Dict[int, List[str]] = {}
        for k, v in raw.items():
            keys_of.setdefault(id(v), []).append(k)
        out = {k: v.detach().clone() for k, v in raw.items() if id(v) not in self._index_of} if here else {}
        for j, b in enumerate(self._buckets):
            was_gathered = self._full[j] is not None
            if self._gather_dtype is not None:  # the shards' own precision, not the policy's
                full = ops.allgather(self._shards[j], name=f"{self._name}.state.{j}", process_set=self._process_set)
                was_gathered = True  # nothing installed here to free
            else:
                full = self._finish(j)
            if here:
                for i, offset, shape in zip(b.params, b.offsets, b.shapes):
                    value = full[offset : offset + int(torch.Size(shape).numel())].view(shape).clone()
                    for k in keys_of.get(id(self._params[i]), []):
                        out[k] = value
            del full  # held here, a host's bucket would be copied at its release
            if not was_gathered:
                self._free(j, kept_too=True)
        return {k: out[k] for k in raw if k in out}

    def sharded_state_dict(self, module: torch.nn.Module) -> dict:
        """This rank's shards (cloned) and the module's state shard=3 does not
        hold (buffers, frozen parameters): local, cheap."""
        with self._own_reads():
            raw = module.state_dict(keep_vars=True)
        rest = {k: v.detach().clone() for k, v in raw.items() if id(v) not in self._index_of}
        return {
            SHARDED_FORMAT: {
                "rank": self._rank,
                "size": self._size,
                "buckets": signature(self._buckets),
                "shards": [s.detach().clone() for s in self._shards],
                "rest": rest,
            }
        }

    def _load_sharded(self, module: torch.nn.Module, given) -> None:
        """A sharded_state_dict(): this rank's own (same rank and size), or the
        list of every rank's (any number of ranks, the same buckets)."""
        mine = signature(self._buckets)
        parts = [g[SHARDED_FORMAT] for g in (given if isinstance(given, (list, tuple)) else [given])]
        if any(p["buckets"] != mine for p in parts):
            raise ValueError(
                "hvdtorch: load_state_dict: the sharded state was saved with other buckets (another model or "
                "fusion_bytes): load the full state (the DistributedModel's state_dict()) instead"
            )
        if len(parts) == 1 and (parts[0]["rank"], parts[0]["size"]) != (self._rank, self._size):
            raise ValueError(
                f"hvdtorch: load_state_dict: rank {self._rank} of {self._size} was given the shards of rank "
                f"{parts[0]['rank']} of {parts[0]['size']}: pass this rank's own sharded_state_dict(), or the list "
                "of every rank's"
            )
        with torch.no_grad():
            if len(parts) == 1:
                for shard, saved in zip(self._shards, parts[0]["shards"]):
                    shard.copy_(saved)
            else:
                parts = sorted(parts, key=lambda p: p["rank"])
                if [p["rank"] for p in parts] != list(range(parts[0]["size"])):
                    raise ValueError("hvdtorch: load_state_dict: the list must hold every rank's sharded state")
                for j, b in enumerate(self._buckets):
                    full = torch.cat([p["shards"][j].reshape(-1) for p in parts])
                    start, end = b.shard_range(self._rank, self._size)
                    self._shards[j].copy_(full[start:end])
        with self._own_reads():
            module.load_state_dict(parts[0]["rest"], strict=False)
        self.after_step()

    def load_state_dict(self, module: torch.nn.Module, state_dict, strict: bool = True):
        """Each rank writes its range of every parameter into its shard (local,
        so every rank calls it with the full state); buffers and parameters
        shard=3 does not hold load as torch loads them. What torch refuses is
        refused as torch refuses it, in its words: with ``strict``, missing
        and unexpected keys; always, a tensor of another shape ("size
        mismatch", never a reshape of the same number of elements). The
        keys are returned as torch returns them."""
        if SHARDED_FORMAT in state_dict or (
            isinstance(state_dict, (list, tuple)) and all(SHARDED_FORMAT in s for s in state_dict)
        ):
            self._load_sharded(module, state_dict)
            return torch.nn.modules.module._IncompatibleKeys([], [])
        sharded_ids = self._index_of
        with self._own_reads():
            raw = module.state_dict(keep_vars=True)

        def sharded(k):
            return k in raw and id(raw[k]) in sharded_ids

        rest = collections.OrderedDict((k, v) for k, v in state_dict.items() if not sharded(k))
        metadata = getattr(state_dict, "_metadata", None)
        if metadata is not None:  # the modules' versions, which their loading hooks read
            rest._metadata = metadata
        with self._own_reads():
            result = module.load_state_dict(rest, strict=False)  # raises torch's errors of what it loads
        # torch's list, in its order, less the sharded parameters loaded here.
        missing = [k for k in result.missing_keys if not (sharded(k) and k in state_dict)]
        errors = []
        with torch.no_grad():
            for k, v in raw.items():  # a tied parameter's keys in torch's order: its last key's value stays
                if not sharded(k) or k not in state_dict:
                    continue
                value = state_dict[k]
                if not torch.overrides.is_tensor_like(value):
                    errors.append(
                        f'While copying the parameter named "{k}", expected torch.Tensor or Tensor-like object '
                        f"from checkpoint but received {type(value)}"
                    )
                    continue
                if v.dim() == 0 and value.dim() == 1 and value.shape[0] == 1:
                    value = value[0]  # torch's rule for a checkpoint of torch 0.3
                if value.shape != v.shape:
                    errors.append(
                        f"size mismatch for {k}: copying a param with shape {value.shape} from checkpoint, "
                        f"the shape in current model is {v.shape}."
                    )
                    continue
                self._write_parameter(sharded_ids[id(v)], value)
        self.after_step()
        if strict and result.unexpected_keys:
            errors.insert(
                0, "Unexpected key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in result.unexpected_keys))
            )
        if strict and missing:
            errors.insert(0, "Missing key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in missing)))
        if errors:
            raise RuntimeError(
                "Error(s) in loading state_dict for {}:\n\t{}".format(type(module).__name__, "\n\t".join(errors))
            )
        return torch.nn.modules.module._IncompatibleKeys(missing, list(result.unexpected_keys))

    def _write_parameter(self, i: int, value: torch.Tensor) -> None:
        j, offset = self._place[i]
        start, end = self._buckets[j].shard_range(self._rank, self._size)
        write_into_shard(self._shards[j], start, end, offset, value)
        if self._full[j] is not None:  # a gathered copy would be stale
            self._free(j, kept_too=True)
        self._secondary.pop(j, None)
