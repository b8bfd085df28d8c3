"""Pruning bounds from the simple loss's occupations, and the pruned joiner inputs (k2's)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..._core import checks as _validate
from ..._core.errors import InputError
from . import checks


def _suffix_min(x: Tensor) -> Tensor:
    """``out[..., i] = min(x[..., i:])``: the largest non-decreasing lower bound of ``x``."""
    return torch.cummin(x.flip(-1), dim=-1).values.flip(-1)


def _adjust_lower_bound(s_begin: Tensor, step: int, s0: Tensor, t0: Tensor) -> Tensor:
    r"""Make window starts non-decreasing, rise by at most ``step - 1`` a frame, and start low.

    k2's ``_adjust_pruning_lower_bound`` (Pruned RNN-T, Kuang et al. 2022, sec. 3.2),
    generalized to a boundary's begins: with ``y_t = (step - 1)(t - t0) + s0 - x_t``,
    ``x_{t+1} - x_t <= step - 1`` is ``y`` non-decreasing and ``x_{t0} <= s0`` (the
    start state inside frame ``t0``'s window) is ``y_{t0} >= 0``. Taking the suffix
    minimum only lowers ``y`` (raises ``x``, never above its maximum) and keeps ``x``
    non-decreasing; clamping ``y >= 0`` keeps both. ``t0 = s0 = 0`` is k2's.
    """
    T = s_begin.shape[1]
    x = _suffix_min(s_begin)
    base = (step - 1) * (torch.arange(T, device=x.device)[None, :] - t0[:, None]) + s0[:, None]
    y = _suffix_min(base - x).clamp(min=0)
    return (base - y).clamp(min=0)


def _widened(R: int, boundary: Tensor | None, S: int, T: int, readable: bool) -> int:
    """fast_rnnt's widening of a regular window too small for a sequence.

    Windows that rise by at most ``R - 1`` a frame reach ``U_b`` symbols in ``T_b``
    frames only if ``(R - 1) T_b >= U_b``, so a sequence with frames and symbols needs
    ``R >= ceil(U_b / T_b) + 1``; the batch's largest need is taken, as fast_rnnt's
    ``get_rnnt_prune_ranges`` does (``(S - 1) // T + 2`` with its begins at 0; here
    ``U_b``, ``T_b`` count from a boundary's begins). A sequence with symbols but no
    frame has no path at any width: it asks for 2, the least that emits (fast_rnnt
    divides by zero there).
    """
    if boundary is None:
        need = (-(-S // T) + 1 if T else 2) if S else 1
    elif not readable or boundary.shape[0] == 0:
        return R
    else:
        h = _validate.to_host(boundary)
        U, Tb = h[:, 2] - h[:, 0], h[:, 3] - h[:, 1]
        need_b = np.where(Tb >= 1, -(-U // np.maximum(Tb, 1)) + 1, 2)
        need = int(np.where(U >= 1, need_b, 1).max())
    return min(max(R, need), S + 1)


def _check_occupations(px_grad: Tensor, py_grad: Tensor) -> tuple[int, int, int]:
    """``(B, S, T)`` of the simple loss's occupations, or ``InputError`` naming the tensor."""
    _validate.check_float_tensor(px_grad, "px_grad")
    _validate.check_float_tensor(py_grad, "py_grad")
    _validate.check_ndim(px_grad, "px_grad", (3,), "(B, S, T + 1) or (B, S, T)")
    _validate.check_ndim(py_grad, "py_grad", (3,), "(B, S + 1, T)")
    B, S1, T = py_grad.shape
    S = S1 - 1
    if px_grad.shape[0] != B or px_grad.shape[1] != S or px_grad.shape[2] not in (T, T + 1):
        raise InputError(
            f"px_grad must have shape (B, S, T + 1) = {(B, S, T + 1)} (regular) or (B, S, T) = "
            f"{(B, S, T)} for py_grad of shape (B, S + 1, T) = {tuple(py_grad.shape)}, got "
            f"{tuple(px_grad.shape)}"
        )
    return B, S, T


def _best_starts(pxg: Tensor, pyg: Tensor, R: int, regular: bool) -> Tensor:
    """``(B, T)``: each frame's window start ``s`` in ``[0, S + 1 - R]`` of highest score."""
    B, S1, T = pyg.shape
    if regular:
        # k2's score: the termination-symbol occupation inside [s, s + R) (every frame
        # ends on exactly one), less the emission into row s from below on the frame
        # (the path was then outside the window on that frame).
        occ = pyg
    else:
        # One state per frame here: the window holds the frame's arc iff it holds its
        # row, so the score is the state occupation inside [s, s + R), emissions
        # included (k2 counts py only, which scores an emitting frame as empty).
        occ = pyg + torch.cat((pxg, pxg.new_zeros((B, 1, T))), dim=1)
    cum = torch.cat((occ.new_zeros((B, 1, T)), torch.cumsum(occ, dim=1)), dim=1)  # (B, S+2, T)
    score = cum[:, R:] - cum[:, : S1 - R + 1]  # (B, S+2-R, T): occupation of [s, s+R)
    if regular:
        score = score - torch.cat((pxg.new_zeros((B, 1, T + 1)), pxg), dim=1)[:, : S1 - R + 1, :T]
    # The first maximum on ties. Over the last axis of a transposed copy: torch's argmax
    # across the middle one ran 2.5x slower (0.42 -> 0.17 ms, B=8 T=300 S=60).
    return torch.argmax(score.transpose(1, 2).contiguous(), dim=2)


def get_rnnt_prune_ranges(
    px_grad: Tensor,
    py_grad: Tensor,
    boundary: Tensor | None,
    s_range: int,
    *,
    validate: bool = True,
) -> Tensor:
    r"""The symbol window of each frame for the pruned loss, from the simple loss's occupations.

    k2's algorithm (Pruned RNN-T, Kuang et al. 2022, sec. 3.2): frame ``t``'s window
    starts at the ``s`` maximizing the occupation inside it,
    ``sum_{s <= r < s + s_range} py_grad[r, t] - px_grad[s - 1, t]`` (regular; for
    modified/constrained, where a frame holds one state, the state occupation
    ``sum_{s <= r < s + s_range} (py_grad + px_grad)[r, t]``: k2 counts ``py_grad``
    only there, which scores a frame whose path emits as empty); the last frame
    of a sequence (and every frame after it) starts at
    ``max(end_symbol - s_range + 1, 0)``, so the window holds the final state; then
    the starts are made non-decreasing, never rise by ``s_range`` or more in one frame
    (no symbol is skipped; by 2 or more for the modified/constrained topologies,
    which emit at most one symbol a frame), and begin at or below ``begin_symbol`` on
    ``begin_frame``.

    Args:
        px_grad: ``(B, S, T + 1)`` (regular) or ``(B, S, T)`` (modified/constrained)
            occupations of the emissions, from ``rnnt_loss_simple(..., return_grad=True)``.
        py_grad: ``(B, S + 1, T)`` occupations of the termination symbol.
        boundary: ``(B, 4)`` int64 ``[begin_symbol, begin_frame, end_symbol, end_frame]``
            (``None``: ``[0, 0, S, T]``).
        s_range: how many symbol positions each frame keeps (``>= 1``). Values above
            ``S`` keep every position (``S + 1``). Regular topology: a window that
            rises by at most ``s_range - 1`` a frame cannot reach ``U_b`` symbols in
            ``T_b`` frames below ``ceil(U_b / T_b) + 1`` (``s_range = 1`` never emits),
            so ``s_range`` is widened to the batch's largest such need, as fast_rnnt
            widens it (where it prints a warning); ``rnnt_loss_pruned`` on these wider
            windows then gives fast_rnnt's value.
        validate: check ``boundary``'s values (a device-to-host sync on CUDA).
            ``False`` reads nothing from a device ``boundary``, so the regular window
            is not widened there: ``s_range`` must suffice for every sequence.

    Returns:
        ``(B, T, R)`` int64, ``ranges[b, t] = r_t, r_t + 1, ..., r_t + R - 1``, ``R`` the
        (widened) ``s_range``, at most ``S + 1``.
    """
    validate = _validate.flag(validate, "validate")
    B, S, T = _check_occupations(px_grad, py_grad)
    s_range = checks.check_int(s_range, "s_range")
    if s_range < 1:
        raise InputError(f"s_range = {s_range} is invalid: expected s_range >= 1")
    regular = px_grad.shape[2] == T + 1
    device = py_grad.device
    boundary = checks.check_boundary(boundary, B, device)
    R = min(s_range, S + 1)
    if regular:
        R = _widened(R, boundary, S, T, validate or (
            boundary is not None and _validate.host_side(boundary)))
    sym = torch.zeros((B, S), dtype=torch.int64, device=device)
    lens, _ = checks.bounds(boundary, sym, None, T, 1, -1, "regular" if regular else "modified",
                            R if regular else 0, validate)
    s0, t0 = lens[:, 0], lens[:, 1]
    s_end, t_end = s0 + lens[:, 2], t0 + lens[:, 3]
    s_begin = _best_starts(px_grad.detach(), py_grad.detach(), R, regular)
    last = torch.arange(T, device=device)[None, :] >= (t_end - 1)[:, None]
    s_begin = torch.where(last, (s_end - R + 1).clamp(min=0)[:, None], s_begin)
    s_begin = _adjust_lower_bound(s_begin, R if regular else 2, s0, t0)
    return s_begin[:, :, None] + torch.arange(R, device=device)


def do_rnnt_pruning(am: Tensor, lm: Tensor, ranges: Tensor) -> tuple[Tensor, Tensor]:
    """Joiner inputs on the pruned lattice: ``(am_pruned, lm_pruned)``, ``(B, T, s_range, *)``.

    Args:
        am: ``(B, T, encoder_dim)`` encoder output.
        lm: ``(B, S + 1, decoder_dim)`` prediction network output.
        ranges: ``(B, T, s_range)`` int64 symbol positions (``get_rnnt_prune_ranges``).

    Returns:
        ``am_pruned (B, T, s_range, encoder_dim)`` (an expanded view of ``am``) and
        ``lm_pruned (B, T, s_range, decoder_dim)`` with
        ``lm_pruned[b, t, k] = lm[b, ranges[b, t, k]]``.
    """
    _validate.check_float_tensor(am, "am")
    _validate.check_float_tensor(lm, "lm")
    _validate.check_ndim(am, "am", (3,), "(B, T, encoder_dim)")
    _validate.check_ndim(lm, "lm", (3,), "(B, S + 1, decoder_dim)")
    if not isinstance(ranges, Tensor) or ranges.dtype not in _validate.INDEX_DTYPES:
        from ..._core.errors import InputTypeError

        raise InputTypeError("ranges must be an int64 (or int32) tensor of shape (B, T, s_range)")
    _validate.check_ndim(ranges, "ranges", (3,), "(B, T, s_range)")
    B, T, R = ranges.shape
    if am.shape[0] != B or lm.shape[0] != B:
        raise InputError(
            f"am, lm and ranges must share the batch size: am {tuple(am.shape)}, lm "
            f"{tuple(lm.shape)}, ranges {tuple(ranges.shape)}"
        )
    if am.shape[1] != T:
        raise InputError(f"ranges.size(1) = {T} must equal am.size(1) (T) = {am.shape[1]}")
    S1, D = lm.shape[1], lm.shape[2]
    ranges = ranges.to(device=lm.device, dtype=torch.int64)
    if not torch.compiler.is_compiling() and _validate.host_side(ranges) and ranges.numel():
        lo, hi = int(ranges.min()), int(ranges.max())
        if lo < 0 or hi >= S1:
            b = int(((ranges < 0) | (ranges >= S1)).flatten(1).any(1).nonzero()[0, 0])
            raise InputError(
                f"ranges[{b}] holds a symbol position outside lm's 0..S = 0..{S1 - 1}"
            )
    am_pruned = am[:, :, None, :].expand(B, T, R, am.shape[2])
    # One row gather on the flattened lm (index_select; its backward is index_add_), much
    # cheaper than a gather along dim 1 with a (B, T*R, D) expanded index.
    rows = (ranges + (torch.arange(B, device=lm.device) * S1)[:, None, None]).reshape(-1)
    lm_pruned = lm.reshape(B * S1, D).index_select(0, rows).reshape(B, T, R, D)
    return am_pruned, lm_pruned
