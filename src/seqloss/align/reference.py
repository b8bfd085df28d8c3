"""Viterbi forced alignment (CTC and RNN-T) in pure PyTorch.

Vectorized over the batch and the states; loops over frames (CTC) or lattice
diagonals (RNN-T) in Python, so slow for long inputs but simple. Works on any
device. The arithmetic is the same as the Numba and Triton kernels' (one
addition per arc, exact maxima, float32 for float32 input), so all backends
give bit-identical alignments, ties included.
"""

from __future__ import annotations

import torch

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
    T, B, C = log_probs.shape
    device = log_probs.device
    acc = torch.float64 if log_probs.dtype == torch.float64 else torch.float32
    S = targets.shape[1]
    K = 2 * S + 1
    L = target_lengths.to(device)
    Tb = input_lengths.to(device)
    labels = torch.full((B, T), blank, dtype=torch.int64, device=device)
    scores = torch.zeros((B, T), dtype=acc, device=device)
    if T == 0 or B == 0:
        return labels, scores

    ext = torch.full((B, K), blank, dtype=torch.int64, device=device)
    ext[:, 1::2] = targets
    s_idx = torch.arange(K, device=device)
    state_ok = s_idx[None, :] < (2 * L + 1)[:, None]
    e = log_probs.gather(2, ext[None].expand(T, B, K)).to(acc)
    e = torch.where(state_ok[None], e, torch.full_like(e, NEG_INF))
    skip = torch.zeros(B, K, dtype=torch.bool, device=device)
    if K > 2:
        skip[:, 2:] = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])
    neg = torch.full((B, K), NEG_INF, dtype=acc, device=device)

    delta = neg.clone()
    delta[:, : min(2, K)] = e[0, :, : min(2, K)]
    bp = torch.zeros((T, B, K), dtype=torch.int8, device=device)
    one, two = torch.ones((), dtype=torch.int8, device=device), torch.full((), 2, dtype=torch.int8, device=device)
    for t in range(1, T):
        x0 = delta
        x1 = _shift_right(delta, 1)
        x2 = torch.where(skip, _shift_right(delta, 2), neg)
        take2 = (x2 > x1) & (x2 > x0)
        take1 = ~take2 & (x1 > x0)
        best = torch.where(take2, x2, torch.where(take1, x1, x0))
        bp[t] = torch.where(take2, two, torch.where(take1, one, torch.zeros_like(one)))
        delta = torch.where((t < Tb)[:, None], best + e[t], delta)

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


def rnnt_align_forward(
    blank_lp: torch.Tensor,
    emit_lp: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched RNN-T Viterbi alignment on the lattice's arc log-probabilities.

    Args:
        blank_lp: ``(B, T, U + 1)`` float32/float64, ``log p(blank | t, u)``.
        emit_lp: ``(B, T, U)``, ``log p(y_{u+1} | t, u)``.
        logit_lengths, target_lengths: ``(B,)`` int64, validated (``U_b <= U``).

    Returns:
        ``frames (B, U)`` int64, the frame at which token ``u`` is emitted on the
        best path (``-1`` past ``target_lengths[b]``), and ``scores (B,)``, the best
        path's log-probability. No path of nonzero probability (or no frames):
        frames ``-1`` and score ``-inf``.

    Recursion (tie: the blank arc wins unless the emission is strictly greater)::

        delta[0, 0] = 0
        delta[t, u] = max(delta[t-1, u] + blank[t-1, u], delta[t, u-1] + emit[t, u-1])
        score = delta[T_b-1, U_b] + blank[T_b-1, U_b]
    """
    B, T, U1 = blank_lp.shape
    U = U1 - 1
    device = blank_lp.device
    frames = torch.full((B, U), -1, dtype=torch.int64, device=device)
    scores = torch.full((B,), NEG_INF, dtype=blank_lp.dtype, device=device)
    if T == 0 or B == 0:
        return frames, scores
    delta = torch.full((B, T, U1), NEG_INF, dtype=blank_lp.dtype, device=device)
    emit_wins = torch.zeros((B, T, U1), dtype=torch.bool, device=device)
    delta[:, 0, 0] = 0.0
    u = torch.arange(U1, device=device)
    # One -inf column so that the lane u = 0 (no emission into it) can index safely.
    emit_pad = torch.cat([emit_lp, torch.full_like(blank_lp[:, :, :1], NEG_INF)], dim=2)
    # Anti-diagonal wavefront: every node of diagonal n = t + u depends on diagonal n - 1 only.
    for n in range(1, T + U):
        t = n - u
        ok = (t >= 0) & (t < T)
        tc = t.clamp(0, T - 1)
        tp = (t - 1).clamp(0, T - 1)
        um = (u - 1).clamp(min=0)
        from_blank = torch.where(ok & (t >= 1), delta[:, tp, u] + blank_lp[:, tp, u], NEG_INF)
        from_emit = torch.where(ok & (u >= 1), delta[:, tc, um] + emit_pad[:, tc, um], NEG_INF)
        win = from_emit > from_blank
        new = torch.where(win, from_emit, from_blank)
        delta[:, tc[ok], u[ok]] = new[:, ok]
        emit_wins[:, tc[ok], u[ok]] = win[:, ok]

    Tb, Ub = logit_lengths.tolist(), target_lengths.tolist()
    wins = emit_wins.cpu()
    for b in range(B):
        if Tb[b] == 0:
            continue
        score = delta[b, Tb[b] - 1, Ub[b]] + blank_lp[b, Tb[b] - 1, Ub[b]]
        scores[b] = score
        if not bool(score > NEG_INF):
            continue
        t, k = Tb[b] - 1, Ub[b]
        out = [0] * Ub[b]
        while k > 0 and t >= 0:
            if wins[b, t, k]:
                out[k - 1] = t
                k -= 1
            else:
                t -= 1
        frames[b, : Ub[b]] = torch.tensor(out, dtype=torch.int64)
    return frames, scores
