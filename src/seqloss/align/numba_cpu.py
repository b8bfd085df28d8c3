"""CTC Viterbi forced alignment with Numba on CPU, parallel over the batch.

One GIL-free function per sequence, run on the shared thread pool
(:func:`seqloss._core.numba_pool.run_jobs`: fork-safe, the same result whatever the thread count).

Max-plus in log space: one addition per arc and exact comparisons, no ``exp``,
in the accumulation dtype (float32, or float64 for float64 input), so the
results equal the reference backend's bit for bit.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from .._core.numba_pool import CELL, own_lines, run_jobs


@numba.njit(nogil=True, cache=True)
def ctc_align_kernel(lp, targets, input_lengths, target_lengths, blank, labels, scores, b):
    """Sequence ``b``: forward max recursion, then backtrack.

    ``lp (T, B, C)`` float32/float64, any strides; ``targets (B, S)`` int64.

    Updates:
        labels[b] (T,): chosen label per frame (prefilled with ``blank``).
        scores[b] (T,): its log-probability (prefilled with 0).
    """
    Tb = input_lengths[b]
    L = target_lengths[b]
    if Tb == 0:
        return
    K = 2 * L + 1
    delta = np.empty(K, dtype=lp.dtype)
    nxt = np.empty(K, dtype=lp.dtype)
    delta[:] = -np.inf
    neg = delta[0]
    bp = np.zeros((Tb, K), dtype=np.int8)
    delta[0] = lp[0, b, blank]
    if K > 1:
        delta[1] = lp[0, b, targets[b, 0]]
    for t in range(1, Tb):
        for s in range(K):
            x0 = delta[s]
            x1 = delta[s - 1] if s >= 1 else neg
            x2 = neg
            if s % 2 == 1:
                lab = targets[b, s // 2]
                if s >= 3 and lab != targets[b, s // 2 - 1]:
                    x2 = delta[s - 2]
            else:
                lab = blank
            # torchaudio's order: s-2 only if strictly greater than both, then s-1.
            if x2 > x1 and x2 > x0:
                best = x2
                bp[t, s] = 2
            elif x1 > x0:
                best = x1
                bp[t, s] = 1
            else:
                best = x0
            nxt[s] = best + lp[t, b, lab]
        delta, nxt = nxt, delta
    if L == 0:
        s = 0
        final = delta[0]
    elif delta[K - 1] > delta[K - 2]:
        s = K - 1
        final = delta[K - 1]
    else:
        s = K - 2
        final = delta[K - 2]
    if not final > -np.inf:
        # No path of nonzero probability (or NaN, poisoned by the caller).
        for t in range(Tb):
            scores[b, t] = -np.inf
        return
    for t in range(Tb - 1, -1, -1):
        lab = targets[b, s // 2] if s % 2 == 1 else blank
        labels[b, t] = lab
        scores[b, t] = lp[t, b, lab]
        s -= bp[t, s]


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().numpy()


def ctc_align_forward(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`seqloss.align.reference.ctc_align_forward`."""
    T, B, C = log_probs.shape
    acc = torch.float64 if log_probs.dtype == torch.float64 else torch.float32
    labels = torch.full((B, T), blank, dtype=torch.int64)
    scores = torch.zeros((B, T), dtype=acc)
    if T == 0 or B == 0:
        return labels, scores
    # One contiguous layout per dtype: each layout would be another Numba compilation.
    lp = log_probs.to(acc).contiguous()
    il, tl = own_lines(_np(input_lengths.cpu())), own_lines(_np(target_lengths.cpu()))
    run_jobs(ctc_align_kernel,
             (_np(lp), _np(targets.contiguous()), il, tl, blank, _np(labels), _np(scores)),
             range(B), order=il * (2 * tl + 1), work=CELL * float(np.dot(il, 2 * tl + 1)))
    return labels, scores
