"""CTC Viterbi forced alignment in pure PyTorch (the transducers' is the lattice's).

Vectorized over the batch and the states; loops over frames in Python, so slow
for long inputs but simple. Works on any
device. The arithmetic is the same as the Numba and Triton kernels' (one
addition per arc, exact maxima, float32 for float32 input), so all backends
give bit-identical alignments, ties included.
"""

from __future__ import annotations

import torch

from ..ctc.reference import extended_emissions

NEG_INF = float("-inf")


def _shift_right(x: torch.Tensor, k: int) -> torch.Tensor:
    """``y[..., s] = x[..., s - k]``, ``-inf`` where ``s < k``."""
    if x.shape[-1] <= k:
        return torch.full_like(x, NEG_INF)
    return torch.cat([torch.full_like(x[..., :k], NEG_INF), x[..., :-k]], dim=-1)


def ctc_align_forward(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched CTC Viterbi alignment with torchaudio's ``forced_align`` tie-breaking.

    Args:
        log_probs: ``(T, B, C)`` float, any layout.
        targets: ``(B, S)`` int64, padding entries already replaced by valid ids.
        input_lengths, target_lengths: ``(B,)`` int64, validated.
        blank: blank index in ``[0, C)``.

    Returns:
        ``labels (B, T)`` int64 and ``scores (B, T)`` (float64 for float64 input,
        else float32): the chosen label and its log-probability per frame; frames
        ``t >= input_lengths[b]`` hold ``blank`` and 0. A sequence with no path of
        nonzero probability gets ``blank`` and ``-inf`` on every frame it has.

    Over the extended labels ``l'`` (blank, l_1, blank, ..., l_L, blank)::

        delta[0, s] = e[0, s] for s < 2,  -inf otherwise
        delta[t, s] = e[t, s] + max(delta[t-1, s], delta[t-1, s-1],
                                    delta[t-1, s-2] if l'_s != blank, l'_s != l'_{s-2})

    The backpointer prefers ``s-2`` only if strictly greater than both others,
    then ``s-1`` if strictly greater than ``s``, else ``s``; the path ends in
    ``2L-1`` unless ``delta[T_b-1, 2L]`` is strictly greater.
    """
    T, B = log_probs.shape[:2]
    device = log_probs.device
    acc = torch.float64 if log_probs.dtype == torch.float64 else torch.float32
    labels = torch.full((B, T), blank, dtype=torch.int64, device=device)
    scores = torch.zeros((B, T), dtype=acc, device=device)
    if T == 0 or B == 0:
        return labels, scores
    L = target_lengths.to(device)
    Tb = input_lengths.to(device)
    ext, e, skip = extended_emissions(log_probs, targets, L, Tb, blank, 0.0)
    e = e.to(acc)
    delta, bp = _viterbi(e, skip, Tb)
    return _backtrack(delta, bp, ext, e, L, Tb, labels, scores, blank)


def _viterbi(e: torch.Tensor, skip: torch.Tensor, Tb: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``delta (B, K)`` at each sequence's last frame and the backpointers ``bp (T, B, K)``
    int8: how many states back (0, 1, 2) the best predecessor of ``(t, s)`` is."""
    T, B, K = e.shape
    device = e.device
    neg = torch.full((B, K), NEG_INF, dtype=e.dtype, device=device)
    delta = neg.clone()
    delta[:, : min(2, K)] = e[0, :, : min(2, K)]
    bp = torch.zeros((T, B, K), dtype=torch.int8, device=device)
    one, two = (torch.ones((), dtype=torch.int8, device=device),
                torch.full((), 2, dtype=torch.int8, device=device))
    for t in range(1, T):
        x0 = delta
        x1 = _shift_right(delta, 1)
        x2 = torch.where(skip, _shift_right(delta, 2), neg)
        take2 = (x2 > x1) & (x2 > x0)
        take1 = ~take2 & (x1 > x0)
        best = torch.where(take2, x2, torch.where(take1, x1, x0))
        bp[t] = torch.where(take2, two, torch.where(take1, one, torch.zeros_like(one)))
        delta = torch.where((t < Tb)[:, None], best + e[t], delta)
    return delta, bp


def _backtrack(delta: torch.Tensor, bp: torch.Tensor, ext: torch.Tensor, e: torch.Tensor,
               L: torch.Tensor, Tb: torch.Tensor, labels: torch.Tensor, scores: torch.Tensor,
               blank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fill ``labels``/``scores (B, T)`` along the best path from the end state back;
    ``blank``/``-inf`` on the frames of a sequence without a finite path."""
    T, B = e.shape[:2]
    device = e.device
    bidx = torch.arange(B, device=device)
    last_label = delta[bidx, (2 * L - 1).clamp(min=0)]
    last_blank = delta[bidx, 2 * L]
    end_blank = (L == 0) | (last_blank > last_label)
    s = torch.where(end_blank, 2 * L, 2 * L - 1)
    found = torch.where(end_blank, last_blank, last_label) > NEG_INF
    for t in range(T - 1, -1, -1):
        active = t < Tb
        labels[:, t] = torch.where(active, ext[bidx, s], blank)
        scores[:, t] = torch.where(active, e[t, bidx, s], 0.0)
        s = torch.where(active, s - bp[t, bidx, s].long(), s)
    valid = torch.arange(T, device=device)[None, :] < Tb[:, None]
    none = valid & ~found[:, None]
    labels = torch.where(none, blank, labels)
    scores = torch.where(none, NEG_INF, scores)
    return labels, scores
