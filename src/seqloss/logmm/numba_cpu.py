"""CPU backend of ``logmmexp``: the max-shifted matmul where it is provably exact, and an
exact recomputation of only the entries where it is not.

Same functions and contract as ``reference.py``. The "numba" backend of this family
holds no Numba code: a blocked exact Numba kernel (two passes over ``K`` per entry,
one scalar ``exp`` per term; ``benchmarks/bench_logmmexp.py --exact``) measured
slower in its forward alone than this path's forward and backward together, as
Numba's ``exp`` is scalar here while BLAS and torch's ``exp`` are vectorized.

The shortcut. With ``s_i = max_k a[i, k]`` and ``t_j = max_k b[k, j]`` (0 where the
maximum is not finite), ``ea = exp(a - s) <= 1``, ``eb = exp(b - t) <= 1`` and
``S = ea @ eb`` (one BLAS matmul), ``out = log S + s + t``. It can only go wrong by
underflow, never overflow (every term is ``<= 1``, ``S <= K``), and underflow only
costs a bounded *absolute* error in ``S``:

* a factor ``exp(x)`` below the smallest normal number ``tiny`` (2^-126 in float32,
  2^-1022 in float64) may be flushed or held as a subnormal, and a product of two
  factors below ``tiny`` likewise; as the other factor is ``<= 1``, such a term's
  true value is below ``tiny`` and its computed value in ``[0, tiny]``: an absolute
  error ``< tiny``. Every other term is computed to a few ulps, relatively. (The
  factors below a level ``f`` are in fact set to 0 on purpose, so that no product is
  subnormal, see :func:`_flush`: the same argument with ``f`` for ``tiny``.)
* so ``|S_hat - S| <= K max(tiny, f) + (the matmul's ordinary relative rounding)``.

Where ``S_hat >= thr`` the underflow part of the error in ``out`` is therefore below
``K f / thr`` nats: ``f`` is chosen as ``thr 2^-(p + 4) / K`` (p: mantissa bits), a
sixteenth of an ulp, with ``thr = 2^-64`` in float32 and ``2^-900`` in float64.
Entries with ``S_hat < thr`` (or not finite: ``-inf`` rows,
``+inf``/NaN inputs) are the ones whose dominant term ``a[i, k] + b[k, j]`` sits
more than ``-log2 thr`` bits below ``s_i + t_j`` (the two maxima are on different
``k``), the seed case ``a = [0, -1000]``, ``b = [-1000, 0]`` among them. For
float32 those rows go through the same matmul once more in float64 (threshold
2^-900: some 620 nats of head-room), and whatever is left after that is recomputed
exactly, entry by entry (a gathered ``logsumexp`` over ``K``, chunked).

The backward reuses the factorization ``w = exp(a + b - out) = ea * eb * exp(c)`` with
``c[i, j] = s_i + t_j - out[i, j] = -log S``: for an entry the forward resolved at
threshold ``thr``, ``exp(c) <= 1/thr`` (no overflow), and a term lost to underflow
or flushing in ``ea`` or ``eb`` has a true weight below ``f / thr`` (``2^-(p+4) / K``),
so the gradient's absolute error is that fraction of ``sum_j |g[i, j]|``. ``S`` is
saved by the forward, with the factors, so the shifted tier's ``exp(c) = 1/S``
carries no rounding of ``out`` and its entries are the forward's; the float64 and
exact tiers take ``c`` from ``out``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_INF = float("inf")
_LOG_THR = {torch.float32: -64 * math.log(2.0), torch.float64: -900 * math.log(2.0)}
_GATHER = 1 << 21  # elements of one chunk of gathered (entries, K) rows in the exact tier


def _shifts(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Row maxima of ``a`` ``(B, M, 1)``, column maxima of ``b`` ``(B, 1, N)``; 0 if not finite."""
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
    if x.numel() == 0:
        return True
    lo, hi = torch.aminmax(x)
    return bool(lo > -_INF) and bool(hi < _INF)  # False for NaN too


# (smallest normal exponent, largest exponent, mantissa bits) of the two dtypes.
_FLOAT = {torch.float32: (-126, 127, 24), torch.float64: (-1022, 1023, 53)}


def _flush(dtype: torch.dtype, K: int) -> tuple[float, int]:
    """``(f, lam)``: factors below ``f`` are set to 0 and ``eb`` is scaled by ``2^lam``.

    Why: at large input scales most factors ``exp(a - s)`` are far below 1, and
    their products fall into the subnormal range, where the CPU's matmul runs some
    100x slower (measured: 250 ms against 1-12 ms for one (8, 300, 500) @ (8, 500, 61)
    product at logit scale 30). With every factor either 0 or in ``[f, 1]`` (times
    ``2^lam`` for ``eb``), each product lies in ``[f^2 2^lam, 2^lam]``: ``lam`` makes
    that normal, and ``K 2^lam`` stays below overflow. A flushed factor's term is
    below ``f``, so ``|S_hat - S| <= K f``; ``f = thr 2^-(p + 4) / K`` keeps that at a
    sixteenth of an ulp of any accepted ``S >= thr`` (p: mantissa bits), and the
    gradient's dropped weights ``ea eb / S`` below ``2^-(p + 4) / K`` each. Where no
    such ``lam`` exists (``K`` beyond 2^22 in float32) nothing is flushed: exact as
    before, only slower.
    """
    emin, emax, p = _FLOAT[dtype]
    log2_k = max(0, math.ceil(math.log2(max(1, K))))
    phi = round(-_LOG_THR[dtype] / math.log(2.0)) + p + log2_k + 4  # f = 2^-phi
    lam = 2 * phi + emin + 1
    if phi > -emin or log2_k + lam > emax - 2:
        return 0.0, 0
    return 2.0 ** -phi, lam


def _shifted(a: Tensor, b: Tensor, s: Tensor, t: Tensor) -> tuple[Tensor, Tensor, Tensor, int]:
    """``(S, ea, eb_scaled, lam)``: the shifted matmul in ``a``'s dtype, its factors
    (flushed, ``eb`` times ``2^lam``: see :func:`_flush`) and the scale's exponent."""
    f, lam = _flush(a.dtype, a.shape[2])
    ea = torch.sub(a, s).exp_()
    eb = torch.sub(b, t).exp_()
    if f > 0:
        amin_a = float(ea.amin())
        if amin_a * float(eb.amin()) >= 2.0 ** (_FLOAT[a.dtype][0] + 1) and float(eb.amax()) <= 1:
            # Every product ea_k eb_k is already normal (inputs of moderate scale): no
            # flush and no scale. A scale would only push g / S times 2^-lam into the
            # subnormal range in the backward (24% of the weights at logit scale 1:
            # that matmul ran 25x slower).
            f = lam = 0
        else:
            if amin_a < f:
                ea.masked_fill_(ea < f, 0.0)
            eb.masked_fill_(eb < f, 0.0).mul_(2.0 ** lam)
    S = torch.bmm(ea, eb)
    if lam:
        S.mul_(2.0 ** -lam)  # exact: a power of two, and S >= thr is normal
    return S, ea, eb, lam


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
    S, ea, eb, lam = _shifted(a, b, s, t)
    # S itself is saved, not recovered from out: exp(s + t - out) would carry out's
    # rounding (an ulp of |out|, 2^-10 nats at 1e4) into every weight.
    saved = [ea, eb, s, t, S] if compute_grad else []
    lo, hi = torch.aminmax(S)
    out = torch.log(S).add_(s).add_(t)
    if bool(lo >= math.exp(_LOG_THR[S.dtype])) and bool(hi < _INF):
        return out, saved  # the common case: every entry exact as it is
    ok = _ok(S)
    # A row of a or a column of b that is all -inf: those entries are exactly -inf,
    # unless the other side holds NaN or +inf (-inf + NaN and -inf + inf are NaN).
    a_bad = ((a != a) | (a == _INF)).any(dim=2, keepdim=True)
    b_bad = ((b != b) | (b == _INF)).any(dim=1, keepdim=True)
    dead = (((a.amax(dim=2, keepdim=True) == -_INF) & ~b_bad)
            | ((b.amax(dim=1, keepdim=True) == -_INF) & ~a_bad))
    out.masked_fill_(dead, -_INF)
    ok |= dead
    if a.dtype == torch.float32 and not bool(ok.all()):
        # Second tier: the rows holding a rejected entry, in float64.
        for bidx in torch.nonzero(~ok.all(dim=2).all(dim=1)).flatten().tolist():
            rows = torch.nonzero(~ok[bidx].all(dim=1)).flatten()
            S64, _, _, _ = _shifted(a[bidx, rows].double()[None], b[bidx].double()[None],
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

    ``e = exp(c) <= 1/thr`` there, so ``G`` (or the matmuls' sums of it, each term
    ``G`` times factors <= 1) overflows only for a huge incoming gradient; then ``g`` is
    first divided by a power of two (exact) per batch.
    """
    G = e * g
    if take is not None:
        G = torch.where(take, G, 0.0)
    if not _all_finite(g):
        return G, None
    if _all_finite(G):
        lim = torch.finfo(G.dtype).max / 4
        absG = G.abs()
        if float(absG.sum(-1).amax()) < lim and float(absG.sum(-2).amax()) < lim:
            return G, None
    gmax = g.abs().amax(dim=(1, 2), keepdim=True)
    scale = torch.where(gmax > 0, torch.exp2(torch.ceil(torch.log2(gmax))), 1.0)
    G = e * (g / scale)
    if take is not None:
        G = torch.where(take, G, 0.0)
    return G, scale


def _has_small(G: Tensor) -> bool:
    """Whether ``G`` may hold entries small enough for subnormal products in the matmuls
    (or zeros, or NaN): unless every entry has one sign and a magnitude of at least
    ``2^(emin + 51)`` (one reduction, where ``_scaled_product``'s checks take several
    passes: the usual incoming gradient of ones gives ``G = 1 / S >= 1 / K``)."""
    if G.numel() == 0:
        return False
    lo, hi = (float(v) for v in torch.aminmax(G))
    least = lo if lo > 0 else (-hi if hi < 0 else 0.0)  # NaN: 0
    return not least >= 2.0 ** (_FLOAT[G.dtype][0] + 51)


def _scaled_product(G: Tensor, f: Tensor, e: Tensor, dim: int) -> Tensor:
    """``(G @ f) * e`` (``dim`` 2, ``f (B, N, K)``) or ``(f @ G) * e`` (``dim`` 1,
    ``f (B, K, M)``) for unscaled factors ``f``, ``e`` in ``[0, 1]``, without subnormal
    products in the matmul.

    The occupations' small entries (1e-39 to 1e-30 beside 1 on a long lattice) made
    products subnormal, each a microcode assist: the two matmuls of B=8 T=300 S=60
    C=500 took 2.65 ms, 0.85 ms without. A term is dropped when it is below ``2^-rho``
    of the largest entry of its vector (``G``'s row for ``dim`` 2, its column for
    ``dim`` 1: what one result entry sums over), with ``n 2^-rho <= 2^-(p + 4)`` (n
    terms, p mantissa bits): each result entry moves by less than a sixteenth of an ulp
    of ``max |G| e`` over its vector. Kept entries are ``>= 2^(emin + 1) / min f``, so
    that every product with a nonzero factor is normal: directly when every vector's
    largest entry leaves that much room, else after scaling each vector by a power of
    two (exact) so that its largest entry lies in ``[1, 2)``. Where ``min f`` is too
    small for either, only ``G``'s own subnormal entries are flushed (as before).
    """
    emin, _, p = _FLOAT[G.dtype]
    room = 2.0 ** -(p + 4 + math.ceil(math.log2(max(G.shape[dim], 2))))
    fmin = float(f.amin()) if f.numel() else 1.0
    if fmin == 0:  # a factor of a -inf input: the smallest nonzero one bounds the products
        fmin = float(torch.where(f > 0, f, 1.0).amin())
    keep = 2.0 ** (emin + 1) / fmin if fmin > 0 else _INF  # the least entry kept
    up = None  # the vectors' scales, where they are scaled
    if keep > room:  # no vector can drop what it must: G's subnormals only
        G = G.masked_fill(G.abs() < torch.finfo(G.dtype).tiny, 0.0)
    else:
        m = G.abs().amax(dim=dim, keepdim=True)
        pos = m[m > 0]
        if pos.numel() == 0 or keep <= float(pos.amin()) * room:
            G = G.masked_fill(G.abs() < keep, 0.0)
        else:
            # m = mant 2^x, mant in [0.5, 1): 2^(1 - x) puts the largest entry in [1, 2)
            # (a subnormal one below: 2^-emin at most, a finite power of two)
            up = torch.ldexp(torch.ones_like(m),
                             (1 - torch.frexp(m).exponent).clamp(max=-emin))
            up = torch.where((m > 0) & (m < _INF), up, 1.0)
            G = G * up
            G.masked_fill_(G.abs() < room, 0.0)  # room >= keep here
    r = torch.bmm(G, f) if dim == 2 else torch.bmm(f, G)
    r.mul_(e)
    return r if up is None else r.div_(up)


def _grads_through(G: Tensor, scale: Tensor | None, ea: Tensor, eb: Tensor, lam: int,
                   need_a: bool, need_b: bool) -> tuple[Tensor | None, Tensor | None]:
    """``ea * (G @ eb^T)`` and ``eb * (ea^T @ G)`` for ``eb`` given times ``2^lam``.

    ``G = g / S`` meets ``eb 2^lam`` scaled down by ``2^lam`` (an exact power of two),
    so every product of both matmuls is ``g`` times a weight-like factor in
    ``[f / K, 1/thr]``: normal, as in the forward. Unscaled (``lam = 0``), the products'
    range is ``G``'s: ``_scaled_product`` keeps them normal.
    """
    ga = gb = None
    small = not lam and _has_small(G)
    if need_a:
        ga = (_scaled_product(G, eb.transpose(1, 2), ea, 2) if small
              else torch.bmm(G * 2.0 ** -lam if lam else G, eb.transpose(1, 2)).mul_(ea))
    if need_b:
        gb = (_scaled_product(G, ea.transpose(1, 2), eb, 1) if small
              else torch.bmm(ea.transpose(1, 2), G).mul_(eb * 2.0 ** -lam if lam else eb))
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
        # The forward scaled eb by 2^lam or not at all. Scaled, every column with a
        # finite maximum holds exactly 2^lam (its max's exp(0) = 1, scaled); unscaled,
        # such entries are <= 1. Asked by equality: NaN in one batch item must not hide
        # the scale (``eb.amax() > 1`` did, and every other item's gradient came out
        # 2^lam off). The saved tensors stay five: a compiled graph cached by an older
        # version must not meet a different count.
        lam = _flush(a.dtype, K)[1]
        lam = lam if lam and bool((eb == 2.0 ** lam).any()) else 0
    else:
        s, t = _shifts(a, b)
        S, ea, eb, lam = _shifted(a, b, s, t)
    lo, hi = torch.aminmax(S)
    if bool(lo >= math.exp(_LOG_THR[S.dtype])) and bool(hi < _INF):  # the common case
        G, scale = _weights(g, torch.reciprocal(S), None)
        ga, gb = _grads_through(G, scale, ea, eb, lam, need_a, need_b)
        return (ga if need_a else a.new_empty(0)), (gb if need_b else b.new_empty(0))
    ok = _ok(S)
    # Entries left for the slower tiers: S underflowed (out finite, far below the
    # shifts), +inf, NaN. out = -inf passes no gradient.
    rest = ~ok & ~(out == -_INF)
    G, scale = _weights(g, torch.where(ok, torch.reciprocal(S), 0.0), ok)
    ga, gb = _grads_through(G, scale, ea, eb, lam, need_a, need_b)
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
                                        torch.sub(b64, t64).exp_(), 0, need_a, need_b)
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
