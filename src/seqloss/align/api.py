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
