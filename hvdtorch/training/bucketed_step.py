"""Stepping the optimizer bucket by bucket, as the reduced gradients arrive.

Backward launches the buckets' reductions in order; waiting for all of them
and then stepping leaves the optimizer's work after the last byte arrives.
Stepping each bucket's parameters as soon as that bucket is reduced moves
the updates of all but the last bucket under the reductions still running
(across hosts: under the wire time of the last, largest buckets).

Contract:
  * The result is the same as reducing everything and then one
    ``optimizer.step()``: only optimizers whose update of a parameter reads
    nothing but that parameter, its gradient and its own state may be
    stepped in pieces, so only torch.optim's per-parameter optimizers whose
    ``step`` is torch's own are (``steps_in_pieces``); anything else (LBFGS,
    a subclass with its own step, an optimizer that scales by a global
    gradient norm) gets the plain path.
  * A piece is a run of consecutive buckets of at least ``PIECE_BYTES``
    (the last piece: whatever is left), so that a layout of many small
    buckets does not pay one optimizer call per bucket.
  * While a piece is stepped, each parameter group's ``params`` holds only
    that piece's parameters (empty lists for the others); the lists are put
    back before this returns, also on an error. Parameters of the optimizer
    that no bucket holds (frozen in the model, say) are stepped last.
  * Step hooks of the optimizer run once per piece.
"""

from typing import Callable, List, Optional, Sequence

import torch

# A piece of this many gradient bytes or more is stepped on its own.
PIECE_BYTES = 1 << 20

_PER_PARAMETER = (
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adagrad,
    torch.optim.Adadelta,
    torch.optim.Adamax,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.RMSprop,
    torch.optim.Rprop,
    torch.optim.ASGD,
)


def steps_in_pieces(optimizer_class: type) -> bool:
    """Whether ``optimizer_class`` updates each parameter from its own
    gradient and state alone, with torch's own step (see the contract)."""
    return any(issubclass(optimizer_class, base) and optimizer_class.step is base.step for base in _PER_PARAMETER)


def pieces(buckets: Sequence[Sequence[torch.Tensor]], piece_bytes: Optional[int] = None) -> List[List[int]]:
    """Consecutive bucket indices grouped into pieces of at least
    ``piece_bytes`` (default PIECE_BYTES) gradient bytes (the last piece may
    be smaller)."""
    piece_bytes = PIECE_BYTES if piece_bytes is None else piece_bytes
    out: List[List[int]] = []
    current: List[int] = []
    size = 0
    for j, params in enumerate(buckets):
        current.append(j)
        size += sum(p.numel() * p.element_size() for p in params)
        if size >= piece_bytes:
            out.append(current)
            current, size = [], 0
    if current:
        out.append(current)
    return out


def step_in_pieces(
    step: Callable[[], object],
    param_groups: List[dict],
    buckets: Sequence[Sequence[torch.Tensor]],
    finish_bucket: Callable[[int], None],
) -> None:
    """Steps ``param_groups`` with ``step()`` (the optimizer's own step over
    the groups as they stand), piece by piece: before each piece,
    ``finish_bucket(j)`` waits for each of its buckets."""
    saved = [group["params"] for group in param_groups]
    in_buckets = set()
    try:
        for piece in pieces(buckets):
            ids = set()
            for j in piece:
                finish_bucket(j)
                ids.update(id(p) for p in buckets[j])
            _step_only(step, param_groups, saved, ids)
            in_buckets |= ids
        rest = {id(p) for params in saved for p in params} - in_buckets
        if rest:
            _step_only(step, param_groups, saved, rest)
    finally:
        for group, params in zip(param_groups, saved):
            group["params"] = params


def step_as_reduced(reducer, params: Sequence[torch.Tensor], step: Callable[[], object], param_groups) -> None:
    """step_in_pieces() over the buckets of ``reducer`` (a _C.GradientReducer
    whose parameter i is ``params[i]``), then its finalize(), which also
    waits for whatever an error left in flight."""
    buckets = [[params[i] for i in bucket] for bucket in reducer.bucket_params()]
    try:
        step_in_pieces(step, param_groups, buckets, reducer.finish_bucket)
    finally:
        reducer.finalize()


def _step_only(step, param_groups, saved, ids) -> None:
    chosen = [[p for p in params if id(p) in ids] for params in saved]
    if not any(chosen):
        return  # no parameter of this optimizer in the piece
    for group, params in zip(param_groups, chosen):
        group["params"] = params
    step()
