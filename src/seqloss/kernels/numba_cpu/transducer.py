r"""Transducer losses on CPU: torch's vectorized passes over the logits, Numba on the lattice.

Implements the kernel interface documented in ``seqloss.reference.transducer``
(``transducer_lattice`` and ``rnnt_loss_forward``, same signatures and semantics).

Where the time goes: the loss is bound by one ``exp`` per logit. The installed
llvmlite has no vector math library, so a Numba ``exp`` is scalar (~10x slower
than torch's vectorized one); the passes over the logits are therefore torch ops,
chunked over frames so that each chunk stays in cache between its passes, and only
the ``(B, T, U+1)`` lattice runs in Numba: one GIL-free function per (sequence,
direction) or sequence, on the shared thread pool (:func:`._pool.run_jobs`:
fork-safe, the same result whatever the thread count).

Memory: the normalizers are computed on the fly in the gradient's own buffer
(``exp(x - max)`` written there, summed, then rescaled in place by the
occupation weight in the epilogue), so the gradient is the only logits-sized
allocation, and none at all when the caller passes ``grad_buffer=logits``.
Half-precision inputs use chunk-sized float32 temporaries instead (their
gradient buffer is too coarse to hold the exponentials), at the price of a
second ``exp`` pass.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from ._pool import run_jobs

NEG_INF = float("-inf")
NAN = float("nan")
# Elements per chunk of a sequence's logits (16 MiB in float32, within L3): a chunk written by
# one pass is still in cache for the next (L2/L3-sized on current x86 parts).
CHUNK_ELEMS = 1 << 22


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# --------------------------------------------------------------------------- lattice
@njit(cache=True, nogil=True, inline="always")
def _lae(a, b):  # noqa: ANN001, ANN202
    # Guarded logaddexp: -inf is an exact zero, no epsilon.
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    if a > b:
        return a + math.log1p(math.exp(b - a))
    return b + math.log1p(math.exp(a - b))


@njit(cache=True, nogil=True)
def _alpha_rnnt(arc_blank, arc_emit, Tb, Ub, alpha):  # noqa: ANN001, ANN202
    """``_alpha`` specialized to RNN-T's arcs (blank +1 frame, emission +0 frames)."""
    alpha[0, 0] = 0.0
    for u in range(1, Ub + 1):
        alpha[0, u] = alpha[0, u - 1] + arc_emit[0, u - 1, 0] if Tb > 0 else NEG_INF
    for t in range(1, Tb + 1):
        alpha[t, 0] = alpha[t - 1, 0] + arc_blank[t - 1, 0, 0]
        if t < Tb:
            for u in range(1, Ub + 1):
                alpha[t, u] = _lae(alpha[t - 1, u] + arc_blank[t - 1, u, 0],
                                   alpha[t, u - 1] + arc_emit[t, u - 1, 0])
        else:
            for u in range(1, Ub + 1):
                alpha[t, u] = alpha[t - 1, u] + arc_blank[t - 1, u, 0]


@njit(cache=True, nogil=True)
def _beta_rnnt(arc_blank, arc_emit, Tb, Ub, beta):  # noqa: ANN001, ANN202
    """``_beta`` specialized to RNN-T's arcs."""
    for u in range(Ub + 1):
        beta[Tb, u] = NEG_INF
    beta[Tb, Ub] = 0.0
    for t in range(Tb - 1, -1, -1):
        beta[t, Ub] = arc_blank[t, Ub, 0] + beta[t + 1, Ub]
        for u in range(Ub - 1, -1, -1):
            beta[t, u] = _lae(arc_blank[t, u, 0] + beta[t + 1, u], arc_emit[t, u, 0] + beta[t, u + 1])


@njit(cache=True, nogil=True)
def _alpha(arc_blank, arc_emit, Tb, Ub, bd, ed, alpha):  # noqa: ANN001, ANN202
    """Forward variables of one sequence (states t <= Tb, u <= Ub)."""
    neg = arc_blank.dtype.type(NEG_INF)
    for t in range(Tb + 1):
        for u in range(Ub + 1):
            if t == 0 and u == 0:
                alpha[0, 0] = 0.0
                continue
            acc = neg
            for i in range(bd.shape[0]):
                ts = t - bd[i]
                if ts >= 0:
                    acc = _lae(acc, alpha[ts, u] + arc_blank[ts, u, i])
            if u > 0 and t < Tb:
                for j in range(ed.shape[0]):
                    ts = t - ed[j]
                    if ts >= 0:
                        acc = _lae(acc, alpha[ts, u - 1] + arc_emit[ts, u - 1, j])
            alpha[t, u] = acc


@njit(cache=True, nogil=True)
def _beta(arc_blank, arc_emit, Tb, Ub, bd, ed, beta):  # noqa: ANN001, ANN202
    """Backward variables of one sequence; beta(Tb, Ub) = 0."""
    neg = arc_blank.dtype.type(NEG_INF)
    for u in range(Ub + 1):
        beta[Tb, u] = neg
    beta[Tb, Ub] = 0.0
    for t in range(Tb - 1, -1, -1):
        for u in range(Ub, -1, -1):
            acc = neg
            for i in range(bd.shape[0]):
                td = t + bd[i]
                if td <= Tb:
                    acc = _lae(acc, arc_blank[t, u, i] + beta[td, u])
            if u < Ub:
                for j in range(ed.shape[0]):
                    td = t + ed[j]
                    if td < Tb:
                        acc = _lae(acc, arc_emit[t, u, j] + beta[td, u + 1])
            beta[t, u] = acc


@njit(cache=True, nogil=True)
def transducer_alpha_beta_kernel(arc_blank, arc_emit, Tl, Ul, bd, ed, alpha, beta, ll, rnnt, job):  # noqa: ANN001, ANN201
    """Job ``2 b``: sequence ``b``'s alpha and ``ll[b]``; job ``2 b + 1``: its beta.

    ``rnnt``: the durations are RNN-T's (``bd == (1,)``, ``ed == (0,)``).

    Updates: ``alpha[b, :T_b+1, :U_b+1]`` and ``ll[b]``, or ``beta[b, :T_b+1, :U_b+1]``.
    """
    b = job // 2
    if job % 2 == 0:
        if rnnt:
            _alpha_rnnt(arc_blank[b], arc_emit[b], Tl[b], Ul[b], alpha[b])
        else:
            _alpha(arc_blank[b], arc_emit[b], Tl[b], Ul[b], bd, ed, alpha[b])
        ll[b] = alpha[b, Tl[b], Ul[b]] if Tl[b] > 0 else NEG_INF
    elif rnnt:
        _beta_rnnt(arc_blank[b], arc_emit[b], Tl[b], Ul[b], beta[b])
    else:
        _beta(arc_blank[b], arc_emit[b], Tl[b], Ul[b], bd, ed, beta[b])


@njit(cache=True, nogil=True)
def transducer_occupation_kernel(arc_blank, arc_emit, Tl, Ul, bd, ed, alpha, beta, ll,  # noqa: ANN001, ANN201
                                 occ_blank, occ_emit, b):
    """Sequence ``b``: the occupations of its arcs.

    Updates: every entry of ``occ_blank[b]`` and ``occ_emit[b]`` (0 off the valid arcs).
    """
    T, U1 = arc_blank.shape[1], arc_blank.shape[2]
    Tb, Ub, lb = Tl[b], Ul[b], ll[b]
    for t in range(T):
        for u in range(U1):
            for i in range(bd.shape[0]):
                occ_blank[b, t, u, i] = 0.0
            for j in range(ed.shape[0]):
                occ_emit[b, t, u, j] = 0.0
    if lb == NEG_INF or lb != lb:
        return
    for t in range(Tb):
        for u in range(Ub + 1):
            a = alpha[b, t, u]
            if a == NEG_INF:
                continue
            for i in range(bd.shape[0]):
                td = t + bd[i]
                if td <= Tb:
                    occ_blank[b, t, u, i] = math.exp(a + arc_blank[b, t, u, i] + beta[b, td, u] - lb)
            if u < Ub:
                for j in range(ed.shape[0]):
                    td = t + ed[j]
                    if td < Tb:
                        occ_emit[b, t, u, j] = math.exp(a + arc_emit[b, t, u, j] + beta[b, td, u + 1] - lb)


def transducer_lattice(
    arc_blank: torch.Tensor,
    arc_emit: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank_durations: tuple[int, ...],
    emit_durations: tuple[int, ...],
    compute_occupations: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """See ``seqloss.reference.transducer.transducer_lattice``."""
    B, T, U1, _ = arc_blank.shape
    dt = arc_blank.dtype
    ab = arc_blank.contiguous()
    ae = arc_emit.contiguous()
    Tl = logit_lengths.cpu().numpy().astype(np.int64)
    Ul = target_lengths.cpu().numpy().astype(np.int64)
    bd = np.asarray(blank_durations, dtype=np.int64)
    ed = np.asarray(emit_durations, dtype=np.int64)
    alpha = torch.empty((B, T + 1, U1), dtype=dt)
    beta = torch.empty((B, T + 1, U1), dtype=dt) if compute_occupations else alpha.new_empty((B, 1, 1))
    ll = torch.empty((B,), dtype=dt)
    rnnt = bd.tolist() == [1] and ed.tolist() == [0]
    # Beta only when the occupations need it; each direction of each sequence is a job.
    jobs = range(2 * B) if compute_occupations else range(0, 2 * B, 2)
    cost = [Tl[j // 2] * (Ul[j // 2] + 1) for j in jobs]
    run_jobs(transducer_alpha_beta_kernel,
             (ab.numpy(), ae.numpy(), Tl, Ul, bd, ed, alpha.numpy(), beta.numpy(), ll.numpy(), rnnt),
             jobs, order=cost)
    if not compute_occupations:
        return ll, arc_blank.new_empty(0), arc_emit.new_empty(0)
    if rnnt:
        # RNN-T: vectorized exps in torch beat a Numba loop on this small
        # (B, T, U+1) work (Numba's exp is scalar).
        return ll, *_rnnt_occupations(ab, ae, logit_lengths, target_lengths, alpha, beta, ll)
    occ_b = torch.empty_like(ab)
    occ_e = torch.empty_like(ae)
    run_jobs(transducer_occupation_kernel,
             (ab.numpy(), ae.numpy(), Tl, Ul, bd, ed, alpha.numpy(), beta.numpy(), ll.numpy(),
              occ_b.numpy(), occ_e.numpy()),
             range(B), order=Tl * (Ul + 1))
    return ll, occ_b, occ_e


def _rnnt_occupations(ab, ae, logit_lengths, target_lengths, alpha, beta, ll):  # noqa: ANN001, ANN202
    B, T, U1, _ = ab.shape
    Tb = logit_lengths.cpu()[:, None, None]
    Ub = target_lengths.cpu()[:, None, None]
    tt = torch.arange(T)[None, :, None]
    uu = torch.arange(U1)[None, None, :]
    src = (tt < Tb) & (uu <= Ub) & (ll != NEG_INF)[:, None, None]
    ll_safe = torch.where(ll == NEG_INF, 0.0, ll)[:, None, None]
    # In place, a few (B, T, U+1) tensors at most: with a small V they are not negligible.
    occ_b = alpha[:, :T] - ll_safe
    occ_e = occ_b.clone()
    occ_b.add_(ab[..., 0]).add_(beta[:, 1 : T + 1]).exp_().masked_fill_(~src, 0.0)
    occ_e[:, :, : U1 - 1].add_(ae[:, :, : U1 - 1, 0]).add_(beta[:, :T, 1:]).exp_()
    occ_e.masked_fill_(~(src & (uu < Ub)), 0.0)
    return occ_b[..., None], occ_e[..., None]


# --------------------------------------------------------------------------- RNN-T
def _seq_view(x: torch.Tensor, b: int, tb: int, ub: int, off: int) -> torch.Tensor:
    """Sequence ``b``'s read region as a ``(T_b, U_b+1, V)`` view (padded or packed)."""
    if x.dim() == 4:
        return x[b, :tb, : ub + 1]
    return x[off : off + tb * (ub + 1)].unflatten(0, (tb, ub + 1))


def _chunks(tb: int, ub: int, V: int):  # noqa: ANN202
    step = max(1, CHUNK_ELEMS // max(1, (ub + 1) * V))
    for t0 in range(0, tb, step):
        yield t0, min(tb, t0 + step)


def rnnt_loss_forward(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    clamp: float,
    fused_log_softmax: bool,
    fastemit_lambda: float,
    compute_grad: bool,
    grad_buffer: torch.Tensor | None = None,
    grad_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """See ``seqloss.reference.transducer.rnnt_loss_forward``."""
    dtype = logits.dtype
    acc = _acc_dtype(dtype)
    half = dtype in (torch.float16, torch.bfloat16)
    packed = logits.dim() == 2
    V = logits.shape[-1]
    Tl = logit_lengths.tolist()
    Ul = target_lengths.tolist()
    B = len(Tl)
    T = max(Tl, default=0) if packed else logits.shape[1]
    U1 = max(Ul, default=0) + 1
    offs = [0] * B
    for b in range(1, B):
        offs[b] = offs[b - 1] + Tl[b - 1] * (Ul[b - 1] + 1)
    tg = targets.cpu()

    grad = None
    if compute_grad:
        grad = grad_buffer if grad_buffer is not None else torch.empty_like(logits)
    # The lattice runs in float64 whatever the input: arc scores of -2e4 (logits of
    # 1e4) keep their small parts, and Numba's scalar log/exp cost the same.
    lat = torch.float64
    arc_blank = torch.empty((B, T, U1, 1), dtype=lat)
    arc_emit = torch.empty((B, T, U1, 1), dtype=lat)
    # Per row: the shift m (the max, 0 for a row of -inf) and sum(exp(x - m)).
    # Log-probs are (x - m) - log(sum), never x - (m + log(sum)): with logits of
    # 1e4 the latter loses float32's last digits to the rounding of m + log(sum).
    row_max = torch.empty((B, T, U1), dtype=acc)
    row_sum = torch.empty((B, T, U1), dtype=acc)
    bad = [False] * B

    # ---- prologue: normalizers on the fly, arc scores, NaN/+inf detection
    for b in range(B):
        tb, ub = Tl[b], Ul[b]
        if tb == 0:
            continue
        x = _seq_view(logits, b, tb, ub, offs[b])
        idx = tg[b, :ub].to(x.device)[None, :, None].expand(tb, ub, 1)
        # Gather before the buffer (maybe the logits themselves) is overwritten.
        xb = x[..., blank].to(acc, copy=True)
        xe = x[:, :ub].gather(2, idx)[..., 0].to(acc)
        g = _seq_view(grad, b, tb, ub, offs[b]) if grad is not None else None
        any_bad = False
        for t0, t1 in _chunks(tb, ub, V):
            xc = x[t0:t1]
            m = xc.amax(-1).to(acc)
            any_bad |= bool((~(m < float("inf"))).any())
            if not fused_log_softmax:
                continue
            # A row of -inf logits has no arc out of it: shift by 0, sum 0, log_z -inf.
            m = torch.where(m == NEG_INF, 0.0, m)
            if g is not None and not half:
                gc = g[t0:t1]
                torch.sub(xc, m[..., None], out=gc)
                gc.exp_()
                s = gc.sum(-1, dtype=acc)
            else:
                s = torch.exp(xc.to(acc) - m[..., None]).sum(-1)
            row_sum[b, t0:t1, : ub + 1] = s
            row_max[b, t0:t1, : ub + 1] = m
        bad[b] = any_bad
        if fused_log_softmax:
            m = row_max[b, :tb, : ub + 1].to(lat)
            s = row_sum[b, :tb, : ub + 1].to(lat)
            ls = torch.log(s)
            xb, xe = xb.to(lat), xe.to(lat)
            # A row of -inf logits (s = 0) has no arc out of it.
            xb = torch.where(s == 0, NEG_INF, (xb - m) - ls)
            xe = torch.where(s[:, :ub] == 0, NEG_INF, (xe - m[:, :ub]) - ls[:, :ub])
        arc_blank[b, :tb, : ub + 1, 0] = xb
        arc_emit[b, :tb, :ub, 0] = xe

    # ---- core recursion
    ll, occ_b, occ_e = transducer_lattice(
        arc_blank, arc_emit, logit_lengths, target_lengths, (1,), (0,), compute_grad
    )
    del arc_blank, arc_emit
    scale = 1.0 + fastemit_lambda
    loss = (-ll * scale).to(acc)
    if any(bad):
        loss = torch.where(torch.tensor(bad), NAN, loss)
    loss = loss.to(logits.device)
    if grad is None:
        return loss, logits.new_empty(0)

    # ---- epilogue: occupations -> gradient, in the buffer holding exp(x - m)
    llist = ll.tolist()
    for b in range(B):
        tb, ub = Tl[b], Ul[b]
        if not packed:
            grad[b, tb:].zero_()
            grad[b, :tb, ub + 1 :].zero_()
        if tb == 0:
            continue
        g = _seq_view(grad, b, tb, ub, offs[b])
        if bad[b]:
            g.fill_(NAN)
            continue
        if llist[b] == NEG_INF:
            g.zero_()
            continue
        ob = occ_b[b, :tb, : ub + 1, 0].to(acc)
        oe = (occ_e[b, :tb, :ub, 0] * scale).to(acc)
        if not fused_log_softmax:
            if clamp > 0:
                ob, oe = ob.clamp(max=clamp), oe.clamp(max=clamp)
            ob, oe = ob * grad_scale, oe * grad_scale
        idx = tg[b, :ub].to(g.device)[None, :, None]
        if fused_log_softmax:
            occ = ob.clone()
            occ[:, :ub] += oe
            s = row_sum[b, :tb, : ub + 1]
            # softmax * occupation = exp(x - m) * (occupation / sum exp(x - m)).
            w = torch.where(s > 0, occ / s, 0.0)
            x = _seq_view(logits, b, tb, ub, offs[b]) if half else None
            m = row_max[b, :tb, : ub + 1]
            for t0, t1 in _chunks(tb, ub, V):
                if half:
                    gc = torch.exp(x[t0:t1].to(acc) - m[t0:t1, :, None])
                    gc.mul_(w[t0:t1, :, None])
                else:
                    gc = g[t0:t1]
                    gc.mul_(w[t0:t1, :, None].to(gc.dtype))
                gc[..., blank] -= ob[t0:t1].to(gc.dtype)
                if ub:
                    gc[:, :ub].scatter_add_(2, idx.expand(t1 - t0, ub, 1),
                                            -oe[t0:t1, :, None].to(gc.dtype))
                if clamp > 0:
                    gc.clamp_(-clamp, clamp)
                if grad_scale != 1.0:
                    gc.mul_(grad_scale)
                if half:
                    g[t0:t1].copy_(gc)
        else:
            g.zero_()
            g[..., blank] = -ob.to(g.dtype)
            if ub:
                g[:, :ub].scatter_(2, idx.expand(tb, ub, 1), -oe[..., None].to(g.dtype))
    return loss, grad
