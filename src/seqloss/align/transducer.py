r"""Transducer forced alignment: the lattice in the max-plus semiring.

``rnnt_align``, ``multiblank_rnnt_align`` and ``tdt_align`` are one function on a
``JointTable`` (``seqloss.transducer.joint.table``, the losses' tables with
``sigma = 0``): the losses' prologue (log-softmax of the token logits, and of the
duration logits for TDT; the arc scores read off them), then the lattice's Viterbi
recursion (``transducer_viterbi`` of ``seqloss.transducer.lattice``, every backend),
which returns each token's emission frame and emission arc. Not differentiable: the
results carry no graph.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .._core import checks
from .._core.dispatch import resolve_backend
from .._core.errors import InputError
from .._core.logspace import sub_normalizer
from .._core.types import IntsLike
from ..transducer.checks import transducer_inputs, transducer_values
from ..transducer.joint.table import JointTable, multiblank_table, rnnt_table, tdt_table
from ..transducer.lattice.api import lattice_viterbi
from ..transducer.multiblank import check_big_blanks
from ..transducer.tdt import _split, check_tdt_durations

NEG_INF = float("-inf")
NAN = float("nan")


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _region(il: Tensor, tl: Tensor, T: int, U1: int) -> Tensor:
    """``(B, T, U1)``: the states a sequence reads, ``t < T_b`` and ``u <= U_b``."""
    tt = torch.arange(T, device=il.device)[None, :, None]
    uu = torch.arange(U1, device=il.device)[None, None, :]
    return (tt < il[:, None, None]) & (uu <= tl[:, None, None])


def _row_lse_torch(x: Tensor) -> Tensor:
    """``log sum exp`` over the last axis in ``x``'s dtype (a row of ``-inf`` gives
    ``-inf``; NaN in a row gives NaN)."""
    return torch.logsumexp(x, -1)


def _row_lse_numba(x: Tensor, il: Tensor, tl: Tensor) -> tuple[Tensor, Tensor]:
    """``_row_lse_torch`` on the region read (elsewhere 0), by the losses' Numba row
    prologue (``joint.numba_rows``: one read of each row, a vectorized ``exp``), and per
    sequence whether a read row holds NaN or ``+inf``."""
    from ..transducer.joint.numba_rows import RowPasses

    B, T, U1, V = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    rm = torch.zeros((B, T, U1), dtype=x.dtype)
    rs = torch.ones((B, T, U1), dtype=x.dtype)
    bad = RowPasses(x, il.tolist(), tl.tolist(), [0] * B, V, rm, rs).prologue()
    return rm + torch.log(rs), torch.from_numpy(bad)  # a row of -inf: shift 0, sum 0


def _log_softmax(x: Tensor, lse: Tensor) -> Tensor:
    """``x - lse``; a row of ``-inf`` logits (``lse = -inf``) gives ``-inf`` arcs, as the
    losses do, not ``-inf - -inf`` (``_core/logspace.py``'s rule)."""
    return sub_normalizer(x, lse[..., None])


def _nonfinite(x: Tensor, region: Tensor) -> Tensor:
    """Per sequence: NaN or ``+inf`` in a read row (``amax`` propagates NaN)."""
    return (~(x.amax(-1) < float("inf")) & region).flatten(1).any(1)


def _arc_scores(tok: Tensor, dur: Tensor | None, tg: Tensor, il: Tensor, tl: Tensor,
                table: JointTable, fused: bool, backend: str) -> tuple[Tensor, Tensor, Tensor]:
    """``(arc_blank, arc_emit, bad)``: the arcs of ``table`` on ``tok (B, T, U+1, V)`` (and
    the duration block ``dur``), in float32 (float64 for float64 input), and per
    sequence whether its read region holds NaN or ``+inf`` (any class)."""
    acc = _acc(tok.dtype)
    B, T, U1, _ = tok.shape
    U = U1 - 1
    x = tok if tok.dtype == acc else tok.to(acc)
    region = _region(il, tl, T, U1)
    if fused and backend == "numba" and x.device.type == "cpu":
        lse, bad = _row_lse_numba(x, il, tl)
    else:
        bad = _nonfinite(x, region)
        lse = _row_lse_torch(x) if fused else None
    cls = torch.tensor(table.blank_tokens, device=x.device)
    lp_b = x.index_select(3, cls)
    ids = tg[:, None, :U, None].expand(B, T, U, 1)
    lp_y = torch.cat([x[:, :, :U].gather(3, ids), x.new_full((B, T, 1, 1), NEG_INF)], 2)
    if lse is not None:
        lp_b, lp_y = _log_softmax(lp_b, lse), _log_softmax(lp_y, lse)
    if dur is None:
        return lp_b, lp_y.expand(B, T, U1, len(table.emit_arcs)), bad
    d = dur if dur.dtype == acc else dur.to(acc)
    bad |= _nonfinite(d, region)
    if fused:
        d = _log_softmax(d, _row_lse_torch(d))
    arc_blank = torch.stack([lp_b[..., i] + d[..., a.duration_logit]
                             for i, a in enumerate(table.blank_arcs)], -1)
    arc_emit = torch.stack([lp_y[..., 0] + d[..., a.duration_logit] for a in table.emit_arcs], -1)
    return arc_blank, arc_emit, bad


def _table_align(tok: Tensor, dur: Tensor | None, targets: Tensor, il: Tensor, tl: Tensor,
                 table: JointTable, fused: bool, backend: str, validate: bool,
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """``(frames (B, S), emission arc (B, S), score (B,))`` of ``table``'s best paths."""
    B, T, U1, _ = tok.shape
    S = targets.shape[1]
    if U1 == 0:
        raise InputError(f"logits must have U+1 >= 1, got shape {tuple(tok.shape)}")
    tg = transducer_values(tok, targets, il, tl, table.blank_tokens, validate=validate,
                           num_tokens=table.num_tokens)
    if validate and B:
        zero = (il.cpu() == 0).nonzero()
        if zero.numel():
            b = int(zero[0, 0])
            raise InputError(f"logit_lengths[{b}] = 0: a transducer path needs at least one "
                             f"frame, so no alignment exists")
    Um = min(S, U1 - 1)
    if Um < tg.shape[1]:
        tg = tg[:, :Um]
    if Um > tg.shape[1]:  # no target reads past S (validated, or the caller's risk)
        tg = torch.cat([tg, tg.new_zeros((B, Um - tg.shape[1]))], 1)
    tok = tok[:, :, : Um + 1]
    dur = None if dur is None else dur[:, :, : Um + 1]
    acc = _acc(tok.dtype)
    frames = torch.full((B, S), -1, dtype=torch.int64, device=tok.device)
    arcs = torch.full((B, S), -1, dtype=torch.int64, device=tok.device)
    if T == 0 or B == 0:
        return frames, arcs, torch.full((B,), NEG_INF, dtype=acc, device=tok.device)
    ab, ae, bad = _arc_scores(tok, dur, tg.to(tok.device), il, tl, table, fused, backend)
    score, fr, ar = lattice_viterbi(ab, ae, il, tl, table.blank_durations, table.emit_durations,
                                    table.emit_can_end, backend)
    bad = bad.to(score.device)
    frames[:, :Um] = torch.where(bad[:, None], -1, fr)
    arcs[:, :Um] = torch.where(bad[:, None], -1, ar)
    return frames, arcs, torch.where(bad, NAN, score).to(acc)


def _lengths(logits: Tensor, targets: object, logit_lengths: IntsLike, target_lengths: IntsLike,
             blank: int) -> tuple[Tensor, Tensor, Tensor, int]:
    return transducer_inputs(logits, targets, logit_lengths, target_lengths, blank, packed=False)


_SPECIAL = """
    Tie-break (deterministic): at every state, among the incoming arcs that reach the
    maximum, the one leaving the earliest frame (the longest duration) wins, and a
    blank-like arc beats an emission leaving the same frame. Read backwards from the
    end, the path taken is, among the best ones, the one whose states come earliest in
    ``t`` (then latest in ``u``) where best paths part.

    Special cases:
        - A sequence with zero frames has no path: ``InputError`` naming the batch
          index (``validate=False``: frames ``-1``, score ``-inf``). With ``T_b >= 1``
          a path always exists.
        - Every path has probability zero (``-inf`` log-probabilities): frames ``-1``,
          score ``-inf``. A row of ``-inf`` logits is a state with no way out (the
          losses' guarded log-softmax), not an error.
        - NaN or ``+inf`` in a read logit (``t < T_b``, ``u <= U_b``, any class): frames
          ``-1``, score NaN for that sequence only. Padding is never read.

    Backends: reference (any device), numba (CPU), triton (CUDA). On log-probabilities
    (``fused_log_softmax=False``) every backend gives the same bits; with the fused
    log-softmax the Numba backend's row normalizers (the losses' Numba prologue) may
    differ from the others' in the last bits.
    Properties: no autograd (results are detached), deterministic.
"""


@torch.no_grad()
def rnnt_align(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: IntsLike,
    target_lengths: IntsLike,
    blank: int = -1,
    *,
    fused_log_softmax: bool = True,
    backend: str = "auto",
    validate: bool = True,
) -> tuple[Tensor, Tensor]:
    tg, il, tl, blank = _lengths(logits, targets, logit_lengths, target_lengths, blank)
    fused = checks.flag(fused_log_softmax, "fused_log_softmax")
    validate = checks.flag(validate, "validate")
    name = resolve_backend(backend, logits.device)
    table = rnnt_table(logits.shape[-1], blank)
    frames, _, score = _table_align(logits, None, tg, il, tl, table, fused, name, validate)
    return frames, score


rnnt_align.__doc__ = r"""Batched RNN-T forced alignment: the best (Viterbi) path of the lattice.

    Args:
        logits: ``(B, T, U+1, V)`` joint logits (float16, bfloat16, float32,
            float64; any layout), as :func:`torchaudio.functional.rnnt_loss`;
            may be padded beyond the longest sequence in ``T`` and ``U``.
            With ``fused_log_softmax=False``: log-probabilities.
        targets: ``(B, S)`` int32/int64 ids; entries past a target length are
            padding, never read.
        logit_lengths: ``(B,)`` frames per sequence, ``<= T``.
        target_lengths: ``(B,)`` tokens per sequence, ``<= min(S, U)``.
        blank: the blank index; negative values count from the end (``-1``: ``V-1``).
        fused_log_softmax: take the log-softmax over ``V`` inside.
        backend: ``"auto"``, ``"reference"``, ``"numba"`` or ``"triton"``.
        validate: check lengths and ids (a device-to-host sync on CUDA).

    Returns:
        ``(frames, scores)``: ``frames (B, S)`` int64, the frame at which each
        token is emitted on the best path (``-1`` past ``target_lengths[b]``);
        ``scores (B,)``, the best path's log-probability (float64 for float64
        input, else float32; accumulated in float64).

    From node ``(t, u)`` a blank leads to ``(t+1, u)`` and emitting ``y_{u+1}``
    to ``(t, u+1)``; the path starts at ``(0, 0)`` and ends with the blank out of
    ``(T_b-1, U_b)``::

        delta[0, 0] = 0
        delta[t, u] = max(delta[t-1, u] + lp[t-1, u, blank],
                          delta[t, u-1] + lp[t, u-1, y_u])
        score = delta[T_b-1, U_b] + lp[T_b-1, U_b, blank]

    The blank arc wins ties (the rule below): as in CTC's ``forced_align``, where
    staying wins ties, a tied token is placed at the earliest frame that the best
    path allows. The lattice's max-plus semiring (``transducer_viterbi``).
""" + _SPECIAL


@torch.no_grad()
def multiblank_rnnt_align(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: IntsLike,
    target_lengths: IntsLike,
    big_blank_durations: list[int] | tuple[int, ...],
    blank: int = -1,
    *,
    fused_log_softmax: bool = True,
    backend: str = "auto",
    validate: bool = True,
) -> tuple[Tensor, Tensor]:
    tg, il, tl, blank = _lengths(logits, targets, logit_lengths, target_lengths, blank)
    fused = checks.flag(fused_log_softmax, "fused_log_softmax")
    validate = checks.flag(validate, "validate")
    durs = check_big_blanks(big_blank_durations, blank, logits.shape[-1])
    name = resolve_backend(backend, logits.device)
    table = multiblank_table(logits.shape[-1], blank, durs)
    frames, _, score = _table_align(logits, None, tg, il, tl, table, fused, name, validate)
    return frames, score


multiblank_rnnt_align.__doc__ = r"""Batched multi-blank RNN-T forced alignment (Viterbi).

    Args:
        logits: ``(B, T, U+1, V)`` joint logits as :func:`seqloss.multiblank_rnnt_loss`
            takes them (any float dtype and layout; log-probabilities with
            ``fused_log_softmax=False``).
        targets: ``(B, S)`` int32/int64 labels; entries past a target length are
            padding, never read. A label equal to a blank-like class is an error.
        logit_lengths: ``(B,)`` frames ``T_b <= T``.
        target_lengths: ``(B,)`` labels ``U_b <= min(S, U)``.
        big_blank_durations: the big blanks' frame advances, each ``> 1``, distinct;
            big blank ``i`` is class ``blank - 1 - i``.
        blank: the standard blank (one frame); ``-1`` (default) is ``V - 1``.
        fused_log_softmax, backend, validate: as :func:`rnnt_align`.

    Returns:
        ``(frames, scores)`` as :func:`rnnt_align`: the frame at which each token is
        emitted on the best path ``(B, S)`` (``-1`` past ``target_lengths[b]``) and
        the path's log-probability ``(B,)``.

    The lattice of :func:`seqloss.multiblank_rnnt_loss` (``sigma = 0``): from
    ``(t, u)`` the standard blank goes to ``(t + 1, u)``, big blank ``i`` to
    ``(t + d_i, u)`` (when ``t + d_i <= T_b``), a label to ``(t, u + 1)``; the path
    ends at ``(T_b, U_b)`` on a blank-like arc. By the rule below a big blank wins a
    tie against shorter blanks (it leaves an earlier frame).
""" + _SPECIAL


@torch.no_grad()
def tdt_align(
    logits: Tensor | tuple[Tensor, Tensor],
    targets: Tensor,
    logit_lengths: IntsLike,
    target_lengths: IntsLike,
    durations: list[int] | tuple[int, ...],
    blank: int = -1,
    *,
    fused_log_softmax: bool = True,
    backend: str = "auto",
    validate: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    durs = check_tdt_durations(durations)
    _, tok, dur = _split(logits, len(durs))
    V = tok.shape[-1]
    tg, il, tl, blank = _lengths(tok, targets, logit_lengths, target_lengths, blank)
    fused = checks.flag(fused_log_softmax, "fused_log_softmax")
    validate = checks.flag(validate, "validate")
    name = resolve_backend(backend, tok.device)
    table = tdt_table(V, blank, durs)
    frames, arcs, score = _table_align(tok, dur, tg, il, tl, table, fused, name, validate)
    # Emission arc j of TDT's table takes durations[j] frames.
    taken = torch.tensor(np.asarray(table.emit_durations), device=arcs.device)[arcs.clamp(min=0)]
    return frames, torch.where(arcs >= 0, taken, -1), score


tdt_align.__doc__ = r"""Batched Token-and-Duration Transducer forced alignment (Viterbi).

    Args:
        logits: the joint ``(B, T, U+1, V + D)`` (token logits, then the
            ``D = len(durations)`` duration logits) or the pair ``(token_logits
            (B, T, U+1, V), duration_logits (B, T, U+1, D))``, as
            :func:`seqloss.tdt_loss` takes them (any float dtype and layout;
            log-probabilities per block with ``fused_log_softmax=False``).
        targets: ``(B, S)`` int32/int64 labels in ``[0, V)``, never the blank;
            entries past a target length are padding, never read.
        logit_lengths: ``(B,)`` frames ``T_b <= T``.
        target_lengths: ``(B,)`` labels ``U_b <= min(S, U)``.
        durations: the frame advances of the duration logits, ascending, distinct,
            containing 0 and 1.
        blank: the blank among the token logits; ``-1`` (default) is ``V - 1``.
        fused_log_softmax, backend, validate: as :func:`rnnt_align` (the log-softmax
            is taken over each block).

    Returns:
        ``(frames, durations, scores)``: ``frames (B, S)`` int64, the frame at which
        each token is emitted on the best path; ``durations (B, S)`` int64, the
        duration taken with it (the frames the path advances after emitting it); both
        ``-1`` past ``target_lengths[b]`` (and wherever the cases below give frames
        ``-1``); ``scores (B,)``, the path's log-probability (token and duration
        log-probabilities summed).

    The lattice of :func:`seqloss.tdt_loss` (``sigma = 0``): from ``(t, u)`` a blank
    with duration ``d >= 1`` goes to ``(t + d, u)`` (when ``t + d <= T_b``), the label
    ``y_{u+1}`` with duration ``e >= 0`` to ``(t + e, u + 1)`` (when ``t + e < T_b``);
    the path ends on a blank landing exactly on ``T_b``. By the rule below, longer
    durations win ties.
""" + _SPECIAL
