"""CTC in pure PyTorch, log space, vectorized over batch and states.

Loops over frames in Python (slow for long inputs, but simple and exact); used as
the oracle's fast twin, for float64 checks and on devices without a kernel.
"""

from __future__ import annotations

import torch

from .._core.logspace import log_softmax, logaddexp, softmax

NEG_INF = float("-inf")


def _shift_right(x: torch.Tensor, k: int) -> torch.Tensor:
    """``y[..., s] = x[..., s - k]``, ``-inf`` where ``s < k``."""
    pad = torch.full_like(x[..., :k], NEG_INF)
    return torch.cat([pad, x[..., :-k]], dim=-1) if x.shape[-1] > k else torch.full_like(x, NEG_INF)


def _shift_left(x: torch.Tensor, k: int) -> torch.Tensor:
    """``y[..., s] = x[..., s + k]``, ``-inf`` past the end."""
    pad = torch.full_like(x[..., :k], NEG_INF)
    return torch.cat([x[..., k:], pad], dim=-1) if x.shape[-1] > k else torch.full_like(x, NEG_INF)


def extended_emissions(lp: torch.Tensor, targets: torch.Tensor, L: torch.Tensor,
                       Tb: torch.Tensor, blank: int, delay_penalty: float
                       ) -> tuple[torch.Tensor, ...]:
    """``ext (B, K)`` the extended labels, ``e (T, B, K)`` their log-probs (``-inf`` past
    ``2 L_b + 1``) and ``skip (B, K)`` (``s - 2 -> s`` allowed); also ``ctc_align``'s
    reference's."""
    T, B, _ = lp.shape
    device = lp.device
    K = 2 * targets.shape[1] + 1
    ext = torch.full((B, K), blank, dtype=torch.int64, device=device)
    ext[:, 1::2] = targets
    s_idx = torch.arange(K, device=device)
    state_ok = s_idx[None, :] < (2 * L + 1)[:, None]
    e = lp.gather(2, ext[None].expand(T, B, K)) if T > 0 else lp.new_zeros(0, B, K)
    if delay_penalty != 0.0 and T > 0:
        # The same float64 rounding as the kernels: dp * ((T_b - 1) * 0.5 - t).
        t_idx = torch.arange(T, device=device, dtype=lp.dtype)
        pen = delay_penalty * ((Tb.to(lp.dtype) - 1) * 0.5 - t_idx[:, None])  # (T, B)
        e = e + torch.where((s_idx % 2 == 1)[None, None, :], pen[:, :, None], 0.0)
    e = torch.where(state_ok[None], e, torch.full_like(e, NEG_INF))
    skip = torch.zeros(B, K, dtype=torch.bool, device=device)
    if K > 2:
        skip[:, 2:] = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])
    return ext, e, skip


def _alphas(e: torch.Tensor, skip: torch.Tensor, Tb: torch.Tensor) -> list[torch.Tensor]:
    """``alpha[t] (B, K)`` for each frame, held at ``alpha[T_b - 1]`` past a sequence's end."""
    neg = torch.full(skip.shape, NEG_INF, dtype=e.dtype, device=e.device)
    alphas = []
    a = neg.clone()
    for t in range(e.shape[0]):
        if t == 0:
            new = neg.clone()
            new[:, :2] = e[0, :, :2]
        else:
            a2 = torch.where(skip, _shift_right(a, 2), neg)
            new = e[t] + logaddexp(a, _shift_right(a, 1), a2)
        a = torch.where((t < Tb)[:, None], new, a)
        alphas.append(a)
    return alphas


def _occupations(e: torch.Tensor, alphas: list[torch.Tensor], ext: torch.Tensor,
                 skip: torch.Tensor, ll: torch.Tensor, L: torch.Tensor, Tb: torch.Tensor,
                 C: int) -> torch.Tensor:
    """``occ (T, B, C)``: each class's posterior occupation, from ``beta'`` (the backward
    recursion without the emission at ``t``)."""
    T, B, K = e.shape
    device = e.device
    s_idx = torch.arange(K, device=device)
    neg = torch.full((B, K), NEG_INF, dtype=e.dtype, device=device)
    final = (s_idx[None, :] == (2 * L)[:, None]) | (s_idx[None, :] == (2 * L - 1)[:, None])
    final_init = torch.where(final, torch.zeros_like(neg), neg)
    occ = torch.zeros(T, B, C, dtype=e.dtype, device=device)
    # skip_next[s]: the transition s -> s + 2 is allowed.
    skip_next = torch.zeros_like(skip)
    if K > 2:
        skip_next[:, :-2] = skip[:, 2:]
    beta_next = neg.clone()  # beta (with emission) at t + 1
    for t in range(T - 1, -1, -1):
        b2 = torch.where(skip_next, _shift_left(beta_next, 2), neg)
        rec = logaddexp(beta_next, _shift_left(beta_next, 1), b2)
        bp = torch.where((t == Tb - 1)[:, None], final_init,
                         torch.where((t < Tb - 1)[:, None], rec, neg))
        gamma = torch.exp(alphas[t] + bp - ll[:, None])
        occ[t].scatter_add_(1, ext, gamma)
        beta_next = bp + e[t]
    return occ


def ctc_loss_forward(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    fused_log_softmax: bool,
    compute_grad: bool,
    *,
    delay_penalty: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence CTC negative log-likelihood and its gradient.

    Args:
        log_probs: ``(T, B, C)`` float, any layout; logits if ``fused_log_softmax``.
        targets: ``(B, S)`` int64, padding entries already replaced by valid ids.
        input_lengths, target_lengths: ``(B,)`` int64, validated.
        blank: blank index in ``[0, C)``.
        fused_log_softmax: take ``log_softmax`` over ``C`` inside; the gradient is
            then with respect to the logits (``softmax - occupation``).
        compute_grad: also return the gradient (else an empty tensor).
        delay_penalty: added to the emission of every non-blank extended label at
            frame ``t``, times ``(T_b - 1) / 2 - t`` (k2's latency penalty).

    Returns:
        ``loss (B,)`` in float32 (float64 for float64 input), ``+inf`` for an
        impossible alignment; ``grad (T, B, C)`` in the input dtype, the derivative
        of ``loss[b]`` with respect to ``log_probs[:, b]``, zero on frames
        ``t >= input_lengths[b]`` and for impossible alignments.

    Recursion over the extended labels ``l'`` (blank, l_1, blank, ..., l_L, blank),
    ``K = 2L + 1`` states::

        alpha[0, 0] = e[0, 0];  alpha[0, 1] = e[0, 1]
        alpha[t, s] = e[t, s] + logaddexp(alpha[t-1, s], alpha[t-1, s-1],
                                          alpha[t-1, s-2] if l'_s != blank and l'_s != l'_{s-2})
        log p = logaddexp(alpha[T_b-1, K-1], alpha[T_b-1, K-2])

    ``beta'`` is the same backwards *excluding* the emission at ``t``, so the state
    occupation is ``exp(alpha + beta' - log p)`` with no ``-inf - -inf``.
    """
    T, B, C = log_probs.shape
    device = log_probs.device
    # The reference favours exactness over speed: it always works in float64 and
    # rounds the loss to float32 (float64 input: float64) at the end.
    out_dtype = torch.float64 if log_probs.dtype == torch.float64 else torch.float32
    acc = torch.float64
    x = log_probs.to(acc)
    # fused: a frame of -inf logits gives -inf log-probabilities and softmax 0 (no path
    # leaves it: +inf, zero gradient), not NaN (logspace's rule)
    lp = log_softmax(x, dim=-1) if fused_log_softmax else x
    L = target_lengths.to(device)
    Tb = input_lengths.to(device)
    ext, e, skip = extended_emissions(lp, targets, L, Tb, blank, delay_penalty)
    alphas = _alphas(e, skip, Tb)
    bidx = torch.arange(B, device=device)
    if T > 0:
        last = alphas[-1]
        ll = logaddexp(last[bidx, 2 * L],
                       torch.where(L > 0, last[bidx, (2 * L - 1).clamp(min=0)], NEG_INF))
    else:
        ll = torch.zeros(B, dtype=acc, device=device)
    # Zero frames: only the empty target is feasible (probability 1).
    empty_ok = torch.where(L == 0, 0.0, NEG_INF).to(acc)
    ll = torch.where(Tb == 0, empty_ok, ll)
    loss = (-ll).to(out_dtype)

    if not compute_grad:
        return loss, log_probs.new_empty(0)

    occ = _occupations(e, alphas, ext, skip, ll, L, Tb, C)
    valid_t = torch.arange(T, device=device)[:, None] < Tb[None, :]
    if fused_log_softmax:
        grad = torch.where(valid_t[:, :, None], softmax(x, dim=-1), 0.0) - occ
    else:
        grad = -occ
    keep = valid_t & (ll != NEG_INF)[None, :]
    grad = torch.where(keep[:, :, None], grad, 0.0)
    return loss, grad.to(log_probs.dtype)
