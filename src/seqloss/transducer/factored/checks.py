"""Checks of the factored-joint losses (simple, smoothed, pruned RNN-T).

Shape and dtype checks run in the public functions (metadata only, so they run
while tracing too). The value checks (``boundary``, ``symbols``, ``ranges``, the
per-sequence feasibility of ``s_range``) run inside ``seqloss::factored_bounds``, a
torch.library op whose implementation runs eagerly even under ``torch.compile``,
so checking costs no graph break. The op also turns ``boundary`` into the
per-sequence ``[begin_symbol, begin_frame, U_b, T_b]`` the lattice needs and
returns the symbols with every unread position (before ``begin_symbol``, at or
after ``end_symbol``) replaced by 0 and the termination symbol appended, so no
gather ever reads an unchecked id.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..._core import checks as _validate
from ..._core.errors import InputError, InputTypeError
from ..._core.opdecl import OpDecl

RNNT_TYPES = ("regular", "modified", "constrained")


def check_rnnt_type(rnnt_type: object) -> str:
    if not isinstance(rnnt_type, str) or rnnt_type not in RNNT_TYPES:
        raise InputError(f"rnnt_type must be one of {RNNT_TYPES}, got {rnnt_type!r}")
    return rnnt_type


def check_int(x: object, name: str) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise InputTypeError(f"{name} must be an int, got {type(x).__name__}")
    return int(x)


def check_termination(termination_symbol: object, C: int) -> int:
    term = check_int(termination_symbol, "termination_symbol")
    if not 0 <= term < C:
        raise InputError(
            f"termination_symbol = {term} is out of range: expected 0 <= termination_symbol "
            f"< C = {C}"
        )
    return term


def check_symbols(symbols: object, B: int, S: int, device: torch.device) -> Tensor:
    if not isinstance(symbols, Tensor):
        raise InputTypeError(f"symbols must be an int64/int32 tensor, got {type(symbols).__name__}")
    if symbols.dtype not in _validate.INDEX_DTYPES:
        raise InputTypeError(f"symbols must be an int32 or int64 tensor, got {symbols.dtype}")
    if tuple(symbols.shape) != (B, S):
        raise InputError(f"symbols must have shape (B, S) = {(B, S)}, got {tuple(symbols.shape)}")
    if symbols.device != device:
        raise InputError(f"symbols is on {symbols.device}, expected {device}")
    return symbols.to(torch.int64)


def check_boundary(boundary: object, B: int, device: torch.device) -> Tensor | None:
    if boundary is None:
        return None
    if not isinstance(boundary, Tensor):
        raise InputTypeError("boundary must be an int64 tensor or None, "
                             f"got {type(boundary).__name__}")
    if boundary.dtype not in _validate.INDEX_DTYPES:
        raise InputTypeError(f"boundary must be an int32 or int64 tensor, got {boundary.dtype}")
    if tuple(boundary.shape) != (B, 4):
        raise InputError(
            "boundary must have shape (B, 4) = "
            f"{(B, 4)} ([begin_symbol, begin_frame, end_symbol, end_frame] per sequence), "
            f"got {tuple(boundary.shape)}"
        )
    if boundary.device != device:
        boundary = boundary.to(device)
    return boundary.to(torch.int64)


def check_same_batch(x: Tensor, name: str, B: int, what: str) -> None:
    if x.shape[0] != B:
        raise InputError(f"{name}.size(0) = {x.shape[0]} must equal the batch size "
                         f"B = {B} ({what})")


def check_scale(x: object, name: str) -> float:
    return _validate.check_float_arg(x, name)


# --------------------------------------------------------------------------- value checks
def _first(bad: np.ndarray) -> int:
    return int(np.argmax(bad))


def _check_boundary_values(s0: np.ndarray, t0: np.ndarray, s1: np.ndarray, t1: np.ndarray,
                           S: int, T: int) -> None:
    """Each ``boundary`` column inside the tensors, and every begin at or before its end."""
    for col, (v, hi, what) in enumerate(
        ((s0, S, "S"), (t0, T, "T"), (s1, S, "S"), (t1, T, "T"))
    ):
        bad = (v < 0) | (v > hi)
        if bad.any():
            b = _first(bad)
            name = ("begin_symbol", "begin_frame", "end_symbol", "end_frame")[col]
            raise InputError(
                f"boundary[{b}, {col}] ({name}) = {int(v[b])} is outside the tensors: "
                f"expected 0 <= {name} <= {what} = {hi}"
            )
    for lo, hi, names in ((s0, s1, ("begin_symbol", "end_symbol", 0, 2)),
                          (t0, t1, ("begin_frame", "end_frame", 1, 3))):
        bad = lo > hi
        if bad.any():
            b = _first(bad)
            raise InputError(
                f"boundary[{b}]: {names[0]} = {int(lo[b])} exceeds {names[1]} = {int(hi[b])}"
            )


def _check_symbols(sh: np.ndarray, s0: np.ndarray, s1: np.ndarray, C: int,
                   termination_symbol: int) -> None:
    """The symbols read (``s0 <= s < s1``) are ids below ``C``, never ``termination_symbol``."""
    pos = np.arange(sh.shape[1])[None, :]
    read = (pos >= s0[:, None]) & (pos < s1[:, None])
    bad = read & ((sh < 0) | (sh >= C))
    if bad.any():
        b, s = np.unravel_index(_first(bad), bad.shape)
        raise InputError(
            f"symbols[{b}, {s}] = {int(sh[b, s])} is out of range: "
            f"expected 0 <= id < C = {C}"
        )
    bad = read & (sh == termination_symbol)
    if bad.any():
        b, s = np.unravel_index(_first(bad), bad.shape)
        raise InputError(
            f"symbols[{b}, {s}] = {int(sh[b, s])} equals termination_symbol; the "
            "symbols may not contain it"
        )


def _check_ranges(rh: np.ndarray, S: int) -> None:
    """``ranges (B, T, s_range)``: consecutive positions, the first in ``0..S + 1 - s_range``."""
    R = rh.shape[2]
    bad = (rh[:, :, 0] < 0) | (rh[:, :, 0] > S + 1 - R)
    if bad.any():
        b, t = np.unravel_index(_first(bad), bad.shape)
        raise InputError(
            f"ranges[{b}, {t}, 0] = {int(rh[b, t, 0])} is out of range: a window of "
            f"s_range = {R} rows must start at 0 <= s <= S + 1 - s_range = {S + 1 - R}"
        )
    bad = (rh != rh[:, :, :1] + np.arange(R)[None, None, :]).any(axis=2)
    if bad.any():
        b, t = np.unravel_index(_first(bad), bad.shape)
        raise InputError(
            f"ranges[{b}, {t}] = {rh[b, t].tolist()} must be consecutive symbol positions "
            "s, s + 1, ..., s + s_range - 1 (as get_rnnt_prune_ranges returns)"
        )


def bounds_impl(
    boundary: Tensor | None,
    symbols: Tensor,
    ranges: Tensor | None,
    T: int,
    C: int,
    termination_symbol: int,
    rnnt_type: str,
    s_range: int,
    validate: bool,
) -> tuple[Tensor, Tensor]:
    """``(bounds (B, 4) = [s_begin, t_begin, U_b, T_b], sym_ext (B, S + 1))``, checked.

    ``s_range`` is the pruned window (0: no window). Raises ``InputError`` naming
    the argument and the batch index.
    """
    B, S = symbols.shape
    device = symbols.device
    if boundary is None:
        bnd = torch.tensor([0, 0, S, T], dtype=torch.int64, device=device).expand(B, 4)
    else:
        bnd = boundary
    if validate and B:
        h = _validate.to_host(bnd)
        s0, t0, s1, t1 = h[:, 0], h[:, 1], h[:, 2], h[:, 3]
        _check_boundary_values(s0, t0, s1, t1, S, T)
        U = s1 - s0
        # (The modified and constrained topologies emit at most one symbol per frame: a
        # sequence with fewer frames than symbols has no path, +inf as any impossible
        # alignment, where k2 asserts.)
        # Too small a window: regular RNN-T and the constrained one need two rows per
        # frame to emit anything (the emission's target row, or its forced blank's).
        if s_range and (rnnt_type != "modified") and s_range < 2:
            bad = U >= 1
            if bad.any():
                b = _first(bad)
                raise InputError(
                    f"s_range = {s_range} is too small for batch item {b} ({int(U[b])} symbols): "
                    f"rnnt_type={rnnt_type!r} needs s_range >= 2 (no path survives pruning)"
                )
        if S:
            _check_symbols(_validate.to_host(symbols), s0, s1, C, termination_symbol)
        if ranges is not None and ranges.numel():
            _check_ranges(_validate.to_host(ranges), S)
    s0_t, t0_t = bnd[:, 0], bnd[:, 1]
    lens = torch.stack((s0_t, t0_t, bnd[:, 2] - s0_t, bnd[:, 3] - t0_t), dim=1)
    pos = torch.arange(S, device=device)[None, :]
    read = (pos >= s0_t[:, None]) & (pos < bnd[:, 2:3])
    sym = torch.where(read, symbols, torch.zeros((), dtype=torch.int64, device=device))
    sym_ext = torch.cat((sym, torch.full((B, 1), termination_symbol, dtype=torch.int64,
                                         device=device)), dim=1)
    return lens.contiguous(), sym_ext


def _bounds_fake(boundary, symbols, ranges, T, C, termination_symbol, rnnt_type, s_range,
                 validate):
    B, S = symbols.shape
    return symbols.new_empty((B, 4)), symbols.new_empty((B, S + 1))


# Not differentiable: the op while compiling, its implementation otherwise (no dispatch cost).
bounds_decl = OpDecl("seqloss::factored_bounds", bounds_impl, _bounds_fake, n_diff=0)
bounds_op = bounds_decl.op
bounds = bounds_decl
