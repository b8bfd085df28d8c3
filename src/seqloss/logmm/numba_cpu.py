"""CPU backend of ``logmmexp``: the max-shifted matmul where it is provably exact, and an
exact recomputation of only the entries where it is not.

Same functions and contract as ``reference.py``.

The shortcut. With ``s_i = max_k a[i, k]`` and ``t_j = max_k b[k, j]`` (0 where the
maximum is not finite), ``ea = exp(a - s) <= 1``, ``eb = exp(b - t) <= 1`` and
``S = ea @ eb`` (one BLAS matmul), ``out = log S + s + t``. It can only go wrong by
underflow, never overflow (every term is ``<= 1``, ``S <= K``), and underflow only
costs a bounded *absolute* error in ``S``:

* a factor ``exp(x)`` below the smallest normal number ``tiny`` (2^-126 in float32,
  2^-1022 in float64) may be flushed or held as a subnormal, and a product of two
  factors below ``tiny`` likewise; as the other factor is ``<= 1``, such a term's
  true value is below ``tiny`` and its computed value in ``[0, tiny]``: an absolute
  error ``< tiny``. Every other term is computed to a few ulps, relatively;
* so ``|S_hat - S| <= K tiny + (the matmul's ordinary relative rounding)``.

Where ``S_hat >= thr`` the underflow part of the error in ``out`` is therefore below
``K tiny / thr`` nats: with ``thr = 2^-64`` in float32 that is ``K 2^-62``, under
float32's own rounding (2^-24) for any ``K < 2^38``; in float64, ``thr = 2^-900``
gives ``K 2^-122``. Entries with ``S_hat < thr`` (or not finite: ``-inf`` rows,
``+inf``/NaN inputs) are the ones whose dominant term ``a[i, k] + b[k, j]`` sits
more than ``-log2 thr`` bits below ``s_i + t_j`` (the two maxima are on different
``k``), the seed case ``a = [0, -1000]``, ``b = [-1000, 0]`` among them. For
float32 those rows go through the same matmul once more in float64 (threshold
2^-900: some 620 nats of head-room), and whatever is left after that is recomputed
exactly, entry by entry (a gathered ``logsumexp`` over ``K``, chunked).

The backward reuses the factorization ``w = exp(a + b - out) = ea * eb * exp(c)`` with
``c[i, j] = s_i + t_j - out[i, j] = -log S``: for an entry the forward resolved at
threshold ``thr``, ``exp(c) <= 1/thr`` (no overflow), and a term lost to underflow
in ``ea`` or ``eb`` has a true weight below ``tiny / thr`` (2^-62 in float32,
2^-122 in float64), so the gradient's absolute error is that fraction of
``sum_j |g[i, j]|``. The tiers are chosen again from ``out`` alone (``c`` against
``-log thr``), so the backward does not depend on how the forward rounded.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_INF = float("inf")
_LOG_THR = {torch.float32: -64 * math.log(2.0), torch.float64: -900 * math.log(2.0)}
_GATHER = 1 << 21  # elements of one chunk of gathered (entries, K) rows in the exact tier


def _shifts(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Row maxima of ``a`` ``(B, M, 1)`` and column maxima of ``b`` ``(B, 1, N)``, 0 where not finite."""
    if a.shape[2] == 0:
        return a.new_zeros(a.shape[0], a.shape[1], 1), b.new_zeros(b.shape[0], 1, b.shape[2])
    s = a.amax(dim=2, keepdim=True)
    t = b.amax(dim=1, keepdim=True)
    if not _all_finite(s):
        s = torch.where(torch.isfinite(s), s, 0.0)
    if not _all_finite(t):
        t = torch.where(torch.isfinite(t), t, 0.0)
    return s, t


def _all_finite(x: Tensor) -> bool:
    lo, hi = torch.aminmax(x)
    return bool(lo > -_INF) and bool(hi < _INF)  # False for NaN too


def _shifted(a: Tensor, b: Tensor, s: Tensor, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(S, ea, eb)``: the shifted matmul in ``a``'s dtype and its two factors."""
    ea = torch.sub(a, s).exp_()
    eb = torch.sub(b, t).exp_()
    return torch.bmm(ea, eb), ea, eb


def _ok(S: Tensor) -> Tensor:
    return (S >= math.exp(_LOG_THR[S.dtype])) & (S < _INF)


def _exact_entries(a: Tensor, b: Tensor, bi: Tensor, i: Tensor, j: Tensor) -> Tensor:
    """``logsumexp_k(a[bi, i, k] + b[bi, k, j])`` for a list of entries, in chunks."""
    K = a.shape[2]
    P = bi.shape[0]
    out = a.new_empty(P)
    bT = b.transpose(1, 2)
    step = max(1, _GATHER // max(1, K))
    for p0 in range(0, P, step):
        p1 = min(P, p0 + step)
        x = a[bi[p0:p1], i[p0:p1]] + bT[bi[p0:p1], j[p0:p1]]  # (P_c, K)
        out[p0:p1] = torch.logsumexp(x, dim=1)
    return out


def saved_like(a: Tensor, b: Tensor) -> list[Tensor]:
    B, M, K = a.shape
    N = b.shape[2]
    return [a.new_empty((B, M, K)), b.new_empty((B, K, N)), a.new_empty((B, M, 1)),
            b.new_empty((B, 1, N)), a.new_empty((B, M, N))]


def logmmexp_forward(a: Tensor, b: Tensor, compute_grad: bool) -> tuple[Tensor, list[Tensor]]:
    """Also saves ``[ea, eb, s, t, S]`` for the backward when ``compute_grad``."""
    B, M, K = a.shape
    N = b.shape[2]
    if B * M * N * K == 0:
        out = a.new_full((B, M, N), -_INF)
        return out, ([torch.zeros_like(a), torch.zeros_like(b), *_shifts(a, b),
                      torch.zeros_like(out)] if compute_grad else [])
    s, t = _shifts(a, b)
    S, ea, eb = _shifted(a, b, s, t)
    # S itself is saved, not recovered from out: exp(s + t - out) would carry out's
    # rounding (an ulp of |out|, 2^-10 nats at 1e4) into every weight.
    saved = [ea, eb, s, t, S] if compute_grad else []
    lo, hi = torch.aminmax(S)
    out = torch.log(S).add_(s).add_(t)
    if bool(lo >= math.exp(_LOG_THR[S.dtype])) and bool(hi < _INF):
        return out, saved  # the common case: every entry exact as it is
    ok = _ok(S)
    # A row of a or a column of b that is all -inf: those entries are exactly -inf.
    dead = (a.amax(dim=2, keepdim=True) == -_INF) | (b.amax(dim=1, keepdim=True) == -_INF)
    out.masked_fill_(dead, -_INF)
    ok |= dead
    if a.dtype == torch.float32 and not bool(ok.all()):
        # Second tier: the rows holding a rejected entry, in float64.
        for bidx in torch.nonzero(~ok.all(dim=2).all(dim=1)).flatten().tolist():
            rows = torch.nonzero(~ok[bidx].all(dim=1)).flatten()
            S64, _, _ = _shifted(a[bidx, rows].double()[None], b[bidx].double()[None],
                                 s[bidx, rows].double()[None], t[bidx].double()[None])
            o64 = torch.log(S64[0]).add_(s[bidx, rows].double()).add_(t[bidx].double())
            take = _ok(S64[0]) & ~ok[bidx, rows]
            out[bidx, rows] = torch.where(take, o64.float(), out[bidx, rows])
            ok[bidx, rows] |= take
    bad = torch.nonzero(~ok)
    if bad.shape[0]:
        bi, i, j = bad.unbind(1)
        out[bi, i, j] = _exact_entries(a, b, bi, i, j)
    return out, saved


def _weights(g: Tensor, e: Tensor, take: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """``(G, scale)``: ``G = g e / scale`` on the entries ``take`` (all: ``None``), 0 elsewhere.

    ``e = exp(c) <= 1/thr`` there, so ``G`` overflows only for a huge incoming
    gradient; then ``g`` is first divided by a power of two (exact) per batch.
    """
    G = e * g
    if take is not None:
        G = torch.where(take, G, 0.0)
    if _all_finite(G) or not _all_finite(g):
        return G, None
    gmax = g.abs().amax(dim=(1, 2), keepdim=True)
    scale = torch.where(gmax > 0, torch.exp2(torch.ceil(torch.log2(gmax))), 1.0)
    G = e * (g / scale)
    if take is not None:
        G = torch.where(take, G, 0.0)
    return G, scale


def _grads_through(G: Tensor, scale: Tensor | None, ea: Tensor, eb: Tensor, need_a: bool,
                   need_b: bool) -> tuple[Tensor | None, Tensor | None]:
    ga = torch.bmm(G, eb.transpose(1, 2)).mul_(ea) if need_a else None
    gb = torch.bmm(ea.transpose(1, 2), G).mul_(eb) if need_b else None
    if scale is not None:
        ga = ga.mul_(scale) if need_a else None
        gb = gb.mul_(scale) if need_b else None
    return ga, gb


def logmmexp_backward(
    g: Tensor, a: Tensor, b: Tensor, out: Tensor, saved: list[Tensor], need_a: bool,
    need_b: bool,
) -> tuple[Tensor, Tensor]:
    B, M, K = a.shape
    N = b.shape[2]
    if B * M * N * K == 0:
        return (torch.zeros_like(a) if need_a else a.new_empty(0),
                torch.zeros_like(b) if need_b else b.new_empty(0))
    if saved:
        ea, eb, s, t, S = saved
    else:
        s, t = _shifts(a, b)
        S, ea, eb = _shifted(a, b, s, t)
    lo, hi = torch.aminmax(S)
    if bool(lo >= math.exp(_LOG_THR[S.dtype])) and bool(hi < _INF):  # the common case
        G, scale = _weights(g, torch.reciprocal(S), None)
        ga, gb = _grads_through(G, scale, ea, eb, need_a, need_b)
        return (ga if need_a else a.new_empty(0)), (gb if need_b else b.new_empty(0))
    ok = _ok(S)
    # Entries left for the slower tiers: S underflowed (out finite, far below the
    # shifts), +inf, NaN. out = -inf passes no gradient.
    rest = ~ok & ~(out == -_INF)
    G, scale = _weights(g, torch.where(ok, torch.reciprocal(S), 0.0), ok)
    ga, gb = _grads_through(G, scale, ea, eb, need_a, need_b)
    grad_a = ga if need_a else a.new_empty(0)
    grad_b = gb if need_b else b.new_empty(0)
    if a.dtype == torch.float32 and bool(rest.any()):
        for bidx in torch.nonzero(rest.any(dim=2).any(dim=1)).flatten().tolist():
            rows = torch.nonzero(rest[bidx].any(dim=1)).flatten()
            a64, b64 = a[bidx, rows].double()[None], b[bidx].double()[None]
            s64, t64 = s[bidx, rows].double()[None], t[bidx].double()[None]
            c64 = (s64 + t64) - out[bidx, rows].double()[None]
            take = rest[bidx, rows][None] & (c64 <= -_LOG_THR[torch.float64]) & (c64 > -_INF)
            e64 = torch.exp(torch.where(take, c64, 0.0))
            G64, sc64 = _weights(g[bidx, rows].double()[None], e64, take)
            ga64, gb64 = _grads_through(G64, sc64, torch.sub(a64, s64).exp_(),
                                        torch.sub(b64, t64).exp_(), need_a, need_b)
            if need_a:
                grad_a[bidx, rows] += ga64[0].float()
            if need_b:
                grad_b[bidx] += gb64[0].float()
            rest[bidx, rows] &= ~take[0]
    bad = torch.nonzero(rest)
    if bad.shape[0]:
        _exact_entry_grads(g, a, b, out, bad, grad_a, grad_b, need_a, need_b)
    return grad_a, grad_b


def _exact_entry_grads(g: Tensor, a: Tensor, b: Tensor, out: Tensor, bad: Tensor,
                       grad_a: Tensor, grad_b: Tensor, need_a: bool, need_b: bool) -> None:
    """Adds ``g[p] exp(a[bi, i, :] + b[bi, :, j] - out[p])`` of each listed entry (chunked)."""
    B, M, K = a.shape
    N = b.shape[2]
    bi, i, j = bad.unbind(1)
    bT = b.transpose(1, 2)
    ga_rows = grad_a.view(B * M, K) if need_a else None
    gbT = b.new_zeros(B * N, K) if need_b else None
    step = max(1, _GATHER // max(1, K))
    for p0 in range(0, bi.shape[0], step):
        sl = slice(p0, min(bi.shape[0], p0 + step))
        o = out[bi[sl], i[sl], j[sl]]
        w = torch.exp(a[bi[sl], i[sl]] + bT[bi[sl], j[sl]] - o[:, None])
        w.mul_(g[bi[sl], i[sl], j[sl]][:, None])
        if need_a:
            ga_rows.index_add_(0, bi[sl] * M + i[sl], w)
        if need_b:
            gbT.index_add_(0, bi[sl] * N + j[sl], w)
    if need_b:
        grad_b += gbT.view(B, N, K).transpose(1, 2)
