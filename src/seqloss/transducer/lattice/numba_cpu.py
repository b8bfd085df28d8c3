r"""The transducer lattice on CPU with Numba: alpha, beta and the arc occupations; the
best paths.

Implements ``transducer_lattice`` and ``transducer_viterbi`` of
``seqloss.transducer.lattice.reference`` (same signatures and semantics), both by the
one recursion, ``sweep``, in the log or the max-plus semiring. Sequences (and the two
directions) are independent jobs on the one fork-safe thread pool of GIL-free calls
(``seqloss._core.numba_pool``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import literally, njit

from ..._core.numba_exp import vexp, vlog1pexp
from ..._core.numba_pool import CELL, own_lines, run_jobs
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


@njit(inline="always", cache=True, nogil=True, error_model="numpy")
def logadd2(z, y):
    """The log semiring's ``log(exp z + exp y)``, branch-free (``vlog1pexp``): NaN on
    either side gives NaN; both ``-inf`` (no path) or both ``+inf`` give that infinity."""
    r = (z if z > y else y) + vlog1pexp(-abs(z - y))
    return z if (z == y and abs(z) == math.inf) else r


@njit(inline="always", cache=True, nogil=True, error_model="numpy")
def max2(z, y):
    """Max-plus's ``max(z, y)`` where NaN never wins (``-inf`` when both are NaN): the
    best score of a state whose every candidate is NaN or ``-inf`` is ``-inf``."""
    z = z if z == z else NEG_INF
    return y if y > z else z


# The semiring of ``sweep``, a constant where it is called: Numba compiles the sweep
# once per value (a literal argument is part of the signature, ``literally`` insists
# on one) and prunes the branch on it before typing, so the inner loop holds the one
# semiring's addition, inlined like the rest (a branch there cost RNN-T's sweep 5-10%;
# an ``overload`` resolving to it by the literal was not inlined, and the sweep ran 2-3x
# slower, or, with its ``inline="always"``, warned while compiling). A jitted function
# passed as the argument would do the same, but a caller that passes one cannot be
# cached (Numba lowers it as a pointer to the Python object).
LOG = 0
MAXPLUS = 1


@njit(cache=True, nogil=True, error_model="numpy")
def sweep(P, E, Q, pc, qc, ec, qe, bd, ed, ce, Tb, Ub, out, backward, semiring):
    """Alpha (``backward`` 0) or beta (1) of one sequence, in float64 whatever the
    scores' dtype, in ``semiring`` (``LOG``; ``MAXPLUS``: Viterbi's best scores): the one
    recursion of the Numba lattice (every backend kernel of ``transducer_lattice``, the
    joint's table kernel and ``transducer_viterbi``'s run it).

    Arc scores, read where the arc leaves state ``(t, u)``: blank-like arc ``k``
    ``P[t, u, pc[k]] (+ Q[t, u, qc[k]] where qc[k] >= 0)``, advancing ``bd[k] >= 1``
    frames; emission ``k`` ``E[t, u, ec[k]] (+ Q[t, u, qe[k]])``, advancing ``ed[k] >= 0``
    frames and one label (landing on frame ``T_b`` only with ``ce`` = emit_can_end).
    The lattice (``P``, ``E``: its arc tensors, ``Q`` unread) and the joint's compact
    scores (blank classes, next label, duration log-probs) are both such a gather.

    One recursion in sweep coordinates ``(i, j)``: alpha's ``(t, u)``, beta's
    ``(T_b - t, U_b - u)``. Every arc advances ``n = i + j`` by at least 1 (a blank by
    its duration, an emission by its duration + 1), so the states of a diagonal do not
    depend on each other: swept by diagonals kept contiguous in a ring of
    ``max advance + 1`` of them (the arcs of a diagonal gathered first), the branch-free
    logaddexp (``vlog1pexp``, no libm call) or max vectorizes over the diagonal; row order
    would chain every state on the previous one. A diagonal is computed only over the
    hull of the states next to a reachable one (a pruned band costs its band).
    ``-inf`` is an exact zero on either side of a term, even beside a NaN (an arc no
    complete path takes cannot poison the sum); a NaN that a path takes gives NaN in the
    log semiring and never wins in max-plus.

    Updates: ``out[:T_b + 1, :U_b + 1]``.
    """
    literally(semiring)
    Db = bd.shape[0]
    A = Db + ed.shape[0]
    # Loops and np.empty, not adv.max(), np.full, np.zeros: each such overload is one more
    # compile (0.1-0.5 s of a fresh cache's first call), for a few values.
    adv = np.empty(A, np.int64)  # diagonals each arc advances
    R = 1
    for k in range(A):
        adv[k] = bd[k] if k < Db else ed[k - Db] + 1
        R = max(R, adv[k] + 1)
    # The ring, offset by one so that j - 1 = -1 reads an -inf that is never written.
    W = Ub + 2
    ring = np.empty(R * W, np.float64)
    ring[:] = NEG_INF
    # Per slot: the states written ([wlo, whi], cleared before reuse) and the reachable
    # ones ([rlo, rhi], not -inf), in j.
    wlo, whi = np.empty(R, np.int64), np.empty(R, np.int64)
    rlo, rhi = np.empty(R, np.int64), np.empty(R, np.int64)
    for k in range(R):
        wlo[k], whi[k], rlo[k], rhi[k] = 0, -1, 0, -1
    W1 = Ub + 1
    Pf, Ef, Qf, outf = P.reshape(-1), E.reshape(-1), Q.reshape(-1), out.reshape(-1)
    S = out.shape[1]
    x = np.empty(A * W1, np.float64)
    src_slot = np.empty(A, np.int64)
    ring[1] = 0.0
    wlo[0], whi[0], rlo[0], rhi[0] = 0, 0, 0, 0
    if backward:
        out[Tb, Ub] = 0.0
    else:
        out[0, 0] = 0.0
    slot = 0
    for n in range(1, Tb + Ub + 1):
        lo = max(0, n - Tb)
        hi = min(n, Ub)
        slot = slot + 1 if slot + 1 < R else 0
        clo, chi = hi + 1, lo - 1
        for a in range(A):
            s = slot - adv[a]
            s = s + R if s < 0 else s
            src_slot[a] = s
            if rlo[s] <= rhi[s]:  # a diagonal before the first reads an empty slot
                sj = 0 if a < Db else 1
                clo = min(clo, rlo[s] + sj)
                chi = max(chi, rhi[s] + sj)
        clo = max(clo, lo)
        chi = min(chi, hi)
        m = chi - clo + 1
        cb = slot * W
        for j in range(wlo[slot], whi[slot] + 1):
            ring[cb + j + 1] = NEG_INF
        wlo[slot], whi[slot] = clo, chi
        flo, fhi = hi + 1, lo - 1
        if m > 0:
            # Gather arc a into the states (i, j) = (n - j, j), j in [clo, chi]: those
            # where it exists are an interval [jl, jh] (-inf elsewhere), each a strided read.
            for a in range(A):
                if a < Db:
                    d, col, qcol = bd[a], pc[a], qc[a]
                    jl, jh = clo, min(chi, n - d)  # from / to frame t + d <= Tb
                    uo = 0
                else:
                    d, col, qcol = ed[a - Db], ec[a - Db], qe[a - Db]
                    if backward:  # out of frame t < Tb, u < Ub, landing before Tb + ce
                        jl, jh = max(clo, 1), min(chi, n - 1, n - d + ce - 1)
                    else:  # from frame n - j - d in [0, Tb), landing before Tb + ce
                        jl, jh = max(clo, 1, n - d - Tb + 1, n - Tb - ce + 1), min(chi, n - d)
                    uo = -1
                k0 = min(max(jl - clo, 0), m)
                k1 = max(min(jh - clo + 1, m), k0)
                if backward:  # the arc leaves (Tb - n + j, Ub - j)
                    t0, dt, u0, du = Tb - n + clo, 1, Ub - clo, -1
                else:  # the arc leaves (n - j - d, j + uo)
                    t0, dt, u0, du = n - d - clo, -1, clo + uo, 1
                xo = a * W1
                for k in range(k0):
                    x[xo + k] = NEG_INF
                for k in range(k1, m):
                    x[xo + k] = NEG_INF
                if k1 > k0:
                    # Flat, unsigned indices into the C-contiguous scores (one stride per
                    # arc): without Numba's negative-index wraparound the gather costs what
                    # RNN-T's own did (2-D indices: +10% on its sweep).
                    if a < Db:
                        K = P.shape[2]
                        f0 = (t0 * P.shape[1] + u0) * K + col
                        fs = (dt * P.shape[1] + du) * K
                        for k in range(k0, k1):
                            x[np.uint64(xo + k)] = Pf[np.uint64(f0 + fs * k)]
                    else:
                        K = E.shape[2]
                        f0 = (t0 * E.shape[1] + u0) * K + col
                        fs = (dt * E.shape[1] + du) * K
                        for k in range(k0, k1):
                            x[np.uint64(xo + k)] = Ef[np.uint64(f0 + fs * k)]
                    if qcol >= 0:
                        K = Q.shape[2]
                        f0 = (t0 * Q.shape[1] + u0) * K + qcol
                        fs = (dt * Q.shape[1] + du) * K
                        for k in range(k0, k1):
                            x[np.uint64(xo + k)] += Qf[np.uint64(f0 + fs * k)]
            # Views from index 0: LLVM then knows the indices are not negative and vectorizes.
            c = ring[cb + clo + 1:cb + clo + 1 + m]
            # The first two arcs in one pass (a lattice has a blank and an emission arc at
            # least: RNN-T's whole sum), then one pass per further arc. (A branch for a
            # one-arc sum cost RNN-T's sweep 5-10%: LLVM's loop versioning of it.)
            o0 = src_slot[0] * W + clo + 1
            p0 = ring[o0:o0 + m]
            x0 = x[:m]
            o1 = src_slot[1] * W + clo + 1 - (0 if Db > 1 else 1)
            p1 = ring[o1:o1 + m]
            x1 = x[W1:W1 + m]
            for k in range(m):
                z = p0[k] + x0[k]
                z = NEG_INF if (p0[k] == NEG_INF or x0[k] == NEG_INF) else z
                y = p1[k] + x1[k]
                y = NEG_INF if (p1[k] == NEG_INF or x1[k] == NEG_INF) else y
                if semiring == MAXPLUS:
                    c[k] = max2(z, y)
                else:
                    c[k] = logadd2(z, y)
            for a in range(2, A):
                oa = src_slot[a] * W + clo + 1 - (0 if a < Db else 1)
                p = ring[oa:oa + m]
                xa = x[a * W1:a * W1 + m]
                for k in range(m):
                    y = p[k] + xa[k]
                    y = NEG_INF if (p[k] == NEG_INF or xa[k] == NEG_INF) else y
                    if semiring == MAXPLUS:
                        c[k] = max2(c[k], y)
                    else:
                        c[k] = logadd2(c[k], y)
            for k in range(m):
                if c[k] != NEG_INF:  # NaN included: it must reach the end
                    flo = min(flo, clo + k)
                    fhi = clo + k
        rlo[slot], rhi[slot] = flo, fhi
        # Flat, unsigned indices, as the gather's (-4% on RNN-T's sweep).
        if backward:
            f0, fs = (Tb - n) * S + Ub, S - 1
        else:
            f0, fs = n * S, 1 - S
        for j in range(lo, hi + 1):
            outf[np.uint64(f0 + fs * j)] = ring[np.uint64(cb + j + 1)]




@njit(cache=True, nogil=True)
def transducer_alpha_beta_kernel(arc_blank, arc_emit, Tl, Ul, bc, ec, nq, bd, ed, ce, alpha, beta,
                                 ll, job):
    """Job ``2 b``: sequence ``b``'s alpha and ``ll[b]``; job ``2 b + 1``: its beta (by
    ``sweep``: ``bc``/``ec`` the arcs' columns, ``nq`` -1s: no second term). One call
    site with a run-time direction: a literal 0 and 1 compiled the sweep twice (Numba
    specializes on literal arguments).

    Updates: ``alpha[b, :T_b+1, :U_b+1]`` and ``ll[b]``, or ``beta[b, :T_b+1, :U_b+1]``.
    """
    b = job // 2
    d = job % 2
    ab = arc_blank[b]
    sweep(ab, arc_emit[b], ab, bc, nq, ec, nq, bd, ed, ce, Tl[b], Ul[b],
          beta[b] if d else alpha[b], d, LOG)
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
        # (B, T, U+1) C-contiguous: unit-stride rows Numba knows as such (the 4-D arrays'
        # [b, t, :, 0] rows have a run-time stride, and their loops did not vectorize:
        # 1.8 -> 0.5 ms, B=8 T=300 U=60, one thread).
        ob = occ_b[b, t]
        oe = occ_e[b, t]
        if not ok or t >= Tb:
            ob[:] = 0.0
            oe[:] = 0.0
            continue
        a = alpha[b, t]
        bn = beta[b, t + 1]
        bs = beta[b, t]
        xb = ab[b, t]
        xe = ae[b, t]
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
    nq = own_lines(np.full(max(len(bd), len(ed)), -1, dtype=np.int64))
    run_jobs(transducer_alpha_beta_kernel,
             (ab.numpy(), ae.numpy(), Tl, Ul, own_lines(np.arange(len(bd), dtype=np.int64)),
              own_lines(np.arange(len(ed), dtype=np.int64)), nq, bd, ed, ce, alpha.numpy(),
              beta.numpy(), ll.numpy()),
             jobs, order=cost, work=CELL * len(bd) * sum(cost))
    ll_out = ll if dt == torch.float64 else torch.from_numpy(ll.numpy().astype(np.float32))
    if not compute_occupations:
        return ll_out, arc_blank.new_empty(0), arc_emit.new_empty(0)
    if rnnt:
        occ_b = torch.empty(ab.shape, dtype=dt)
        occ_e = torch.empty(ae.shape, dtype=dt)
        run_jobs(_rnnt_occupation_kernel,
                 (ab.numpy()[..., 0], ae.numpy()[..., 0], Tl, Ul, alpha.numpy(), beta.numpy(),
                  ll.numpy(), occ_b.numpy()[..., 0], occ_e.numpy()[..., 0]),
                 range(B), order=Tl * (Ul + 1), work=CELL * float(np.dot(Tl, Ul + 1)))
    else:
        occ_b = torch.empty(ab.shape, dtype=occupation_dtype or dt)
        occ_e = torch.empty(ae.shape, dtype=occupation_dtype or dt)
        run_jobs(transducer_occupation_kernel,
                 (ab.numpy(), ae.numpy(), Tl, Ul, bd, ed, ce, alpha.numpy(), beta.numpy(),
                  ll.numpy(), occ_b.numpy(), occ_e.numpy()),
                 range(B), order=Tl * (Ul + 1), work=CELL * float(np.dot(Tl, Ul + 1)))
    return ll_out, occ_b, occ_e



# --------------------------------------------------------------------------- max-plus
@njit(cache=True, nogil=True)
def viterbi_kernel(arc_blank, arc_emit, Tl, Ul, bc, ec, nq, bd, ed, kind, idx, dur, ce, score,
                   frames, arcs, b):
    """Sequence ``b``: its best scores by ``sweep`` in max-plus (``bc``/``ec`` the arcs'
    columns, ``nq`` -1s), then the backtrack from ``(T_b, U_b)``.

    No back-pointers: at each state of the path its candidates are recomputed in the
    tie-break order of ``reference.viterbi_order`` (``kind`` 1 for an emission, ``idx``
    the arc's index, ``dur`` its duration) and the first equal to the state's best wins
    (a later one wins only when strictly greater). ``delta[source] + float64(arc)`` is
    the very sum the sweep maxed over (its -inf guard changes a sum only where a side
    is -inf, never on a path scoring above -inf), so the equality is exact.

    Updates: ``score[b]``, ``frames[b, :U_b]``, ``arcs[b, :U_b]`` (prefilled -inf, -1).
    """
    Tb, Ub = Tl[b], Ul[b]
    if Tb == 0:
        return
    ab = arc_blank[b]
    ae = arc_emit[b]
    delta = np.empty((Tb + 1, Ub + 1), dtype=np.float64)
    sweep(ab, ae, ab, bc, nq, ec, nq, bd, ed, ce, Tb, Ub, delta, 0, MAXPLUS)
    score[b] = delta[Tb, Ub]
    if not delta[Tb, Ub] > NEG_INF:
        return
    K = kind.shape[0]
    t, u = Tb, Ub
    while t > 0 or u > 0:
        best = delta[t, u]
        k = 0
        ts = t
        while k < K:
            ts = t - dur[k]
            if ts >= 0:
                if kind[k] == 0:
                    if delta[ts, u] + np.float64(ab[ts, u, idx[k]]) == best:
                        break
                elif u > 0 and ts < Tb and t < Tb + ce:
                    if delta[ts, u - 1] + np.float64(ae[ts, u - 1, idx[k]]) == best:
                        break
            k += 1
        if k == K:  # unreachable (the sweep's max is one of these sums); never loop
            score[b] = NAN
            for v in range(Ub):
                frames[b, v] = -1
                arcs[b, v] = -1
            return
        t = ts
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
    Db, De = len(blank_durations), len(emit_durations)
    run_jobs(viterbi_kernel,
             (arc_blank.contiguous().numpy(), arc_emit.contiguous().numpy(), Tl, Ul,
              own_lines(np.arange(Db, dtype=np.int64)), own_lines(np.arange(De, dtype=np.int64)),
              own_lines(np.full(max(Db, De), -1, dtype=np.int64)),
              own_lines(np.asarray(blank_durations, dtype=np.int64)),
              own_lines(np.asarray(emit_durations, dtype=np.int64)), kind, idx, dur,
              int(bool(emit_can_end)), score.numpy(), fr.numpy(), ar.numpy()),
             range(B), order=Tl * (Ul + 1), work=CELL * float(np.dot(Tl, Ul + 1)))
    return score, frames, arcs
