r"""The transducer lattice on CPU with Numba: alpha, beta and the arc occupations.

Implements ``transducer_lattice`` of ``seqloss.transducer.lattice.reference`` (same
signature and semantics). Sequences (and the two directions) are independent jobs on
the one fork-safe thread pool of GIL-free calls (``seqloss._core.numba_pool``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from ..._core.numba_exp import vexp, vlog1pexp
from ..._core.numba_pool import own_lines, run_jobs
from .reference import viterbi_order

NEG_INF = float("-inf")
NAN = float("nan")


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@njit(cache=True, nogil=True, inline="always")
def _term(a, x):
    # ``a + x`` with ``-inf`` an exact zero on either side: an arc out of an
    # unreachable state, or a masked arc, adds nothing even when the other side is
    # NaN, so a non-finite score that no complete path takes cannot poison the sum.
    v = a + x
    if v != v and (a == NEG_INF or x == NEG_INF):  # tested only on the rare NaN
        return NEG_INF
    return v


@njit(cache=True, nogil=True, error_model="numpy")
def _sweep_rnnt(arc_blank, arc_emit, Tb, Ub, out, backward):
    """Alpha (``backward`` 0) or beta (1) of one sequence with RNN-T's arcs (blank +1
    frame, emission +0 frames), in float64 whatever the arcs' dtype.

    Both are one recursion in sweep coordinates ``(i, j)``: alpha's ``(t, u)``, beta's
    ``(T_b - t, U_b - u)``; state ``(i, j)`` is the logaddexp of ``(i - 1, j)`` plus its
    blank arc and ``(i, j - 1)`` plus its emission (an arc that does not exist is -inf).
    Swept by anti-diagonals ``i + j = n``, whose states do not depend on each other: a
    diagonal is kept contiguous in a rolling buffer (its arcs gathered first), so the
    branch-free logaddexp (``vlog1pexp``, no libm call) vectorizes; row order would chain
    every state on the previous one. ``-inf`` is an exact zero on either side of a term,
    even beside a NaN (an arc no complete path takes cannot poison the sum); a NaN that a
    path takes gives NaN.

    Updates: ``out[:T_b + 1, :U_b + 1]``.
    """
    # Rolling diagonals, offset by one so that j - 1 = -1 reads an -inf that is never written.
    prev = np.full(Ub + 2, NEG_INF)
    cur = np.full(Ub + 2, NEG_INF)
    xb = np.empty(Ub + 1, dtype=np.float64)
    xe = np.empty(Ub + 1, dtype=np.float64)
    prev[1] = 0.0
    if backward:
        out[Tb, Ub] = 0.0
    else:
        out[0, 0] = 0.0
    flo, fhi = 0, 0  # the previous diagonal's states that are not -inf lie in [flo, fhi]
    for n in range(1, Tb + Ub + 1):
        lo = max(0, n - Tb)
        hi = min(n, Ub)
        # Only states next to a reachable one can be reachable: a pruned lattice (a band
        # of a few rows) costs its band, not the whole diagonal.
        clo = max(lo, flo)
        m = min(hi, fhi + 1) - clo + 1
        for k in range(max(m, 0)):
            j = clo + k
            i = n - j
            if backward:  # state (Tb - i, Ub - j): both its arcs leave frame Tb - i < Tb
                t, u = Tb - i, Ub - j
                xb[k] = arc_blank[t, u, 0] if i >= 1 else NEG_INF
                xe[k] = arc_emit[t, u, 0] if (j >= 1 and i >= 1) else NEG_INF
            else:  # state (i, j): from (i - 1, j) by a blank, from (i, j - 1) by an emission
                xb[k] = arc_blank[i - 1, j, 0] if i >= 1 else NEG_INF
                xe[k] = arc_emit[i, j - 1, 0] if (j >= 1 and i < Tb) else NEG_INF
        for j in range(lo, hi + 1):
            cur[j + 1] = NEG_INF
        flo, fhi = hi + 1, lo - 1
        if m > 0:
            # Views from index 0: LLVM then knows the indices are not negative and vectorizes.
            pb = prev[clo + 1:clo + 1 + m]
            pe = prev[clo:clo + m]
            c = cur[clo + 1:clo + 1 + m]
            for k in range(m):
                a = pb[k] + xb[k]
                a = NEG_INF if (pb[k] == NEG_INF or xb[k] == NEG_INF) else a
                b = pe[k] + xe[k]
                b = NEG_INF if (pe[k] == NEG_INF or xe[k] == NEG_INF) else b
                r = (a if a > b else b) + vlog1pexp(-abs(a - b))  # NaN on either side: NaN
                c[k] = NEG_INF if (a == NEG_INF and b == NEG_INF) else r
            for k in range(m):
                if c[k] != NEG_INF:  # NaN included: it must reach the end
                    flo = min(flo, clo + k)
                    fhi = clo + k
        for j in range(lo, hi + 1):
            if backward:
                out[Tb - n + j, Ub - j] = cur[j + 1]
            else:
                out[n - j, j] = cur[j + 1]
        prev, cur = cur, prev


@njit(cache=True, nogil=True, inline="always")
def _lse(buf, n):
    """``log sum exp`` of ``buf[:n]``: the max, then one ``exp`` per term and one ``log``
    (not ``n - 1`` guarded logaddexps: half the transcendental calls on a many-arc
    state). ``-inf`` terms are exact zeros; a NaN term gives NaN; no epsilon."""
    m = NEG_INF
    for k in range(n):
        v = buf[k]
        if v > m or v != v:
            m = v
            if v != v:
                return v
    if m == NEG_INF or m == math.inf:
        return m
    s = 0.0
    for k in range(n):
        s += math.exp(buf[k] - m)
    return m + math.log(s)


@njit(cache=True, nogil=True)
def _alpha(arc_blank, arc_emit, Tb, Ub, bd, ed, ce, alpha):
    """Forward variables of one sequence (states t <= Tb, u <= Ub).

    ``ce`` (emit_can_end): 1 lets an emission land on frame ``Tb``, 0 stops it at ``Tb - 1``.
    """
    buf = np.empty(bd.shape[0] + ed.shape[0], dtype=np.float64)
    for t in range(Tb + 1):
        for u in range(Ub + 1):
            if t == 0 and u == 0:
                alpha[0, 0] = 0.0
                continue
            n = 0
            for i in range(bd.shape[0]):
                ts = t - bd[i]
                if ts >= 0:
                    buf[n] = _term(alpha[ts, u], arc_blank[ts, u, i])
                    n += 1
            if u > 0 and t < Tb + ce:
                for j in range(ed.shape[0]):
                    ts = t - ed[j]
                    if 0 <= ts < Tb:  # arcs leave frames t < Tb only
                        buf[n] = _term(alpha[ts, u - 1], arc_emit[ts, u - 1, j])
                        n += 1
            alpha[t, u] = _lse(buf, n)


@njit(cache=True, nogil=True)
def _beta(arc_blank, arc_emit, Tb, Ub, bd, ed, ce, beta):
    """Backward variables of one sequence; beta(Tb, Ub) = 0."""
    neg = arc_blank.dtype.type(NEG_INF)
    buf = np.empty(bd.shape[0] + ed.shape[0], dtype=np.float64)
    for u in range(Ub + 1):
        beta[Tb, u] = neg
    beta[Tb, Ub] = 0.0
    for t in range(Tb - 1, -1, -1):
        for u in range(Ub, -1, -1):
            n = 0
            for i in range(bd.shape[0]):
                td = t + bd[i]
                if td <= Tb:
                    buf[n] = _term(beta[td, u], arc_blank[t, u, i])
                    n += 1
            if u < Ub:
                for j in range(ed.shape[0]):
                    td = t + ed[j]
                    if td < Tb + ce:
                        buf[n] = _term(beta[td, u + 1], arc_emit[t, u, j])
                        n += 1
            beta[t, u] = _lse(buf, n)


@njit(cache=True, nogil=True)
def transducer_alpha_beta_kernel(arc_blank, arc_emit, Tl, Ul, bd, ed, ce, alpha, beta, ll, job):
    """Any durations. Job ``2 b``: sequence ``b``'s alpha and ``ll[b]``; job ``2 b + 1``:
    its beta.

    Updates: ``alpha[b, :T_b+1, :U_b+1]`` and ``ll[b]``, or ``beta[b, :T_b+1, :U_b+1]``.
    """
    b = job // 2
    if job % 2 == 0:
        _alpha(arc_blank[b], arc_emit[b], Tl[b], Ul[b], bd, ed, ce, alpha[b])
        ll[b] = alpha[b, Tl[b], Ul[b]] if Tl[b] > 0 else NEG_INF
    else:
        _beta(arc_blank[b], arc_emit[b], Tl[b], Ul[b], bd, ed, ce, beta[b])


@njit(cache=True, nogil=True)
def _rnnt_alpha_beta_kernel(arc_blank, arc_emit, Tl, Ul, alpha, beta, ll, job):
    """RNN-T's durations: as ``transducer_alpha_beta_kernel``, by ``_sweep_rnnt``.

    A kernel of its own so that an RNN-T call compiles neither ``_alpha`` nor ``_beta``
    (the general durations), and one call site with a run-time direction: a literal 0
    and 1 compiled the sweep twice (Numba specializes on literal arguments).
    """
    b = job // 2
    d = job % 2
    _sweep_rnnt(arc_blank[b], arc_emit[b], Tl[b], Ul[b], beta[b] if d else alpha[b], d)
    if d == 0:
        ll[b] = alpha[b, Tl[b], Ul[b]] if Tl[b] > 0 else NEG_INF


@njit(cache=True, nogil=True)
def transducer_occupation_kernel(arc_blank, arc_emit, Tl, Ul, bd, ed, ce, alpha, beta, ll,
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
                    x = _term(_term(a, arc_blank[b, t, u, i]), beta[b, td, u])
                    occ_blank[b, t, u, i] = math.exp(x - lb)
            if u < Ub:
                for j in range(ed.shape[0]):
                    td = t + ed[j]
                    if td < Tb + ce:
                        x = _term(_term(a, arc_emit[b, t, u, j]), beta[b, td, u + 1])
                        occ_emit[b, t, u, j] = math.exp(x - lb)


@njit(cache=True, nogil=True, error_model="numpy")
def _rnnt_occupation_kernel(ab, ae, Tl, Ul, alpha, beta, ll, occ_b, occ_e, job):
    """RNN-T's arc occupations of sequence ``b = job``, every entry of its rows written
    (0 where no path reads: frames ``t >= T_b``, rows ``u > U_b``, emissions at ``U_b``,
    and the whole sequence without a path). ``exp(alpha + arc + beta - ll)`` along
    ``u`` with the vectorized ``vexp`` (torch's ops here woke its OpenMP workers, which
    then compete with this pool for the cores)."""
    b = job
    Tb, Ub = Tl[b], Ul[b]
    T, U1 = occ_b.shape[1], occ_b.shape[2]
    lb = ll[b]
    ok = lb != NEG_INF and lb == lb
    for t in range(T):
        ob = occ_b[b, t, :, 0]
        oe = occ_e[b, t, :, 0]
        if not ok or t >= Tb:
            ob[:] = 0.0
            oe[:] = 0.0
            continue
        a = alpha[b, t]
        bn = beta[b, t + 1]
        bs = beta[b, t]
        xb = ab[b, t, :, 0]
        xe = ae[b, t, :, 0]
        # The exponent in float64 (alpha, beta: thousands of nats), the exp in the
        # output's precision. Exactly 0 where either end state or the arc is -inf (an
        # arc no complete path takes), whatever the other terms hold: 0 * NaN must not
        # reach a gradient.
        for u in range(Ub + 1):
            v = vexp(ob.dtype.type(a[u] + xb[u] + bn[u] - lb))
            ob[u] = 0.0 if (a[u] == NEG_INF or xb[u] == NEG_INF or bn[u] == NEG_INF) else v
        for u in range(Ub):
            v = vexp(oe.dtype.type(a[u] + xe[u] + bs[u + 1] - lb))
            oe[u] = 0.0 if (a[u] == NEG_INF or xe[u] == NEG_INF or bs[u + 1] == NEG_INF) else v
        for u in range(Ub + 1, U1):
            ob[u] = 0.0
        for u in range(Ub, U1):
            oe[u] = 0.0


def transducer_lattice(
    arc_blank: torch.Tensor,
    arc_emit: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank_durations: tuple[int, ...],
    emit_durations: tuple[int, ...],
    compute_occupations: bool,
    emit_can_end: bool = False,
    occupation_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """See ``seqloss.transducer.lattice.reference.transducer_lattice``.

    ``occupation_dtype``: the dtype the occupations of many-arc lattices are stored in
    (default: the arcs'); each is computed in float64 and rounded once. The joint of a
    float32 input asks for float32: half the memory of the largest small tensors.
    """
    B, T, U1, _ = arc_blank.shape
    dt = arc_blank.dtype
    ab = arc_blank.contiguous()
    ae = arc_emit.contiguous()
    Tl = own_lines(logit_lengths.cpu().numpy().astype(np.int64))
    Ul = own_lines(target_lengths.cpu().numpy().astype(np.int64))
    bd = own_lines(np.asarray(blank_durations, dtype=np.int64))
    ed = own_lines(np.asarray(emit_durations, dtype=np.int64))
    # alpha and beta in float64 whatever the arcs' dtype: they grow to thousands of nats,
    # where float32's rounding (6e-5 at 1000) summed over T + U steps left the occupations
    # exp(alpha + arc + beta - ll) wrong by 1e-3 to 1e-2 (T = 1000 to 4000). The arcs
    # are read as they are; each occupation is formed in float64 and rounded once.
    alpha = torch.empty((B, T + 1, U1), dtype=torch.float64)
    beta = (torch.empty((B, T + 1, U1), dtype=torch.float64) if compute_occupations
            else alpha.new_empty((B, 1, 1)))
    ll = torch.empty((B,), dtype=torch.float64)
    ce = int(bool(emit_can_end))
    rnnt = bd.tolist() == [1] and ed.tolist() == [0] and not ce
    # Beta only when the occupations need it; each direction of each sequence is a job.
    jobs = range(2 * B) if compute_occupations else range(0, 2 * B, 2)
    cost = [Tl[j // 2] * (Ul[j // 2] + 1) for j in jobs]
    if rnnt:
        run_jobs(_rnnt_alpha_beta_kernel,
                 (ab.numpy(), ae.numpy(), Tl, Ul, alpha.numpy(), beta.numpy(), ll.numpy()),
                 jobs, order=cost)
    else:
        run_jobs(transducer_alpha_beta_kernel,
                 (ab.numpy(), ae.numpy(), Tl, Ul, bd, ed, ce, alpha.numpy(), beta.numpy(),
                  ll.numpy()),
                 jobs, order=cost)
    ll_out = ll if dt == torch.float64 else torch.from_numpy(ll.numpy().astype(np.float32))
    if not compute_occupations:
        return ll_out, arc_blank.new_empty(0), arc_emit.new_empty(0)
    if rnnt:
        occ_b = torch.empty(ab.shape, dtype=dt)
        occ_e = torch.empty(ae.shape, dtype=dt)
        run_jobs(_rnnt_occupation_kernel,
                 (ab.numpy(), ae.numpy(), Tl, Ul, alpha.numpy(), beta.numpy(), ll.numpy(),
                  occ_b.numpy(), occ_e.numpy()),
                 range(B), order=Tl * (Ul + 1))
    else:
        occ_b = torch.empty(ab.shape, dtype=occupation_dtype or dt)
        occ_e = torch.empty(ae.shape, dtype=occupation_dtype or dt)
        run_jobs(transducer_occupation_kernel,
                 (ab.numpy(), ae.numpy(), Tl, Ul, bd, ed, ce, alpha.numpy(), beta.numpy(),
                  ll.numpy(), occ_b.numpy(), occ_e.numpy()),
                 range(B), order=Tl * (Ul + 1))
    return ll_out, occ_b, occ_e



# --------------------------------------------------------------------------- max-plus
@njit(cache=True, nogil=True)
def viterbi_kernel(arc_blank, arc_emit, Tl, Ul, kind, idx, dur, ce, score, frames, arcs, b):
    """Sequence ``b``: the max-plus recursion with back-pointers, then the backtrack.

    Candidates in the tie-break order of ``reference.viterbi_order`` (``kind`` 1 for an
    emission, ``idx`` the arc's index, ``dur`` its duration); a later one wins only when
    strictly greater, so -inf and NaN never win. Row order: every arc into ``(t, u)``
    leaves a state of an earlier row, or of the same row at ``u - 1``.

    Updates: ``score[b]``, ``frames[b, :U_b]``, ``arcs[b, :U_b]`` (prefilled -inf, -1).
    """
    Tb, Ub = Tl[b], Ul[b]
    if Tb == 0:
        return
    K = kind.shape[0]
    delta = np.empty((Tb + 1, Ub + 1), dtype=np.float64)
    bp = np.empty((Tb + 1, Ub + 1), dtype=np.int64)
    delta[0, 0] = 0.0
    bp[0, 0] = -1
    for t in range(Tb + 1):
        for u in range(1 if t == 0 else 0, Ub + 1):
            best = NEG_INF
            arg = -1
            for k in range(K):
                ts = t - dur[k]
                if ts < 0:
                    continue
                if kind[k] == 0:
                    v = delta[ts, u] + np.float64(arc_blank[b, ts, u, idx[k]])
                else:
                    if u == 0 or ts >= Tb or t >= Tb + ce:
                        continue
                    v = delta[ts, u - 1] + np.float64(arc_emit[b, ts, u - 1, idx[k]])
                if v > best:
                    best = v
                    arg = k
            delta[t, u] = best
            bp[t, u] = arg
    score[b] = delta[Tb, Ub]
    if not delta[Tb, Ub] > NEG_INF:
        return
    t, u = Tb, Ub
    while bp[t, u] >= 0:
        k = bp[t, u]
        t -= dur[k]
        if kind[k] == 1:
            u -= 1
            frames[b, u] = t
            arcs[b, u] = idx[k]


def transducer_viterbi(
    arc_blank: torch.Tensor,
    arc_emit: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank_durations: tuple[int, ...],
    emit_durations: tuple[int, ...],
    emit_can_end: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """See ``seqloss.transducer.lattice.reference.transducer_viterbi``."""
    B, T, U1, _ = arc_blank.shape
    score = torch.full((B,), NEG_INF, dtype=torch.float64)
    frames = torch.full((B, U1 - 1), -1, dtype=torch.int64)
    arcs = torch.full((B, U1 - 1), -1, dtype=torch.int64)
    if T == 0 or B == 0:
        return score, frames, arcs
    order = viterbi_order(blank_durations, emit_durations)
    kind, idx, dur = (own_lines(np.asarray(c, dtype=np.int64)) for c in zip(*order, strict=True))
    Tl = own_lines(logit_lengths.cpu().numpy().astype(np.int64))
    Ul = own_lines(target_lengths.cpu().numpy().astype(np.int64))
    # Numba cannot view a zero-size axis reliably; with U = 0 nothing is written to these.
    fr = frames if U1 > 1 else frames.new_full((B, 1), -1)
    ar = arcs if U1 > 1 else arcs.new_full((B, 1), -1)
    run_jobs(viterbi_kernel,
             (arc_blank.contiguous().numpy(), arc_emit.contiguous().numpy(), Tl, Ul, kind, idx,
              dur, int(bool(emit_can_end)), score.numpy(), fr.numpy(), ar.numpy()),
             range(B), order=Tl * (Ul + 1))
    return score, frames, arcs
