"""Transducer argument checks: shapes and dtypes (metadata) and the values read."""

from __future__ import annotations

import numpy as np
import torch

from .._core.checks import (
    as_index_tensor,
    as_targets_tensor,
    check_batch,
    check_float_tensor,
    check_ids,
    check_lengths,
    check_ndim,
    check_padded_targets,
    int_arg,
    pad_targets,
)
from .._core.errors import InputError, InputTypeError


def transducer_inputs(
    logits: torch.Tensor,
    targets: object,
    logit_lengths: object,
    target_lengths: object,
    blank: object,
    *,
    packed: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Shape and dtype checks shared by the transducer entry points (metadata only).

    Padded: ``logits (B, T, U+1, V)``, ``targets (B, S)``. Packed: ``logits (N, V)``,
    ``targets`` padded ``(B, S)`` or concatenated 1-D. ``blank < 0`` counts from
    the end (``-1``: ``V - 1``).

    Returns:
        ``(targets int64, logit_lengths (B,) int64, target_lengths (B,) int64, blank)``.
    """
    check_float_tensor(logits, "logits")
    device = logits.device
    if packed:
        check_ndim(logits, "logits", (2,), "packed (sum_b T_b * (U_b + 1), V)")
    else:
        check_ndim(logits, "logits", (4,), "(B, T, U+1, V)")
    tg = as_targets_tensor(targets, device)
    il = as_index_tensor(logit_lengths, "logit_lengths", device)
    tl = as_index_tensor(target_lengths, "target_lengths", device)
    if packed:
        # No batch axis in the logits: the lengths give B. A 0-D or (1, 1) length is a
        # batch of one, a (B, 1) column a batch of B (B = 0 included), as check_batch
        # takes them for padded logits.
        if il.dim() == 0:
            il = il.reshape(1)
        elif il.dim() == 2 and il.shape[1] == 1:
            il = il.reshape(il.shape[0])
        check_ndim(il, "logit_lengths", (1,), "(B,) or a (B, 1) column")
    B = logits.shape[0] if not packed else il.shape[0]
    il = check_batch(il, "logit_lengths", B)
    tl = check_batch(tl, "target_lengths", B)
    if packed:
        check_ndim(tg, "targets", (1, 2), "padded (B, S) or concatenated 1-D")
        if tg.dim() == 2 and tg.shape[0] != B:
            raise InputError(f"targets must have shape (B={B}, U), got {tuple(tg.shape)}")
    else:
        tg = check_padded_targets(tg, B)
    blank = int_arg(blank, "blank")
    V = logits.shape[-1]
    if V == 0:
        raise InputError("logits must have at least one class (V >= 1)")
    if not -V <= blank < V:
        raise InputError(f"blank = {blank} is out of range: expected -V <= blank < V = {V}")
    return tg, il, tl, blank % V


def transducer_values(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int | tuple[int, ...],
    *,
    validate: bool,
    num_tokens: int | None = None,
    tokens_what: str | None = None,
) -> torch.Tensor:
    """Value checks for transducers; returns the targets as padded ``(B, S)`` int64.

    Padded logits ``(B, T, U+1, V)``: ``logit_lengths[b] <= T``, ``target_lengths[b]
    <= min(targets.size(1), U)``. Packed ``(N, V)``: the rows add up to ``N``.
    Target ids read (``< target_lengths[b]``) must lie in ``[0, V)`` (``num_tokens``:
    the token block, when the joint has duration logits after it; ``tokens_what`` says
    how it was derived, for the message) and differ from
    ``blank`` (every blank-like class, when a tuple). Entries past a target length are
    replaced by 0, so no kernel reads an unchecked id.
    """
    V = logits.shape[-1] if num_tokens is None else num_tokens
    packed = logits.dim() == 2
    if validate:
        if packed:
            il = check_lengths(logit_lengths, "logit_lengths", 2**62, "the int64 range")
        else:
            il = check_lengths(logit_lengths, "logit_lengths", logits.shape[1],
                               "logits.size(1) (T)")
        if targets.dim() == 2:
            tl = check_lengths(target_lengths, "target_lengths", targets.shape[1],
                               "targets.size(1)")
        else:
            tl = check_lengths(target_lengths, "target_lengths", targets.shape[0],
                               "targets.numel()")
        if not packed:
            check_lengths(target_lengths, "target_lengths", logits.shape[2] - 1,
                          "logits.size(2) - 1 (U)")
        if targets.dim() == 1 and int(tl.sum()) != targets.shape[0]:
            raise InputError(
                f"target_lengths sum to {int(tl.sum())} but the concatenated 1-D targets hold "
                f"{targets.shape[0]} ids"
            )
        if packed:
            rows = int((il * (tl + 1)).sum())
            if rows != logits.shape[0]:
                raise InputError(
                    f"logits.size(0) = {logits.shape[0]} but the packed layout needs "
                    f"sum_b logit_lengths[b] * (target_lengths[b] + 1) = {rows} rows"
                )
        offsets = None if targets.dim() == 2 else np.cumsum(tl) - tl
        check_ids(targets, tl, "targets", V, blank, offsets=offsets, classes_what=tokens_what)
    return pad_targets(targets, target_lengths, tl if validate else None)


def check_durations(durations: object, name: str) -> tuple[int, ...]:
    """``durations`` (a sequence of ints, or a 1-D int32/int64 tensor or numpy array) as a
    tuple of distinct ints (metadata: a tensor is read on the host once; lists are usual)."""
    if isinstance(durations, torch.Tensor):
        if durations.dtype not in (torch.int32, torch.int64):
            raise InputTypeError(f"{name} must be ints, got a {durations.dtype} tensor")
        if durations.dim() != 1:
            raise InputError(f"{name} must be 1-D, got shape {tuple(durations.shape)}")
        vals = [int(v) for v in durations.tolist()]
    elif isinstance(durations, np.ndarray):
        if durations.dtype.kind not in "iu" or durations.ndim != 1:
            raise InputTypeError(f"{name} must be a 1-D integer array, got a numpy "
                                 f"{durations.dtype} array of shape {durations.shape}")
        vals = [int(v) for v in durations.tolist()]
    elif isinstance(durations, (list, tuple)):
        vals = []
        for i, v in enumerate(durations):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise InputTypeError(f"{name}[{i}] must be an int, got {type(v).__name__} {v!r}")
            vals.append(int(v))
    else:
        raise InputTypeError(f"{name} must be a list of ints, got {type(durations).__name__}")
    seen: set[int] = set()
    for i, v in enumerate(vals):
        if v in seen:
            raise InputError(f"{name}[{i}] = {v} repeats an earlier duration: durations must "
                             f"be unique, got {vals}")
        seen.add(v)
    return tuple(vals)


def resolve_token_blank(blank: object, V: int, what: str = "V") -> int:
    """``blank`` in ``[-V, V)`` as an index in ``[0, V)`` (``-1``: ``V - 1``)."""
    blank = int_arg(blank, "blank")
    if V < 1:
        raise InputError(f"logits must have at least one token class ({what} >= 1), "
                         f"got {what} = {V}")
    if not -V <= blank < V:
        raise InputError(f"blank = {blank} is out of range: "
                         f"expected -{what} <= blank < {what} = {V}")
    return blank % V
