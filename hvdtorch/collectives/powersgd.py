"""PowerSGD (Vogels et al., NeurIPS 2019): ``hvd.Compression.powersgd(...)``,
the compressor of DistributedModel's and DistributedOptimizer's gradient
buckets. The algorithm is the C++ bucket strategy
(csrc/torch/strategies/powersgd.h); this object holds its options and, once a
model or optimizer reduces with it, the strategy and so its state.

Contract:
  * One compressor serves one DistributedModel or DistributedOptimizer at a
    time (its state is that model's): handing it to a second one while the
    first is alive is ValueError.
  * state_dict() is {"options", "iteration", "errors", "qs"}: the reduced
    passes counted, and each compressed parameter's error (this rank's) and
    Q (the same on every rank), keyed by the parameter's position among the
    reducer's parameters, and, once there are errors, the global rank whose
    they are (own_state.OWNER_KEY). load_state_dict() restores it now, or,
    before the model or optimizer is built, when it is. Call both between
    steps.
  * The errors are each rank's own: another rank's state (the usual rank-0
    checkpoint) is refused, naming the ways out, and the list of every
    rank's states gives each rank its own (collectives/own_state.py). A
    state of no rank's (elastic's sync, which averages the errors on
    purpose; a disowned one) is taken as it is.
  * It compresses buckets, not single tensors: hvd.allreduce(...,
    compression=) with it is ValueError.
"""

import weakref
from typing import Dict, Optional

import torch

from .. import _C
from . import own_state

_OPTIONS = ("rank", "start_iter", "min_compression_rate", "fp16", "seed")


class PowerSGDCompressor:
    """``rank``: columns of the factors P and Q; ``start_iter``: reduced
    passes all-reduced plainly before compression starts; a matrix is
    compressed only where n*m >= min_compression_rate * rank*(n+m);
    ``fp16``: P and Q travel as float16; ``seed``: of the first Q (the same
    on every rank)."""

    def __init__(
        self, rank: int = 1, start_iter: int = 10, min_compression_rate: float = 2.0, fp16: bool = False, seed: int = 0
    ):
        if int(rank) < 1:
            raise ValueError(f"hvdtorch: Compression.powersgd: rank must be >= 1, got {rank}")
        if int(start_iter) < 0:
            raise ValueError(f"hvdtorch: Compression.powersgd: start_iter must be >= 0, got {start_iter}")
        if float(min_compression_rate) < 0:
            raise ValueError(
                f"hvdtorch: Compression.powersgd: min_compression_rate must be >= 0, got {min_compression_rate}"
            )
        if not 0 <= int(seed) < 2**63:
            raise ValueError(f"hvdtorch: Compression.powersgd: seed must be in [0, 2**63), got {seed}")
        self.rank = int(rank)
        self.start_iter = int(start_iter)
        self.min_compression_rate = float(min_compression_rate)
        self.fp16 = bool(fp16)
        self.seed = int(seed)
        self._strategy: Optional[_C.PowerSGDStrategy] = None
        self._owner = None  # a weak reference to what reduces with it
        self._pending: Optional[Dict] = None  # a state loaded before the strategy existed
        self._process_rank: Optional[int] = None  # the global rank of the model or optimizer using it

    def __repr__(self):
        return "Compression.powersgd(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in _OPTIONS) + ")"

    # ---- Horovod's compressor interface: not for single tensors ---------------

    def compress(self, tensor):
        raise ValueError(
            "hvdtorch: Compression.powersgd compresses the gradient buckets of hvd.DistributedModel and "
            "hvd.DistributedOptimizer; a single all-reduce (hvd.allreduce(compression=...)) takes "
            "Compression.none or Compression.fp16"
        )

    def decompress(self, tensor, ctx):
        self.compress(tensor)

    # ---- the gradient paths ----------------------------------------------------

    def check_parameters(self, named_params, where: str) -> None:
        """ValueError naming the first parameter PowerSGD cannot carry (complex, or not floating point)."""
        for name, p in named_params:
            if not p.is_floating_point():
                raise ValueError(
                    f"hvdtorch: {where}: Compression.powersgd reduces real floating-point gradients; parameter "
                    f"'{name}' is {p.dtype}"
                )

    def check_process_set(self, process_set, where: str) -> None:
        """An explicit process set of one rank has nothing to compress across: ValueError. (A job of one
        process is served: alone in the global set, gradients are left exact.)"""
        # Id 0 is the global set (process_sets.py).
        if process_set is not None and process_set.process_set_id != 0 and process_set.size() < 2:
            raise ValueError(
                f"hvdtorch: {where}: Compression.powersgd compresses across the ranks of a process set; "
                f"process set {process_set.process_set_id} has {process_set.size()} rank(s); pass "
                "compression=Compression.none for it"
            )

    def strategy_for(self, owner, rank: int) -> "_C.PowerSGDStrategy":
        """The C++ strategy ``owner`` (a DistributedModel or a GradientSync) hands its GradientReducer;
        made on the first call, with the state loaded so far. ``rank``: this process's global rank (whose
        error feedback the state holds)."""
        current = self._owner() if self._owner is not None else None
        if current is not None and current is not owner:
            raise ValueError(
                f"hvdtorch: this {self!r} already compresses the gradients of {type(current).__name__}; "
                "make one compressor per model or optimizer"
            )
        self._owner = weakref.ref(owner)
        self._process_rank = int(rank)
        if self._strategy is None:
            self._strategy = _C.PowerSGDStrategy(
                rank=self.rank,
                start_iter=self.start_iter,
                min_compression_rate=self.min_compression_rate,
                fp16=self.fp16,
                seed=self.seed,
            )
            if self._pending is not None:
                pending, self._pending = self._pending, None
                pending = self._own(pending)
                self._strategy.load_state(pending["iteration"], pending["errors"], pending["qs"])
        return self._strategy

    # ---- state -------------------------------------------------------------------

    @property
    def iteration(self) -> int:
        """Reduced passes counted so far."""
        if self._strategy is not None:
            return self._strategy.iteration
        return self._pending["iteration"] if self._pending is not None else 0

    def state_dict(self) -> Dict:
        if self._strategy is not None:
            iteration, errors, qs = self._strategy.state()
        elif self._pending is not None:
            iteration, errors, qs = self._pending["iteration"], self._pending["errors"], self._pending["qs"]
        else:
            iteration, errors, qs = 0, {}, {}
        state = {
            "options": {k: getattr(self, k) for k in _OPTIONS},
            "iteration": int(iteration),
            "errors": {int(k): v.clone() for k, v in errors.items()},
            "qs": {int(k): v.clone() for k, v in qs.items()},
        }
        # Its own errors: whose they are (none yet, or before a model or optimizer took it: no one's).
        return own_state.mark(state, self._process_rank if errors else None)

    def load_state_dict(self, state_dict) -> None:
        """This rank's state, the list of every rank's (it takes its own), or a state of no rank's
        (own_state.py); before a model or optimizer took it, the owner is checked when one does."""
        if isinstance(state_dict, (list, tuple)) or self._process_rank is not None:
            if self._process_rank is None:
                raise ValueError(
                    "hvdtorch: Compression.powersgd.load_state_dict(): a list of every rank's states is taken once "
                    "a model or optimizer compresses with it (it then knows its rank); build that first"
                )
            state_dict = self._own(state_dict)
        options = state_dict.get("options", {})
        for key in ("rank", "seed"):
            if key in options and options[key] != getattr(self, key):
                raise ValueError(
                    f"hvdtorch: Compression.powersgd: the state was saved with {key}={options[key]}, "
                    f"this compressor has {key}={getattr(self, key)}"
                )
        state = {
            "iteration": int(state_dict["iteration"]),
            "errors": {int(k): torch.as_tensor(v) for k, v in state_dict["errors"].items()},
            "qs": {int(k): torch.as_tensor(v) for k, v in state_dict["qs"].items()},
        }
        if own_state.OWNER_KEY in state_dict:  # checked once a model or optimizer takes it
            state[own_state.OWNER_KEY] = state_dict[own_state.OWNER_KEY]
        if self._strategy is not None:
            self._strategy.load_state(state["iteration"], state["errors"], state["qs"])
        else:
            self._pending = state

    def _own(self, state):
        return own_state.own(state, self._process_rank, "Compression.powersgd.load_state_dict()", "its error feedback")


def is_powersgd(compression) -> bool:
    return isinstance(compression, PowerSGDCompressor)
