r"""The joint's passes over the logits on CPU, one row at a time in Numba.

The transducer losses are bound by one ``exp`` per logit. A row of the joint (``V``
logits of one ``(t, u)`` state) fits in L1, so per row:

- prologue: its maximum ``m`` (0 for a row of ``-inf``), ``s = sum exp(x - m)``,
  NaN/``+inf`` detection, ``exp(x - m)`` written into the gradient's row, and for the
  RNN-T-topology tables (RNN-T, HAT) the row's two arc scores -- one read of the logits
  from memory, where torch's ``amax``, ``sub``, ``exp_`` and ``sum`` are four passes
  over a chunk (and a dozen small ops per sequence formed the arcs after them);
- epilogue: that row times ``occupation / s``, minus the arcs' occupations at their
  classes, the clamp and the gradient scale, in place: ``grad_row``, the Numba backend's
  one row epilogue (these jobs call it, and so does the many-arc tables' lattice kernel
  in ``numba_cpu``, for the rows it visits);
- tiles (``joint_tile_grad``): the epilogue alone on a tile of rows whose occupations
  are known, through ``grad_row`` too: the losses from the joint recompute each tile's
  logits in their backward and call it (``numba_cpu`` exports it as the backend's).

HAT's ``"hat"`` normalizer (``table.py``) has its own prologue job: the labels' shift and
sum leave the blank's class out, whose sigmoid ``grad_row`` writes in the epilogue.

The ``exp`` is written out (``seqloss._core.numba_exp``), so LLVM vectorizes the row
loops. Sums accumulate in the logits' dtype, as torch's ``sum`` does.

Rows are addressed in flat (1-D) views of the tensors' storage, with per-sequence
element offsets and strides, so any layout with unit stride along the classes works
(padded, packed, permuted, a caller's buffer). Jobs are blocks
of frames of one sequence, on the shared pool (:func:`seqloss._core.numba_pool.run_jobs`);
each writes only its own rows: the result does not depend on the schedule.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from ..._core.numba_exp import vexp as _exp
from ..._core.numba_logspace import sub_normalizer as _sub_normalizer
from ..._core.numba_pool import own_lines, run_jobs

# No "nnan"/"ninf": NaN (found through the row's sum) and rows of -inf must survive.
# "reassoc" lets the row's sum vectorize.
_FM = {"reassoc", "contract", "nsz", "arcp"}


_LANES = 16


@njit(inline="always", cache=True, error_model="numpy")
def _seg_max(xrow, lo, hi, m, acc):
    """``max(m, xrow[lo:hi])`` by ``_LANES`` running maxima (``_row_max``: the whole row)."""
    n = lo + (hi - lo) // _LANES * _LANES
    if n > lo:
        for k in range(_LANES):
            acc[k] = xrow[lo + k]
        for v in range(lo + _LANES, n, _LANES):
            for k in range(_LANES):
                a = xrow[v + k]
                acc[k] = a if a > acc[k] else acc[k]
        for k in range(_LANES):
            m = acc[k] if acc[k] > m else m
    for v in range(n, hi):
        m = xrow[v] if xrow[v] > m else m
    return m


@njit(inline="always", cache=True, error_model="numpy")
def _row_max(xrow, V, acc):
    """The row's maximum (with NaN: any value; the caller finds NaN in the row's sum).

    ``acc``: scratch of ``_LANES`` entries. LLVM does not vectorize a max *reduction*
    here (it would need "nnan", which Numba applies to a whole function once inlined);
    ``_LANES`` running maxima are an elementwise select, which it does (4x faster)."""
    return _seg_max(xrow, 0, V, xrow[0], acc)


@njit(nogil=True, cache=True, error_model="numpy", fastmath=_FM)
def _prologue_job(x, xo, xst, xsu, write, same, g, go, gst, gsu, V, jb, jt0, jt1, ub1, rm, rs,
                  ro, rst, bad, arcs, tg, cls, Tl, sigma, dp, ab, ae, job):
    """Rows ``(t, u)``, ``jt0[job] <= t < jt1[job]``, ``u < ub1[b]``, of sequence ``b = jb[job]``.

    Row ``(b, t, u)`` starts at ``x[xo[b] + t xst[b] + u xsu[b]]``; its shift and sum (in
    ``x``'s dtype, as torch's ``sum``) go to ``rm/rs[ro[b] + t rst[b] + u]``.
    ``bad[job] = 1`` when a row holds NaN or ``+inf``.

    ``write``: also store ``exp(x - m)`` in the row of ``g`` (addressed by ``go, gst,
    gsu``), for an epilogue that rescales it in place: one ``exp`` per logit in all (the
    passes are bound by it), where recomputing it in the epilogue costs a second.
    ``same``: ``g`` is ``x`` (a gradient written over the logits): the row is read and
    written through ``g`` alone, so that LLVM's vector loop runs (with two arrays on one
    buffer, its aliasing check sends exactly overlapping rows to the scalar loop, 2x
    slower).

    ``arcs``: also RNN-T's arc scores of each row, float64, in ``rs``'s order: ``ab =
    lp[cls] - sigma``, ``ae = lp[tg[b, u]] - sigma + dp ((T_b - 1) / 2 - t)`` (``u <
    U_b``), ``lp = (x - m) - log(s)`` (``-inf`` where ``s = 0``): formed here, the
    logits read before any ``exp`` is written over them, not by torch's small ops per
    sequence afterwards (which cost more than these passes on a busy 2-core machine).
    """
    b = jb[job]
    x0, xs0, xs1 = xo[b], xst[b], xsu[b]
    g0, gs0, gs1 = go[b], gst[b], gsu[b]
    r0, rs0 = ro[b], rst[b]
    zero = x.dtype.type(0.0)  # (np.zeros: one more overload to compile)
    acc = np.empty(_LANES, x.dtype)
    nbad = 0
    for t in range(jt0[job], jt1[job]):
        for u in range(ub1[b]):
            # Row slices, not flat indices: LLVM then vectorizes.
            xr = x0 + t * xs0 + u * xs1
            xrow = x[xr : xr + V]
            zb = zy = 0.0
            if arcs:  # before the row may be overwritten (``same``)
                zb = np.float64(xrow[cls])
                if u < ub1[b] - 1:
                    zy = np.float64(xrow[tg[b, u]])
            m = _row_max(xrow, V, acc)
            if m == -np.inf:  # a row of -inf: shift 0, sum 0 (no arc out of it)
                m = zero
            s = zero
            if not write:
                for v in range(V):
                    s += _exp(xrow[v] - m)
            else:
                gr = g0 + t * gs0 + u * gs1
                grow = g[gr : gr + V]
                if same:
                    for v in range(V):
                        e = _exp(grow[v] - m)
                        grow[v] = e
                        s += e
                else:
                    for v in range(V):
                        e = _exp(xrow[v] - m)
                        grow[v] = e
                        s += e
            if s != s or m == np.inf:  # NaN (its exp is NaN) or +inf in the row
                nbad += 1
            k = r0 + t * rs0 + u
            rm[k] = m
            rs[k] = s
            if arcs:
                _row_arcs(False, zb, zy, np.float64(m), np.float64(s), 0.0, 0.0, u < ub1[b] - 1,
                          sigma, dp * ((Tl[b] - 1) * 0.5 - t), ab, ae, k)
    bad[job] = 1 if nbad else 0


@njit(nogil=True, cache=True, error_model="numpy", fastmath=_FM)
def _logprob_prologue_job(x, xo, xst, xsu, V, jb, jt0, jt1, ub1, ro, rst, bad, tg, cls, Tl, sigma,
                          dp, ab, ae, job):
    """``_prologue_job`` for rows of log-probabilities (``fused_log_softmax=False``): no
    normalizer; RNN-T's arcs read off the row, ``ab = x[cls] - sigma``, ``ae = (x[tg[b,
    u]] - sigma) + dp ((T_b - 1) / 2 - t)`` (``u < U_b``), in ``ro``/``rst``'s row order;
    ``bad[job] = 1`` when a row holds NaN or ``+inf`` (its maximum, its sum)."""
    b = jb[job]
    x0, xs0, xs1 = xo[b], xst[b], xsu[b]
    r0, rs0 = ro[b], rst[b]
    zero = x.dtype.type(0.0)  # (np.zeros: one more overload to compile)
    acc = np.empty(_LANES, x.dtype)
    nbad = 0
    for t in range(jt0[job], jt1[job]):
        pen = dp * ((Tl[b] - 1) * 0.5 - t)
        for u in range(ub1[b]):
            xr = x0 + t * xs0 + u * xs1
            xrow = x[xr : xr + V]
            m = _row_max(xrow, V, acc)
            s = zero
            for v in range(V):
                s += xrow[v]
            if s != s or m == np.inf:  # NaN (the sum's too) or +inf in the row
                nbad += 1
            k = r0 + t * rs0 + u
            ab[k] = np.float64(xrow[cls]) - sigma
            if u < ub1[b] - 1:
                ae[k] = (np.float64(xrow[tg[b, u]]) - sigma) + pen
    bad[job] = 1 if nbad else 0


@njit(inline="always", cache=True, error_model="numpy")
def _row_arcs(hat, zb, zy, m, s, lsb, lse, emit, sigma, pen, ab, ae, k):
    """A row's arc scores (float64): RNN-T's from the blank's logit ``zb``, or ``hat``'s
    (``ab = lsb``, the labels' share ``lse`` added to ``ae``; ``lse = 0`` for RNN-T);
    ``m``, ``s`` the (labels') shift and sum. ``(x - m) - log(s)``, never ``x - (m +
    log(s))``: with logits of 1e4 the latter loses the last digits."""
    if s > 0.0:
        ls = math.log(s)
        ab[k] = (lsb if hat else (zb - m) - ls) - sigma
        if emit:
            ae[k] = ((lse + ((zy - m) - ls)) - sigma) + pen
    else:  # no class (HAT: no label) with a finite logit: no arc out of it
        ab[k] = (lsb if hat else -np.inf) - sigma
        if emit:
            ae[k] = -np.inf


@njit(nogil=True, cache=True, error_model="numpy", fastmath=_FM)
def _epilogue_job(g, go, gst, gsu, V, jb, jt0, jt1, ub1, ue, rs, ro, rst, ob, oe, cls, tg, scale,
                  clamp, gscale, skip, job):
    """The fused gradient of rows ``(t, u)`` of job ``job`` (see ``_prologue_job``), in place
    over the ``exp(x - m)`` the prologue wrote into ``g``:

        g = clamp(exp(x - m) * total / s - sum over arcs of their occupation at their class)
            * gscale

    ``ob (B, T, U1, Db)``/``oe (B, T, U1, De)``: arc occupations in ``rs``'s row order
    (``ro, rst``); blank arc ``i`` scores class ``cls[i]`` (classes may repeat: TDT's
    blank arcs), every emission arc the label ``tg[b, u]`` (scaled by ``scale``,
    FastEmit's ``1 + lambda``) on rows ``u < ue[b]``; ``total`` is their sum (float64).
    ``clamp <= 0``: no clamp. Sequences with ``skip[b]`` are left alone. Products below
    the smallest normal number are flushed to 0 (a matmul reading subnormals runs many
    times slower on x86: the joint's backward reads this gradient).
    """
    b = jb[job]
    if skip[b]:
        return
    obf = ob.reshape(-1)
    oef = oe.reshape(-1)
    g0, gs0, gs1 = go[b], gst[b], gsu[b]
    r0, rs0 = ro[b], rst[b]
    tiny = np.finfo(g.dtype).tiny
    for t in range(jt0[job], jt1[job]):
        for u in range(ub1[b]):
            k = r0 + t * rs0 + u
            gr = g0 + t * gs0 + u * gs1
            _row_grad(g, gr, V, True, rs[k], obf, oef, ob.shape[3], oe.shape[3], k, cls,
                      tg[b, u] if u < ue[b] else -1, scale, clamp, gscale, tiny)


@njit(nogil=True, cache=True, error_model="numpy", fastmath=_FM)
def _epilogue_any_job(g, go, gst, gsu, gsv, V, jb, jt0, jt1, ub1, ue, rs, ro, rst, ob, oe, cls,
                      tg, scale, clamp, gscale, skip, scaled, job):
    """``_epilogue_job`` where ``g``'s classes lie ``gsv`` apart (``_gather``) or, not
    ``scaled``, for log-probabilities: ``-occupations`` (the rows of ``g`` overwritten,
    whatever they hold; ``rs`` unread). A job of its own: these run-time choices in
    ``_epilogue_job``'s loop (or one loop body for both, inlined) cost it 3-5% (V = 1024).
    """
    b = jb[job]
    if skip[b]:
        return
    obf = ob.reshape(-1)
    oef = oe.reshape(-1)
    g0, gs0, gs1 = go[b], gst[b], gsu[b]
    r0, rs0 = ro[b], rst[b]
    tiny = np.finfo(g.dtype).tiny
    Db, De = ob.shape[3], oe.shape[3]
    if gsv == 1:
        for t in range(jt0[job], jt1[job]):
            for u in range(ub1[b]):
                k = r0 + t * rs0 + u
                _row_grad(g, g0 + t * gs0 + u * gs1, V, scaled, rs[k], obf, oef, Db, De, k, cls,
                          tg[b, u] if u < ue[b] else -1, scale, clamp, gscale, tiny)
        return
    sc = np.empty(_BLOCK * (V + _PAD), g.dtype)
    for t in range(jt0[job], jt1[job]):
        for u0 in range(0, ub1[b], _BLOCK):
            n = min(_BLOCK, ub1[b] - u0)
            _gather(g, g0 + t * gs0 + u0 * gs1, gs1, gsv, V, n, sc)
            for u in range(u0, u0 + n):
                k = r0 + t * rs0 + u
                _row_grad(sc, (u - u0) * (V + _PAD), V, scaled, rs[k], obf, oef, Db, De, k, cls,
                          tg[b, u] if u < ue[b] else -1, scale, clamp, gscale, tiny)
            _scatter(g, g0 + t * gs0 + u0 * gs1, gs1, gsv, V, n, sc)


# Rows whose classes are not at unit stride (``gsv`` > 1) are gathered ``_BLOCK`` at a time
# into a scratch of rows ``V + _PAD`` apart (a power-of-two pitch maps a block's rows to
# one L1 set).
_BLOCK = 16
_PAD = 16


@njit(inline="always", cache=True, error_model="numpy")
def _gather(g, gr, su, sv, V, n, sc):
    """Rows ``gr + i su`` (``i < n``) of ``g``, classes ``sv`` apart, into the scratch rows
    ``sc[i (V + _PAD) :]`` for ``grad_row``. Class by class, the block's rows in turn: in
    the usual such layouts (classes outermost, ``su = 1``) each line of ``g`` is read
    once, whole."""
    for v in range(V):
        for i in range(n):
            sc[i * (V + _PAD) + v] = g[gr + i * su + v * sv]


@njit(inline="always", cache=True, error_model="numpy")
def _scatter(g, gr, su, sv, V, n, sc):
    """``_gather``'s scratch rows back into ``g``."""
    for v in range(V):
        for i in range(n):
            g[gr + i * su + v * sv] = sc[i * (V + _PAD) + v]


@njit(inline="always", cache=True, error_model="numpy")
def grad_row(buf, o, V, scaled, w, desc, cls, occ, o0, nc, y, oy, hb, gb, clamp, gscale, tiny):
    """The joint's gradient epilogue on one row ``row = buf[o : o + V]``, in place: the one
    row body of every Numba path (the row passes here, HAT's, and the many-arc tables'
    lattice kernel)::

        row = clamp(row w - sum_k occ[o0 + k] [c = cls[k]] - oy [c = y]) * gscale

    ``scaled``: ``row`` holds ``exp(x - m)`` (the prologue's) and ``w = occupancy / sum
    exp(x - m)`` (0: the row scales to 0; a row's own store, not a memset, which on a
    cold row cost more); else the row is zeroed first, whatever it holds (the gradient
    of log-probabilities). ``y < 0``: no emission out of the row. ``hb >= 0``: HAT's
    blank class, written ``gb`` after the scaling instead. ``clamp <= 0``: none.
    A product or difference below ``tiny`` in magnitude is written as 0: every path
    passes a float32/float64 gradient's smallest normal (the joint's backward matmul
    reads subnormals many times slower on x86), half precision's float32 scratch its
    own; except ``desc``'s products (the table kernel, which sets ``w = 0`` for a row whose
    every product would be below ``tiny``): a plain multiply there, exact, where a flush
    cost multi-blank and TDT 7-8% (B8-T150-U40-V1024; a select on the inputs too, 15%).
    ``desc``: the row backwards, scaled only (the
    table kernel visits rows in descending order: one descending stream the prefetcher
    follows). NaN stays NaN. The row is ``buf`` and an offset, indexed unsigned: a view
    per row cost the table kernel an atomic reference count pair each (multi-blank and
    TDT 5-10% slower), and a signed index Numba's negative-index wraparound (which does
    not vectorize).
    """
    u0 = np.uint64(o)
    if not scaled:
        for v in range(V):
            buf[u0 + np.uint64(v)] = 0.0
    elif desc:
        for v in range(V - 1, -1, -1):
            buf[u0 + np.uint64(v)] *= w
    else:
        for v in range(V):
            k = u0 + np.uint64(v)
            p = buf[k] * w
            buf[k] = 0.0 if abs(p) < tiny else p
    for k in range(nc):
        c = u0 + np.uint64(cls[k])
        d = buf[c] - occ[o0 + k]
        buf[c] = 0.0 if abs(d) < tiny else d
    if hb >= 0:
        buf[u0 + np.uint64(hb)] = 0.0 if abs(gb) < tiny else gb
    if y >= 0:
        c = u0 + np.uint64(y)
        d = buf[c] - oy
        buf[c] = 0.0 if abs(d) < tiny else d
    if clamp > 0:
        h = buf.dtype.type(clamp)
        for v in range(V):
            k = u0 + np.uint64(v)
            buf[k] = min(max(buf[k], -h), h)
    if gscale != 1.0:  # a reduction's factor: its products flushed too
        sc = buf.dtype.type(gscale)
        z = buf.dtype.type(0.0)
        ty = buf.dtype.type(tiny)
        for v in range(V):
            k = u0 + np.uint64(v)
            p = buf[k] * sc
            buf[k] = z if abs(p) < ty else p


@njit(inline="always", cache=True, error_model="numpy")
def _row_grad(g, gr, V, scaled, s, obf, oef, Db, De, k, cls, y, scale, clamp, gscale, tiny):
    """One row of ``_epilogue_job`` over its ``exp(x - m)`` in ``g[gr : gr + V]``, ``s`` its
    sum (not ``scaled``: the row overwritten, ``s`` unread); ``y``: the emission arcs'
    class, or -1 (no emission out of the row)."""
    total = 0.0
    for i in range(Db):
        total += obf[k * Db + i]
    oes = 0.0
    if y >= 0:
        for j in range(De):
            oes += oef[k * De + j]
        oes *= scale
    total += oes
    s64 = np.float64(s)
    w = g.dtype.type(total / s64 if s64 > 0 else 0.0)
    grad_row(g, gr, V, scaled, w, False, cls, obf, k * Db, Db, y, oes, -1, 0.0, clamp, gscale,
             tiny)


@njit(nogil=True, cache=True, error_model="numpy", fastmath=_FM)
def _hat_prologue_job(x, xo, xst, xsu, write, g, go, gst, gsu, V, blank, jb, jt0, jt1, ub1, rm,
                      rs, ro, rst, lsb, bad, arcs, tg, Tl, sigma, dp, ab, ae, job):
    """``_prologue_job`` over the labels (every class but ``blank``): their shift and sum,
    ``exp(x - m)`` in the labels' entries of ``g``'s row (``write``; the blank's entry is
    the epilogue's), ``lsb = logsigmoid(z_blank)`` (float64, ``rs``'s order) and with
    ``arcs`` HAT's arc scores (``_row_arcs``). A NaN or ``+inf`` in any class, the
    blank's included, flags the row."""
    b = jb[job]
    x0, xs0, xs1 = xo[b], xst[b], xsu[b]
    g0, gs0, gs1 = go[b], gst[b], gsu[b]
    r0, rs0 = ro[b], rst[b]
    zero = x.dtype.type(0.0)  # (np.zeros: one more overload to compile)
    ninf = x.dtype.type(-np.inf)
    acc = np.empty(_LANES, x.dtype)
    nbad = 0
    for t in range(jt0[job], jt1[job]):
        for u in range(ub1[b]):
            xr = x0 + t * xs0 + u * xs1
            xrow = x[xr : xr + V]
            # Two segments, never the whole row less the blank's term: a blank far above
            # the labels would overflow that term (and cancel their sum).
            m = _seg_max(xrow, 0, blank, ninf, acc)
            m = _seg_max(xrow, blank + 1, V, m, acc)
            if m == -np.inf:  # no label has a finite logit: shift 0, sum 0 (no emission)
                m = zero
            s = zero
            if write:
                gr = g0 + t * gs0 + u * gs1
                grow = g[gr : gr + V]
                for v in range(blank):
                    e = _exp(xrow[v] - m)
                    grow[v] = e
                    s += e
                for v in range(blank + 1, V):
                    e = _exp(xrow[v] - m)
                    grow[v] = e
                    s += e
            else:
                for v in range(blank):
                    s += _exp(xrow[v] - m)
                for v in range(blank + 1, V):
                    s += _exp(xrow[v] - m)
            zb = xrow[blank]
            if s != s or m == np.inf or zb != zb or zb == np.inf:
                nbad += 1
            k = r0 + t * rs0 + u
            rm[k] = m
            rs[k] = s
            z = np.float64(zb)
            sp = math.log1p(math.exp(-abs(z)))  # log(1 + exp(-|z|)): exact for large |z|
            lsb[k] = min(z, 0.0) - sp
            if arcs:
                emit = u < ub1[b] - 1
                zy = np.float64(xrow[tg[b, u]]) if emit else 0.0
                _row_arcs(True, z, zy, np.float64(m), np.float64(s), lsb[k], min(-z, 0.0) - sp,
                          emit, sigma, dp * ((Tl[b] - 1) * 0.5 - t), ab, ae, k)
    bad[job] = 1 if nbad else 0


@njit(nogil=True, cache=True, error_model="numpy", fastmath=_FM)
def _hat_epilogue_job(g, go, gst, gsu, V, blank, jb, jt0, jt1, ub1, ue, rs, ro, rst, ob, oe,
                      lsb, tg, scale, clamp, gscale, skip, job):
    """HAT's gradient of rows ``(t, u)`` in place over the labels' ``exp(x - m)``::

        g[c]     = clamp(exp(x_c - m) o_e / s - o_e [c = y]) * gscale     (c != blank)
        g[blank] = clamp(bsig (o_b + o_e) - o_b) * gscale

    ``o_b = ob[row]``, ``o_e = scale oe[row]`` (rows ``u < ue[b]``; else 0), ``bsig =
    exp(lsb)`` the row's ``sigmoid(z_blank)`` (``lsb`` from the prologue); subnormals
    flushed as in ``_epilogue_job``."""
    b = jb[job]
    if skip[b]:
        return
    ub = ue[b]
    obf = ob.reshape(-1)
    oef = oe.reshape(-1)
    lsf = lsb.reshape(-1)
    g0, gs0, gs1 = go[b], gst[b], gsu[b]
    r0, rs0 = ro[b], rst[b]
    tiny = np.finfo(g.dtype).tiny
    none = np.empty(0, np.int64)
    for t in range(jt0[job], jt1[job]):
        for u in range(ub1[b]):
            # the row's body written out: _hat_row here cost the job 7-20%
            k = r0 + t * rs0 + u
            o_b = np.float64(obf[k])
            oes = np.float64(oef[k]) * scale if u < ub else 0.0
            s = np.float64(rs[k])
            gr = g0 + t * gs0 + u * gs1
            w = g.dtype.type(oes / s if s > 0 else 0.0)
            gb = math.exp(lsf[k]) * (o_b + oes) - o_b
            grad_row(g, gr, V, True, w, False, none, obf, 0, 0, tg[b, u] if u < ub else -1, oes,
                     blank, gb, clamp, gscale, tiny)


@njit(nogil=True, cache=True, error_model="numpy", fastmath=_FM)
def _hat_epilogue_any_job(g, go, gst, gsu, gsv, V, blank, jb, jt0, jt1, ub1, ue, rs, ro, rst, ob,
                          oe, lsb, tg, scale, clamp, gscale, skip, job):
    """``_hat_epilogue_job`` where ``g``'s classes lie ``gsv`` > 1 apart (``_gather``)."""
    b = jb[job]
    if skip[b]:
        return
    ub = ue[b]
    obf = ob.reshape(-1)
    oef = oe.reshape(-1)
    lsf = lsb.reshape(-1)
    g0, gs0, gs1 = go[b], gst[b], gsu[b]
    r0, rs0 = ro[b], rst[b]
    tiny = np.finfo(g.dtype).tiny
    none = np.empty(0, np.int64)
    sc = np.empty(_BLOCK * (V + _PAD), g.dtype)
    for t in range(jt0[job], jt1[job]):
        for u0 in range(0, ub1[b], _BLOCK):
            n = min(_BLOCK, ub1[b] - u0)
            _gather(g, g0 + t * gs0 + u0 * gs1, gs1, gsv, V, n, sc)
            for u in range(u0, u0 + n):
                _hat_row(sc, (u - u0) * (V + _PAD), V, blank, r0 + t * rs0 + u, u < ub, obf, oef,
                         lsf, rs, none, tg[b, u] if u < ub else -1, scale, clamp, gscale, tiny)
            _scatter(g, g0 + t * gs0 + u0 * gs1, gs1, gsv, V, n, sc)


@njit(inline="always", cache=True, error_model="numpy")
def _hat_row(g, gr, V, blank, k, emit, obf, oef, lsf, rs, none, y, scale, clamp, gscale, tiny):
    """``_hat_epilogue_job``'s row body over ``g[gr : gr + V]`` (for the scratch rows of
    ``_hat_epilogue_any_job``): row ``k`` of the occupations (``none``: an empty class
    list)."""
    o_b = np.float64(obf[k])
    oes = np.float64(oef[k]) * scale if emit else 0.0
    s = np.float64(rs[k])
    w = g.dtype.type(oes / s if s > 0 else 0.0)
    gb = math.exp(lsf[k]) * (o_b + oes) - o_b
    grad_row(g, gr, V, True, w, False, none, obf, 0, 0, y, oes, blank, gb, clamp, gscale, tiny)


# --------------------------------------------------------------------------- drivers
def _flat(t: torch.Tensor) -> np.ndarray:
    """A 1-D numpy view of ``t``'s storage from its first element to its last (any strides)."""
    if not t.numel():
        return torch.as_strided(t, (0,), (1,)).numpy()
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return torch.as_strided(t, (span,), (1,)).numpy()


# Rows narrower than this take torch's ops over chunks instead in
# ``transducer.from_joint``'s tiles (the Numba joint has its own width,
# ``numba_cpu.TABLE_MIN_ROW_WIDTH``). Measured with benchmarks/bench_rnnt.py (RNN-T, x
# one torch.logsumexp pass, old -> row passes): at V = 1024 1.19 -> 1.10 (1 thread) and
# 1.21-1.23 -> 1.11-1.22 (2 threads); at V = 256 1.28 -> 1.40 and 1.39-1.57 -> 1.68-1.75,
# V = 128 1.54 -> 1.61: a short row's fixed costs (slices, the lane maxima, the
# occupation sums) outweigh the faster exp, and at 2 threads the pool's worker shares
# its core with torch's still-spinning OpenMP worker (with OMP_WAIT_POLICY=passive the
# row passes win at every size: 1.50 -> 1.34-1.45, 1.23-1.26 -> 1.09-1.11, 1.69-1.72 ->
# 1.45-1.54). Since the joint's epilogue runs here at every width, the joint's passes
# are all Numba's and win at every width (see TABLE_MIN_ROW_WIDTH); from_joint's tiles,
# with the joint's own torch ops between them, not (rnnt_loss_from_joint B8-T150-U40-H256,
# 2 threads, this width lowered to 1: V = 32 1.2-1.4x the time, V = 128 1.00x, V = 256
# 0.96-0.98x).
MIN_ROW_WIDTH = 512


def rows_ok(V: int, *ts: torch.Tensor, min_width: int | None = None) -> bool:
    """Whether a loss's rows (``V`` classes wide) go through the row kernels: at least
    ``min_width`` (default ``MIN_ROW_WIDTH``) classes, CPU float32/float64, unit stride
    along the classes."""
    return V >= (MIN_ROW_WIDTH if min_width is None else min_width) and all(
        t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64)
        and (t.shape[-1] <= 1 or t.stride(-1) == 1) for t in ts)


def _rows_of(t: torch.Tensor, Tl: list[int], Ul: list[int], offs: list[int]) -> tuple:
    """Per-sequence element offset and (t, u) strides of ``t``'s rows (padded 4-D or packed 2-D)."""
    B = len(Tl)
    if t.dim() == 4:
        sb, st, su = t.stride(0), t.stride(1), t.stride(2)
        o = [b * sb for b in range(B)]
        return o, [st] * B, [su] * B
    sn = t.stride(0)
    return [o * sn for o in offs], [(u + 1) * sn for u in Ul], [sn] * B


def _jobs(Tl: list[int], Ul: list[int], V: int) -> tuple[np.ndarray, ...]:
    """Blocks of frames of ~2**20 logits (4 MiB in float32), at least ~8 per thread."""
    total = sum(tb * (ub + 1) for tb, ub in zip(Tl, Ul, strict=True)) * max(V, 1)
    per = max(1, min(1 << 20, total // (8 * max(1, torch.get_num_threads()))))
    jb, j0, j1, cost = [], [], [], []
    for b, (tb, ub) in enumerate(zip(Tl, Ul, strict=True)):
        step = max(1, per // max(1, (ub + 1) * V))
        for t0 in range(0, tb, step):
            jb.append(b)
            j0.append(t0)
            j1.append(min(tb, t0 + step))
            cost.append((j1[-1] - t0) * (ub + 1))
    i64 = np.int64
    return (own_lines(np.asarray(jb, i64)), own_lines(np.asarray(j0, i64)),
            own_lines(np.asarray(j1, i64)), cost)


class RowPasses:
    """The prologue and epilogue of one loss call over ``x``'s rows (token block, ``V`` wide).

    ``row_max``/``row_sum``: ``(B, T, U1)`` contiguous, in the accumulation dtype.
    """

    def __init__(self, x: torch.Tensor, Tl: list[int], Ul: list[int], offs: list[int], V: int,
                 row_max: torch.Tensor, row_sum: torch.Tensor, hat_blank: int = -1) -> None:
        self.Tl, self.Ul, self.offs, self.V = Tl, Ul, offs, V
        self.hat_blank = hat_blank  # >= 0: HAT's normalizer (the labels: every other class)
        self.jobs = _jobs(Tl, Ul, V)
        i64 = np.int64
        self.ub1 = own_lines(np.asarray([u + 1 for u in Ul], i64))
        _, T, U1 = row_max.shape
        B = len(Tl)
        self.ro = own_lines(np.asarray([b * T * U1 for b in range(B)], i64))
        self.rst = own_lines(np.asarray([U1] * B, i64))
        self.row_max, self.row_sum = row_max, row_sum
        self.rm, self.rs = row_max.view(-1).numpy(), row_sum.view(-1).numpy()
        # HAT: each row's logsigmoid(z_blank), float64, shaped as row_sum
        self.hat_lsb = torch.empty((B, T, U1) if hat_blank >= 0 else (0,), dtype=torch.float64)
        self.x = x

    def _addr(self, t: torch.Tensor) -> tuple:
        o, st, su = _rows_of(t, self.Tl, self.Ul, self.offs)
        i64 = np.int64
        return (_flat(t), own_lines(np.asarray(o, i64)), own_lines(np.asarray(st, i64)),
                own_lines(np.asarray(su, i64)))

    def prologue(self, g: torch.Tensor | None = None, arcs: tuple | None = None, *,
                 logprobs: bool = False) -> np.ndarray:
        """Shifts and sums of every row; returns per-sequence NaN/``+inf`` flags.

        ``g``: also write ``exp(x - m)`` into its rows (same row layout as ``x``'s).
        ``arcs``: ``(arc_blank, arc_emit, blank, targets, sigma, delay_penalty)``: also
        the arc scores of an RNN-T-topology table (``_row_arcs``) into the two float64
        ``(B, T, U1, 1)`` grids (shaped as ``row_sum``); ``targets (B, S)`` int64.
        ``logprobs``: rows of log-probabilities, RNN-T's arcs read off them
        (``_logprob_prologue_job``: ``arcs`` given, no ``g``, no shifts or sums)."""
        jb, j0, j1, cost = self.jobs
        bad = np.zeros(len(cost), np.uint8)
        i64 = np.int64
        if arcs is None:
            f64 = np.zeros(1, np.float64)
            arg = (False, np.zeros((1, 1), i64), 0, own_lines(np.zeros(1, i64)), 0.0, 0.0, f64,
                   f64)
        else:
            ab, ae, cls, tg, sigma, dp = arcs
            tgn = np.ascontiguousarray(tg.numpy().astype(i64))
            if tgn.ndim != 2 or tgn.shape[1] == 0:
                tgn = np.zeros((len(self.Tl), 1), i64)
            arg = (True, tgn, int(cls), own_lines(np.asarray(self.Tl, i64)), float(sigma),
                   float(dp), ab.view(-1).numpy(), ae.view(-1).numpy())
        if cost and logprobs:
            tgn, cls, Tla, sigma, dp, abn, aen = arg[1:]
            run_jobs(_logprob_prologue_job, (*self._addr(self.x), self.V, jb, j0, j1, self.ub1,
                                             self.ro, self.rst, bad, tgn, cls, Tla, sigma, dp,
                                             abn, aen),
                     range(len(cost)), order=cost, work=sum(cost) * self.V)
        elif cost:
            xa = self._addr(self.x)
            same = g is not None and self._same(g)
            ga = xa if g is None or same else self._addr(g)  # the very same rows if same
            if self.hat_blank >= 0:
                if same:
                    raise ValueError("HAT's row passes write no gradient over the logits")
                tgn, _, Tla, sigma, dp, abn, aen = arg[1:]
                run_jobs(_hat_prologue_job, (*xa, g is not None, *ga, self.V, self.hat_blank,
                                             jb, j0, j1, self.ub1, self.rm, self.rs, self.ro,
                                             self.rst, self.hat_lsb.view(-1).numpy(), bad,
                                             arg[0], tgn, Tla, sigma, dp, abn, aen),
                         range(len(cost)), order=cost, work=sum(cost) * self.V)
            else:
                run_jobs(_prologue_job, (*xa, g is not None, bool(same), *ga, self.V, jb, j0,
                                         j1, self.ub1, self.rm, self.rs, self.ro, self.rst, bad,
                                         *arg),
                         range(len(cost)), order=cost, work=sum(cost) * self.V)
        seq_bad = np.zeros(len(self.Tl), bool)
        np.logical_or.at(seq_bad, jb[: len(cost)], bad.astype(bool))
        return seq_bad

    def _same(self, g: torch.Tensor) -> bool:
        return (g.data_ptr() == self.x.data_ptr() and g.stride() == self.x.stride()
                and g.shape == self.x.shape)

    def epilogue(self, g: torch.Tensor, ob: torch.Tensor, oe: torch.Tensor, cls: list[int],
                 tg: torch.Tensor, scale: float, clamp: float, gscale: float,
                 skip: np.ndarray, emit_last: bool = False, *, scaled: bool = True,
                 window: tuple[int, int, int] | None = None) -> None:
        """The gradient into ``g``, whose rows hold ``exp(x - m)`` from ``prologue(g)``
        (see ``_epilogue_job``; HAT: ``_hat_epilogue_job``); ``g`` may be the logits.
        ``emit_last``: the last row of each sequence has emission arcs too (a tile of a
        longer lattice). ``g``'s classes may lie at any stride. ``scaled=False``: the
        gradient of log-probabilities (``g``'s rows overwritten). ``window=(b, t0, t1)``:
        ``g`` is a contiguous ``(t1 - t0, U_b + 1, V)`` block holding sequence ``b``'s rows
        of frames ``t0 <= t < t1`` (a float32 temporary of a half-precision gradient), the
        rest as for the whole batch."""
        jb, j0, j1, cost = self.jobs if window is None else self._window_jobs(*window)
        if not cost:
            return
        ga = self._addr(g) if window is None else self._window_addr(g, *window)
        gsv = g.stride(-1) if g.shape[-1] > 1 else 1
        tgn, ue = self._targets(tg, emit_last)
        occ = (ob.contiguous().numpy(), oe.contiguous().numpy())
        fl = (float(scale), float(clamp), float(gscale), own_lines(skip.astype(np.uint8)))
        if self.hat_blank >= 0:
            if not scaled:
                raise ValueError("a 'hat' table takes raw logits (fused_log_softmax=True)")
            job, ga = ((_hat_epilogue_job, ga) if gsv == 1
                       else (_hat_epilogue_any_job, (*ga, gsv)))
            run_jobs(job, (*ga, self.V, self.hat_blank, jb, j0, j1, self.ub1, ue, self.rs,
                           self.ro, self.rst, *occ, self.hat_lsb.view(-1).numpy(), tgn, *fl),
                     range(len(cost)), order=cost, work=sum(cost) * self.V)
            return
        job, ga, last = ((_epilogue_job, ga, ()) if gsv == 1 and scaled
                         else (_epilogue_any_job, (*ga, gsv), (bool(scaled),)))
        run_jobs(job, (*ga, self.V, jb, j0, j1, self.ub1, ue, self.rs, self.ro, self.rst, *occ,
                       own_lines(np.asarray(cls, np.int64)), tgn, *fl, *last),
                 range(len(cost)), order=cost, work=sum(cost) * self.V)

    def _window_jobs(self, b: int, t0: int, t1: int) -> tuple:
        """``self.jobs`` for sequence ``b``'s frames ``t0 <= t < t1`` alone."""
        jb, j0, j1, cost = _jobs([t1 - t0], [self.Ul[b]], self.V)
        n = len(cost)
        jb[:n] = b
        j0[:n] += t0
        j1[:n] += t0
        return jb, j0, j1, cost

    def _window_addr(self, g: torch.Tensor, b: int, t0: int, t1: int) -> tuple:
        """``_addr`` of a contiguous block of sequence ``b``'s rows from frame ``t0``: its
        row ``(t, u)`` at ``(t - t0) (U_b + 1) V + u V`` (the other sequences unread)."""
        i64 = np.int64
        B, st = len(self.Tl), (self.Ul[b] + 1) * self.V
        o = np.zeros(B, i64)
        o[b] = -t0 * st  # rows t >= t0 only: every index formed is >= 0
        return (g.view(-1).numpy(), own_lines(o), own_lines(np.full(B, st, i64)),
                own_lines(np.full(B, self.V, i64)))

    def _targets(self, tg: torch.Tensor, emit_last: bool) -> tuple[np.ndarray, np.ndarray]:
        tgn = np.ascontiguousarray(tg.numpy().astype(np.int64))
        if tgn.ndim != 2 or tgn.shape[1] == 0:
            tgn = np.zeros((len(self.Tl), 1), np.int64)
        return tgn, (self.ub1 if emit_last else own_lines(self.ub1 - 1))


# --------------------------------------------------------------------------- window
@njit(nogil=True, cache=True, error_model="numpy", fastmath=_FM)
def _window_job(x, xs, T, R, V, sym, term, px, py, lz, step, job):
    """Rows ``i = (b T + t) R + r`` in ``[job step, (job + 1) step)`` of a pruned joint's
    window ``x (B, T, R, V)`` (row at ``b xs[0] + t xs[1] + r xs[2]``): ``lz[i]``, the
    row's log-normalizer (float64, ``-inf`` for a row of ``-inf``), and its two arcs
    ``px[i] = x[sym[i]] - lz``, ``py[i] = x[term] - lz`` (as ``(x - m) - log s``: exact
    where the row's maximum is the arc's logit; ``-inf`` for a row of ``-inf``, the rule
    of ``_core/logspace.py``). NaN or ``+inf`` in a row gives NaN arcs."""
    acc = np.empty(_LANES, x.dtype)
    zero = x.dtype.type(0.0)  # (np.zeros: one more overload to compile)
    for i in range(job * step, min(px.shape[0], (job + 1) * step)):
        f = i // R
        o = (f // T) * xs[0] + (f % T) * xs[1] + (i - f * R) * xs[2]
        xrow = x[o : o + V]
        m = _row_max(xrow, V, acc)
        if m == -np.inf:  # a row of -inf: shift 0, s = 0, ls = -inf, arcs -inf
            m = zero
        s = zero
        for v in range(V):
            s += _exp(xrow[v] - m)
        ls = math.log(np.float64(s)) if s > 0 else (-np.inf if s == 0 else np.nan)
        mm = np.float64(m)
        lz[i] = mm + ls
        px[i] = _sub_normalizer(np.float64(xrow[sym[i]]) - mm, ls)
        py[i] = _sub_normalizer(np.float64(xrow[term]) - mm, ls)


def window_arcs(x: torch.Tensor, sym: torch.Tensor, term: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A pruned joint's window ``x (B, T, R, V)`` (float32/float64, unit stride along the
    classes): ``(px, py, lz)``, ``(B, T, R)``, the log-probabilities of each row's symbol
    ``sym (B, T, R)`` and of ``term`` in ``x``'s dtype, and the float64 log-normalizer.
    One read of the window, where torch's ``logsumexp`` makes four passes over a
    window-sized temporary."""
    B, T, R, V = x.shape
    px = torch.empty((B, T, R), dtype=x.dtype)
    py = torch.empty_like(px)
    lz = torch.empty((B, T, R), dtype=torch.float64)
    N = B * T * R
    if N:
        step = max(1, min(N, (1 << 18) // max(V, 1), N // (4 * max(1, torch.get_num_threads()))))
        run_jobs(_window_job, (_flat(x), own_lines(np.asarray(x.stride()[:3], np.int64)), T, R,
                               V, sym.to(torch.int64).contiguous().view(-1).numpy(), int(term),
                               px.view(-1).numpy(), py.view(-1).numpy(), lz.view(-1).numpy(),
                               step),
                 range((N + step - 1) // step), work=N * V)
    return px, py, lz


# --------------------------------------------------------------------------- tiles
# The epilogue alone, on a tile of rows whose occupations are known (the losses from the
# joint recompute each tile's logits in their backward): ``joint_tile_grad``, the
# reference's ``joint_tile_grad`` through ``grad_row``. No "reassoc" here: the split
# normalizer ``(x - hi) - lo`` must not be regrouped as ``x - (hi + lo)`` (and these rows
# sum nothing).
_FM_TILE = {"contract", "nsz", "arcp"}


@njit(inline="always", cache=True, error_model="numpy")
def _exp_row(x, xo, same, g, go, n, lz):
    """``g[go : go + n] = exp(x[xo : xo + n] - lz)``, ``lz`` float64 split into its rounding
    to ``g``'s dtype and the rest, subtracted in turn (exact where ``x`` is near ``lz``,
    where ``exp`` is large; rounded once, ``lz`` put 3e-7 to 7e-7 of relative error in
    the gradient of logits of scale 10 to 30); ``lz = -inf`` (no finite logit) gives 0.
    ``same``: ``x`` is ``g``'s buffer, read through ``g`` (see ``_prologue_job``)."""
    z = lz if lz > -np.inf else np.inf
    hi = g.dtype.type(z)
    lo = g.dtype.type(z - np.float64(hi)) if abs(hi) < np.inf else g.dtype.type(0.0)
    u0 = np.uint64(go)
    if same:
        for v in range(n):
            k = u0 + np.uint64(v)
            g[k] = _exp((g[k] - hi) - lo)
    else:
        ux = np.uint64(xo)
        for v in range(n):
            g[u0 + np.uint64(v)] = _exp((x[ux + np.uint64(v)] - hi) - lo)


@njit(inline="always", cache=True, error_model="numpy")
def _tile_part(buf, o, V, D, occf, oc, cls, dcls, y, hb, sig, clamp, gscale, tiny):
    """One part of a row's gradient over its probabilities in ``buf[o : o + V + D]``
    (weights and occupations at ``occf[oc:]``, see ``joint_tile_grad``), times the part's
    factor ``gscale`` (``grad_row`` flushes its products: a clamped value times a
    reduction's ``1 / B`` can be subnormal)."""
    w, wd, oe = occf[oc], occf[oc + 1], occf[oc + 2]
    # One grad_row call for both normalizers (each call site is one more inlined copy to
    # compile): HAT's labels weigh the emission, its blank's sigmoid every arc.
    ww, nc, gb = w, cls.shape[0], 0.0
    if hb >= 0:
        ww, nc, gb = oe, 0, sig * w - occf[oc + 3]
    grad_row(buf, o, V, True, buf.dtype.type(ww), False, cls, occf, oc + 3, nc, y, oe, hb, gb,
             clamp, gscale, tiny)
    if D:
        grad_row(buf, o + V, D, True, buf.dtype.type(wd), False, dcls, occf,
                 oc + 3 + cls.shape[0], D, -1, 0.0, -1, 0.0, clamp, gscale, tiny)


@njit(nogil=True, cache=True, error_model="numpy", fastmath=_FM_TILE)
def _tile_job(x, xs, same, g, gs, NT, NU, V, D, lz, lzd, occ, cls, dcls, tg, hb, clamp, gscale,
              step, job):
    """Frames ``[job step, (job + 1) step)`` of the tile (frame ``f = b NT + t``, its rows
    ``r = f NU + u`` at ``x[b xs[0] + t xs[1] + u xs[2]]``; ``g``: ``gs``):
    ``joint_tile_grad``'s gradient, in place over each row's probabilities. One part:
    ``grad_row`` on the row; several (clamped branches): each on a copy, summed."""
    R = lz.shape[0]
    K = clamp.shape[0]
    C = occ.shape[1]
    W = V + D
    occf = occ.reshape(-1)
    tiny = np.finfo(g.dtype).tiny
    tmp = np.empty(W if K > 1 else 0, g.dtype)
    acc = np.empty(W if K > 1 else 0, np.float64)
    for f in range(job * step, min(R // NU, (job + 1) * step)):
        b = f // NT
        t = f - b * NT
        for u in range(NU):
            r = f * NU + u
            xo = b * xs[0] + t * xs[1] + u * xs[2]
            go = b * gs[0] + t * gs[1] + u * gs[2]
            sig = 0.0
            if hb >= 0:  # read before the row is overwritten
                zb = np.float64(g[go + hb] if same else x[xo + hb])
                sig = 1.0 / (1.0 + math.exp(-zb))
            _exp_row(x, xo, same, g, go, V, lz[r])
            if D:
                _exp_row(x, xo + V, same, g, go + V, D, lzd[r])
            y = tg[b, u]
            # One _tile_part call site (each is one more inlined copy to compile): the row
            # itself for one part, else a copy per part, summed.
            for v in range(W if K > 1 else 0):
                acc[v] = 0.0
            for k in range(K):
                buf, bo = g, go
                if K > 1:
                    for v in range(W):
                        tmp[v] = g[go + v]
                    buf, bo = tmp, 0
                _tile_part(buf, bo, V, D, occf, (k * R + r) * C, cls, dcls, y, hb, sig,
                           clamp[k], gscale[k, b], tiny)
                for v in range(W if K > 1 else 0):
                    acc[v] += tmp[v]
            for v in range(W if K > 1 else 0):
                a = g.dtype.type(acc[v])
                g[go + v] = 0.0 if abs(a) < tiny else a


def joint_tile_grad(x: torch.Tensor, lz: torch.Tensor, lzd: torch.Tensor | None,
                    occ: torch.Tensor, cls: tuple[int, ...], targets: torch.Tensor,
                    hat_blank: int, clamp: tuple[float, ...], gscale: torch.Tensor,
                    out: torch.Tensor) -> torch.Tensor:
    """See ``seqloss.transducer.joint.reference.joint_tile_grad``: every row through
    ``grad_row`` (the token block, and the duration block as a softmax of its own), one
    job per block of rows on the shared pool, ``out`` may be ``x``."""
    nb, NT, NU, W = x.shape
    K = occ.shape[0]
    D = occ.shape[-1] - 3 - len(cls)
    V = W - D
    R = nb * NT * NU
    if R == 0:
        return out
    i64, f64 = np.int64, np.float64
    same = (out.data_ptr() == x.data_ptr() and out.stride() == x.stride())
    lzn = lz.to(torch.float64).contiguous().view(-1).numpy()
    lzdn = lzn if lzd is None else lzd.to(torch.float64).contiguous().view(-1).numpy()
    occn = occ.to(torch.float64).contiguous().view(K * R, -1).numpy()
    tgn = targets.to(torch.int64).contiguous().numpy()
    per = max(1, min(1 << 20, R * W // (8 * max(1, torch.get_num_threads()))))
    step = max(1, per // max(NU * W, 1))  # frames a job
    xa = _flat(x)
    ga = xa if same else _flat(out)
    run_jobs(_tile_job, (xa, own_lines(np.asarray(x.stride()[:3], i64)), same, ga,
                         own_lines(np.asarray(out.stride()[:3], i64)), NT, NU, V, D, lzn, lzdn,
                         occn, own_lines(np.asarray(cls, i64)), own_lines(np.arange(D, dtype=i64)),
                         tgn, int(hat_blank), own_lines(np.asarray(clamp, f64)),
                         gscale.to(torch.float64).contiguous().numpy(), step),
             range((nb * NT + step - 1) // step), work=R * W)
    return out
