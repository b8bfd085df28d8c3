"""CTC argument checks: shapes and dtypes (metadata) and the values read (lengths, ids)."""

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
    pad_targets,
)
from .._core.errors import InputError, InputTypeError


def ctc_inputs(
    log_probs: torch.Tensor,
    targets: object,
    input_lengths: object,
    target_lengths: object,
    blank: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """Shape and dtype checks shared by every CTC entry point (metadata only).

    Accepts ``(T, B, C)`` log-probs with padded ``(B, S)`` or concatenated 1-D
    targets, or unbatched ``(T, C)`` with ``(S,)`` targets and scalar lengths.

    Returns:
        ``(log_probs (T, B, C), targets int64, input_lengths (B,) int64,
        target_lengths (B,) int64, unbatched)``; unbatched input gets ``B = 1``.
    """
    check_float_tensor(log_probs, "log_probs")
    device = log_probs.device
    unbatched = log_probs.dim() == 2
    if unbatched:
        tg = as_targets_tensor(targets, device)
        if tg.dim() != 1:
            raise InputError("targets must be 1-D (S,) for unbatched (T, C) log_probs, "
                             f"got {tuple(tg.shape)}")
        log_probs, tg = log_probs.unsqueeze(1), tg.unsqueeze(0)
        il = as_index_tensor(input_lengths, "input_lengths", device, allow_scalar=True).reshape(-1)
        tl = as_index_tensor(target_lengths, "target_lengths", device,
                             allow_scalar=True).reshape(-1)
    else:
        check_ndim(log_probs, "log_probs", (3,), "(T, B, C) or (T, C)")
        tg = as_targets_tensor(targets, device)
        check_ndim(tg, "targets", (1, 2), "padded (B, S) or concatenated 1-D")
        il = as_index_tensor(input_lengths, "input_lengths", device)
        tl = as_index_tensor(target_lengths, "target_lengths", device)
    T, B, C = log_probs.shape
    il = check_batch(il, "input_lengths", B)
    tl = check_batch(tl, "target_lengths", B)
    if tg.dim() == 2 and tg.shape[0] != B:
        raise InputError(f"targets must have shape (B={B}, S), got {tuple(tg.shape)}")
    if isinstance(blank, bool) or not isinstance(blank, int):
        raise InputTypeError(f"blank must be an int, got {type(blank).__name__}")
    if C == 0:
        raise InputError("log_probs must have at least one class (C >= 1)")
    if not 0 <= blank < C:
        raise InputError(f"blank = {blank} is out of range: expected 0 <= blank < C = {C}")
    return log_probs, tg, il, tl, unbatched


def ctc_values(
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    T: int,
    C: int,
    blank: int,
    *,
    validate: bool,
) -> torch.Tensor:
    """Value checks for CTC; returns the targets as padded ``(B, S)`` int64 (``pad_targets``).

    The checks run on host (numpy) copies of the lengths and ids: on CPU they are
    views, so the per-call cost stays a few microseconds.
    """
    tl_host = None
    if validate:
        check_lengths(input_lengths, "input_lengths", T, "log_probs.size(0) (T)")
        if targets.dim() == 2:
            tl_host = check_lengths(target_lengths, "target_lengths", targets.shape[1],
                                    "targets.size(1)")
        else:
            tl_host = check_lengths(target_lengths, "target_lengths", targets.shape[0],
                                    "targets.numel()")
            total = int(tl_host.sum())
            if total != targets.shape[0]:
                raise InputError(
                    f"target_lengths sum to {total} but the concatenated 1-D targets hold "
                    f"{targets.shape[0]} ids"
                )
        offsets = None if targets.dim() == 2 else np.cumsum(tl_host) - tl_host
        check_ids(targets, tl_host, "targets", C, blank, offsets=offsets)
    return pad_targets(targets, target_lengths, tl_host)
