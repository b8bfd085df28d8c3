"""CTC forced alignment: the single best (Viterbi) path.

Not differentiable: the results are computed under ``torch.no_grad`` and carry
no graph. The backends (``seqloss.align.reference``,
``seqloss.align.numba_cpu``, ``seqloss.align.triton_cuda``) do
the same additions in the same dtype, so they agree bit for bit, ties included.
The transducers' alignments (``transducer.py``) are the lattice's max-plus semiring.
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


def _full_extents(lp: Tensor, tg: Tensor, il: object, tl: object) -> tuple[object, object]:
    """Omitted lengths as torchaudio's ``forced_align`` takes them: every frame, every id."""
    if lp.dim() == 2:  # unbatched (T, C), targets (S,)
        return (lp.shape[0] if il is None else il), (tg.numel() if tl is None else tl)
    if lp.dim() != 3:
        return il, tl  # ctc_inputs names the shape
    T, B = lp.shape[:2]
    if il is None:
        il = torch.full((B,), T, dtype=torch.int64, device=lp.device)
    if tl is None:
        if tg.dim() == 2:  # a batch mismatch is then reported on the targets
            tl = torch.full((B,), tg.shape[1], dtype=torch.int64, device=lp.device)
        elif tg.dim() == 1 and B == 1:
            tl = [tg.numel()]
        elif tg.dim() == 1:
            raise InputError(f"target_lengths is required with concatenated 1-D targets and "
                             f"B = {B} sequences (where each sequence ends is not known)")
    return il, tl


def _ctc_align_inputs(log_probs: Tensor, targets: object, input_lengths: object,
                      target_lengths: object, blank: int, batch_first: bool, validate: bool
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor, bool]:
    """Checked ``(log_probs (T, B, C), padded targets, input_lengths, target_lengths,
    unbatched)``, 3-D ``log_probs`` read as ``(B, T, C)`` when ``batch_first``."""
    checks.check_float_tensor(log_probs, "log_probs")
    if batch_first and log_probs.dim() == 3:
        log_probs = log_probs.transpose(0, 1)
    if input_lengths is None or target_lengths is None:
        targets = checks.as_targets_tensor(targets, log_probs.device)
        input_lengths, target_lengths = _full_extents(log_probs, targets, input_lengths,
                                                      target_lengths)
    lp, tg, il, tl, unbatched = ctc_inputs(log_probs, targets, input_lengths, target_lengths,
                                           blank)
    padded = ctc_values(tg, il, tl, lp.shape[0], lp.shape[2], blank, validate=validate)
    if validate:
        _check_ctc_feasible(padded, il, tl)
    return lp, padded, il, tl, unbatched


def _layout_hint(log_probs: object, targets: object, input_lengths: object,
                 target_lengths: object, blank: int, batch_first: bool, validate: bool
                 ) -> str | None:
    """What to say when the arguments fail in the layout asked for but pass in the other."""
    if not isinstance(log_probs, Tensor) or log_probs.dim() != 3:
        return None
    try:
        _ctc_align_inputs(log_probs, targets, input_lengths, target_lengths, blank,
                          not batch_first, validate)
    except (InputError, TypeError):
        return None
    shape = tuple(log_probs.shape)
    if batch_first:
        return (f"log_probs {shape} was read as (B, T, C) (batch_first=True), and the "
                f"arguments fit it read as (T, B, C): for time-first log_probs, as ctc_loss "
                f"takes them, pass batch_first=False")
    return (f"log_probs {shape} was read as (T, B, C) (batch_first=False), and the arguments "
            f"fit it read as (B, T, C): for batch-first log_probs, as torchaudio's "
            f"forced_align takes them ((1, T, C)), pass batch_first=True")


def _ctc_align_args(log_probs: object, targets: object, input_lengths: object,
                    target_lengths: object, blank: object, batch_first: object,
                    validate: object) -> tuple[int, Tensor, Tensor, Tensor, Tensor, bool]:
    """``(blank, *_ctc_align_inputs(...))`` from ``ctc_align``'s arguments, an
    ``InputError`` extended with the layout hint when the other layout fits."""
    blank = checks.int_arg(blank, "blank")
    validate = checks.flag(validate, "validate")
    batch_first = checks.flag(batch_first, "batch_first")
    try:
        return (blank, *_ctc_align_inputs(log_probs, targets, input_lengths, target_lengths,
                                          blank, batch_first, validate))
    except InputError as e:
        hint = _layout_hint(log_probs, targets, input_lengths, target_lengths, blank,
                            batch_first, validate)
        if hint is None:
            raise
        raise InputError(f"{e}; {hint}") from e


def _poison_bad_frames(lp: Tensor, il: Tensor, labels: Tensor, scores: Tensor, blank: int
                       ) -> tuple[Tensor, Tensor]:
    """``blank`` and NaN on every frame of a sequence with NaN or ``+inf`` in a read
    frame, whatever the class (the kernels compare only the path's classes)."""
    T, B, _ = lp.shape
    if not (T and B):
        return labels, scores
    # amax propagates NaN.
    frame_bad = ~(lp.amax(dim=-1) < float("inf")).transpose(0, 1)  # (B, T)
    valid = torch.arange(T, device=lp.device)[None, :] < il[:, None]
    bad = (frame_bad & valid).any(dim=1, keepdim=True) & valid
    return torch.where(bad, blank, labels), torch.where(bad, NAN, scores)


def _as_returned(labels: Tensor, scores: Tensor, targets: object, unbatched: bool
                 ) -> tuple[Tensor, Tensor]:
    """``(labels, scores)`` as returned: labels in the targets' dtype, ``(T,)`` unbatched."""
    # torchaudio's forced_align returns labels in the targets' dtype.
    if isinstance(targets, Tensor) and targets.dtype != labels.dtype:
        labels = labels.to(targets.dtype)
    if unbatched:
        return labels[0], scores[0]
    return labels, scores


@torch.no_grad()
def ctc_align(
    log_probs: Tensor,
    targets: Tensor | Sequence[int] | Sequence[Sequence[int]],
    input_lengths: IntsLike | None = None,
    target_lengths: IntsLike | None = None,
    blank: int = 0,
    *,
    batch_first: bool = False,
    backend: str = "auto",
    validate: bool = True,
) -> tuple[Tensor, Tensor]:
    r"""Batched CTC forced alignment (Viterbi): always a best path, ties broken by a fixed rule.

    Args:
        log_probs: ``(T, B, C)`` (``(B, T, C)`` with ``batch_first=True``) or
            unbatched ``(T, C)`` log-probabilities (float16, bfloat16, float32,
            float64; any strides). Any real values are accepted; ``-inf`` masks a class.
        targets: padded ``(B, S)`` or concatenated 1-D int32/int64 ids (unbatched:
            ``(S,)``), as :func:`seqloss.ctc_loss`. Padding is never read.
        input_lengths: ``(B,)`` frames per sequence, ``<= T`` (tensor or ints);
            omitted: ``T`` each.
        target_lengths: ``(B,)`` labels per sequence; omitted: every id (``S`` each
            for padded targets; concatenated 1-D targets need them when ``B > 1``).
        blank: the blank class, ``0 <= blank < C``.
        batch_first: read 3-D ``log_probs`` as ``(B, T, C)``, torchaudio's
            ``forced_align`` layout (``(1, T, C)`` there); ignored for ``(T, C)``. The
            layout is never guessed: when ``B == T`` both readings fit and this flag
            alone decides; when the arguments fit only the other reading, the
            ``InputError`` says so.
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
    blank, lp, padded, il, tl, unbatched = _ctc_align_args(
        log_probs, targets, input_lengths, target_lengths, blank, batch_first, validate)
    name = resolve_backend(backend, lp.device)
    labels, scores = kernel_module("align", name).ctc_align_forward(lp, padded, il, tl, blank)
    labels, scores = _poison_bad_frames(lp, il, labels, scores, blank)
    return _as_returned(labels, scores, targets, unbatched)
