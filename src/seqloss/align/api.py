"""Forced alignment: the single best (Viterbi) path of CTC and RNN-T.

Not differentiable: the results are computed under ``torch.no_grad`` and carry
no graph. The backends (``seqloss.align.reference``,
``seqloss.align.numba_cpu``, ``seqloss.align.triton_cuda``) do
the same additions in the same dtype, so they agree bit for bit, ties included.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .._core import checks
from .._core.dispatch import kernel_module, resolve_backend
from .._core.errors import InputError
from .._core.types import IntsLike
from ..ctc.checks import ctc_inputs, ctc_values

NAN = float("nan")


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_ctc_feasible(targets: Tensor, input_lengths: Tensor, target_lengths: Tensor) -> None:
    """``InputError`` for a sequence with fewer frames than labels plus repeats."""
    S = targets.shape[1]
    L = target_lengths.to(targets.device)
    if S > 1:
        inside = torch.arange(1, S, device=targets.device)[None, :] < L[:, None]
        repeats = ((targets[:, 1:] == targets[:, :-1]) & inside).sum(1)
    else:
        repeats = torch.zeros_like(L)
    need = (L + repeats).cpu()
    have = input_lengths.cpu()
    bad = (have < need).nonzero()
    if bad.numel():
        b = int(bad[0, 0])
        raise InputError(
            f"input_lengths[{b}] = {int(have[b])} is too short for target_lengths[{b}] = "
            f"{int(L[b])} with {int(need[b] - L[b])} repeated labels: CTC needs at least "
            f"{int(need[b])} frames, so no alignment exists"
        )


@torch.no_grad()
def ctc_align(
    log_probs: Tensor,
    targets: Tensor | Sequence[int] | Sequence[Sequence[int]],
    input_lengths: IntsLike,
    target_lengths: IntsLike,
    blank: int = 0,
    *,
    backend: str = "auto",
    validate: bool = True,
) -> tuple[Tensor, Tensor]:
    r"""Batched CTC forced alignment (Viterbi): always a best path, ties broken by a fixed rule.

    Args:
        log_probs: ``(T, B, C)`` or unbatched ``(T, C)`` log-probabilities
            (float16, bfloat16, float32, float64; any layout). Any real values are
            accepted; ``-inf`` masks a class.
        targets: padded ``(B, S)`` or concatenated 1-D int32/int64 ids (unbatched:
            ``(S,)``), as :func:`seqloss.ctc_loss`. Padding is never read.
        input_lengths: ``(B,)`` frames per sequence, ``<= T`` (tensor or ints).
        target_lengths: ``(B,)`` labels per sequence.
        blank: the blank class, ``0 <= blank < C``.
        backend: ``"auto"``, ``"reference"``, ``"numba"`` or ``"triton"``.
        validate: check lengths, ids and feasibility (a device-to-host sync on
            CUDA); ``False`` skips them at the caller's risk.

    Returns:
        ``(labels, scores)``, each ``(B, T)`` (unbatched: ``(T,)``): the label of
        each frame on the best path (the targets' dtype, as torchaudio's
        ``forced_align``; int64 for Python targets) and its log-probability
        ``log_probs[t, b, labels[b, t]]`` (float64 for float64 input, else
        float32), so ``scores[b].sum()`` is the best path's log-probability.
        Frames ``t >= input_lengths[b]`` hold ``blank`` and ``0``.

    Over the extended labels ``l'`` = (blank, l_1, blank, ..., l_L, blank)::

        delta[0, s] = lp[0, l'_s] for s in {0, 1}, -inf otherwise
        delta[t, s] = lp[t, l'_s] + max(delta[t-1, s], delta[t-1, s-1],
                                        delta[t-1, s-2] if l'_s != blank, l'_s != l'_{s-2})

    The path is always Viterbi-optimal. Ties are broken so: at each state the
    predecessor ``s-2`` is taken only if strictly greater than both others, else
    ``s-1`` if strictly greater than ``s``, else ``s``; the path ends on the last
    label (``2L-1``) unless the final blank is strictly greater. Among the best
    paths that is the one whose states, read backwards from the end, are largest
    (each label entered as early as it can be).

    ``torchaudio.functional.forced_align`` (2.9) states the same rule but is not
    always optimal: on ``lp = [[-2, 0, 0], [-2, 0, -1], [0, 0, -1], [-1, -1, 0]]``
    with targets ``[1, 2]`` it returns ``[1, 1, 2, 2]`` (score -1) where the best
    path is ``[1, 1, 0, 2]`` (score 0, returned here), and in float16 it picks paths
    that score lower than others when summed in float64. The two agree wherever
    torchaudio's path is optimal and unique; seqloss keeps the optimum.

    Special cases:
        - Too few frames for the labels and their repeats: no alignment exists,
          so ``InputError`` naming the batch index (``validate=False``: that
          sequence gets ``blank`` and ``-inf`` on its frames).
        - Every path has probability zero (``-inf`` log-probs): ``blank`` and
          ``-inf`` on the sequence's frames.
        - NaN or ``+inf`` anywhere in a read frame (any class): ``blank`` and NaN
          on that sequence's frames; the other sequences are unaffected.

    Backends: reference (any device), numba (CPU), triton (CUDA).
    Properties: no autograd (results are detached), deterministic.
    """
    blank = checks.int_arg(blank, "blank")
    validate = checks.flag(validate, "validate")
    lp, tg, il, tl, unbatched = ctc_inputs(
        log_probs, targets, input_lengths, target_lengths, blank
    )
    T, B, C = lp.shape
    name = resolve_backend(backend, lp.device)
    padded = ctc_values(tg, il, tl, T, C, blank, validate=validate)
    if validate:
        _check_ctc_feasible(padded, il, tl)
    labels, scores = kernel_module("align", name).ctc_align_forward(lp, padded, il, tl, blank)
    if T and B:
        # NaN or +inf in a read frame, whatever the class: amax propagates NaN.
        frame_bad = ~(lp.amax(dim=-1) < float("inf")).transpose(0, 1)  # (B, T)
        valid = torch.arange(T, device=lp.device)[None, :] < il[:, None]
        bad = (frame_bad & valid).any(dim=1, keepdim=True) & valid
        labels = torch.where(bad, blank, labels)
        scores = torch.where(bad, NAN, scores)
    # torchaudio's forced_align returns labels in the targets' dtype.
    if isinstance(targets, Tensor) and targets.dtype != labels.dtype:
        labels = labels.to(targets.dtype)
    if unbatched:
        return labels[0], scores[0]
    return labels, scores


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
    r"""Batched RNN-T forced alignment: the best (Viterbi) path through the lattice.

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
        input, else float32).

    From node ``(t, u)`` a blank leads to ``(t+1, u)`` and emitting ``y_{u+1}``
    to ``(t, u+1)``; the path starts at ``(0, 0)`` and ends with the blank out of
    ``(T_b-1, U_b)``::

        delta[0, 0] = 0
        delta[t, u] = max(delta[t-1, u] + lp[t-1, u, blank],
                          delta[t, u-1] + lp[t, u-1, y_u])
        score = delta[T_b-1, U_b] + lp[T_b-1, U_b, blank]

    Tie-break (deterministic): at every node the emission arc is taken only if
    strictly greater than the blank arc. As in CTC's ``forced_align``, where
    staying wins ties, a tied token is placed at the earliest frame that the
    best path allows.

    Special cases:
        - A sequence with zero frames has no path: ``InputError`` naming the
          batch index (``validate=False``: frames ``-1``, score ``-inf``).
        - Every path has probability zero: frames ``-1``, score ``-inf``.
        - NaN or ``+inf`` in a read logit (``t < T_b``, ``u <= U_b``, any class),
          or a read row whose log-softmax is undefined (all ``-inf``): frames
          ``-1``, score NaN for that sequence only.

    Backends: reference (any device), numba (CPU), triton (CUDA).
    Properties: no autograd (results are detached), deterministic.
    """
    checks.check_float_tensor(logits, "logits")
    checks.check_ndim(logits, "logits", (4,), "(B, T, U+1, V)")
    B, T, U1, V = logits.shape
    device = logits.device
    tg = checks.check_padded_targets(checks.as_targets_tensor(targets, device), B)
    il = checks.as_index_tensor(logit_lengths, "logit_lengths", device)
    tl = checks.as_index_tensor(target_lengths, "target_lengths", device)
    il = checks.check_batch(il, "logit_lengths", B)
    tl = checks.check_batch(tl, "target_lengths", B)
    blank = checks.int_arg(blank, "blank")
    fused_log_softmax = checks.flag(fused_log_softmax, "fused_log_softmax")
    validate = checks.flag(validate, "validate")
    if V == 0 or U1 == 0:
        raise InputError(f"logits must have U+1 >= 1 and V >= 1, got shape {tuple(logits.shape)}")
    if not -V <= blank < V:
        raise InputError(f"blank = {blank} is out of range: expected -V <= blank < V = {V}")
    blank = blank % V
    S = tg.shape[1]
    Um = min(S, U1 - 1)
    name = resolve_backend(backend, device)
    if validate:
        checks.check_lengths(il, "logit_lengths", T, "logits.size(1) (T)")
        upper_what = "targets.size(1)" if S <= U1 - 1 else "logits.size(2) - 1 (U)"
        tlh = checks.check_lengths(tl, "target_lengths", Um, upper_what)
        checks.check_ids(tg, tlh, "targets", V, blank)
        zero = (il.cpu() == 0).nonzero()
        if zero.numel():
            b = int(zero[0, 0])
            raise InputError(
                f"logit_lengths[{b}] = 0: a transducer path needs at least one frame, "
                f"so no alignment exists"
            )

    acc = _acc_dtype(logits.dtype)
    x = logits[:, :, : Um + 1]
    read_u = torch.arange(Um, device=device)[None, :] < tl[:, None]
    ids = torch.where(read_u, tg[:, :Um], torch.zeros_like(tg[:, :Um]))
    blank_lp = x[..., blank].to(acc)
    emit_lp = x[:, :, :Um].gather(3, ids[:, None, :, None].expand(B, T, Um, 1)).squeeze(3).to(acc)
    if fused_log_softmax and T:
        lse = torch.logsumexp(x.to(acc), dim=-1)
        blank_lp = blank_lp - lse
        emit_lp = emit_lp - lse[:, :, :Um]
    frames, scores = kernel_module("align", name).rnnt_align_forward(blank_lp, emit_lp, il, tl)

    if T and B:
        # The read region: t < T_b and u <= U_b (emissions: u < U_b), every class.
        t_ok = torch.arange(T, device=device)[None, :, None] < il[:, None, None]
        u_ok = torch.arange(Um + 1, device=device)[None, None, :] <= tl[:, None, None]
        region = t_ok & u_ok
        row_bad = ~(x.amax(dim=-1) < float("inf")) | torch.isnan(blank_lp)
        row_bad[:, :, :Um] |= torch.isnan(emit_lp) & read_u[:, None, :]
        bad = (row_bad & region).flatten(1).any(dim=1)
        frames = torch.where(bad[:, None], -1, frames)
        scores = torch.where(bad, NAN, scores)
    if Um < S:
        frames = torch.cat([frames, frames.new_full((B, S - Um), -1)], dim=1)
    return frames, scores
