r"""CTC on CPU in Numba: probability-domain recursions, exact log-space fallback.

Implements ``ctc_loss_forward`` with exactly the interface and semantics of
``seqloss.reference.ctc.ctc_loss_forward`` (see its docstring).

The batch runs on a thread pool (GIL-free Numba functions); per sequence:

1. Emissions. For each frame ``t < T_b`` the log-probabilities of the
   sequence's ``L_b + 1`` labels (blank first) are gathered, ``M_t`` = their
   maximum, and ``e[t, j] = exp(lp[t, j] - M_t)`` in float64. With
   ``fused_log_softmax`` the frame's normalizer is computed on the way, one
   ``exp`` per logit, and the softmax row is written straight into the
   gradient (``softmax - occupation`` needs it anyway).
2. ``alpha`` forward and ``beta'`` (excluding the frame's own emission)
   backward as multiply-adds in the probability domain. The states are cut in
   blocks of ``bw`` labels (``2 bw`` states; ``bw`` = 16, 4 beyond ``LONG_T``
   frames); each block of each frame carries
   its own binary exponent (``value = stored * 2**k``, the stored block
   rescaled every frame so its maximum lies in [1, 2), an exact power-of-two
   multiply), and the one state a block reads from its neighbour is converted
   between exponents. So only the spread of values *within a block* must fit
   float64's range, not the spread across the whole band (which exceeds 708
   nats on long alignments: the band's edges are single forced paths);
   ``log p = sum_t M_t + log(alpha[T_b-1, final])`` with the exponents.
   Only the band of states that are reachable from the start and can still
   reach the end (``K - 2 (T_b - t) <= s <= 2 t + 1``) is computed: the others
   never contribute, so they can be dropped exactly.
3. Occupation ``gamma[t, s] = alpha_hat * beta_hat' / sum_s(alpha_hat * beta_hat')``
   (every path occupies one state per frame, so the frame's sum is ``p``),
   gathered per label and subtracted from the gradient row.

Exactness. The probability domain is exact (to float64 rounding) as long as
no quantity that matters falls below float64's normal range. A state that falls
more than ``2**-900`` below its block's maximum, or a product under ``TINY``, is
dropped, and the bound of what its block lost (``2**(k - 1018)`` at the block's
exponent ``k``) is kept: the backward pass checks it against the ``beta'`` (for
alpha) or the alpha (for ``beta'``) it would have met at that frame's occupation,
and each drop must be below ``2**-900`` of the frame's largest block product (``Z``,
the frame's ``sum(alpha * beta')`` relative to it, stays above ``Z_MIN = 2**-600``):
below ``2**-293`` of the likelihood, far under its rounding. Two neighbouring blocks
more than ``2**1000`` apart: in ``beta'`` the lower one's own products are moved down
(drops checked as above); in alpha the sequence takes the extended path (moving them
there too kept 2 more of the grid's cases below on this path, and cost the forward
12-20% without a penalty). A forward without gradient has no backward pass to check
against, so there an underflow in a block whose maximum is below ``DROP_MAX`` fails
at once. A failed check -- an emission more than 708 nats below its frame's best
label, a drop that the occupation shows mattered, a frame sum below ``Z_MIN``, or a
zero likelihood -- sends the sequence to the extended-range path (``_ctc_ext_one``: a
mantissa and an int64 exponent per value, exact for any finite input), and a
non-finite input on to the log-space kernel (``_ctc_log_one``, libm ``exp``/``log``
per state, guarded ``logaddexp``, float64), which is the exact algorithm of the
reference. Exact zeros (``-inf`` log-probabilities, ``exp(-inf) == 0``) are not
underflow and stay on the fast path.

Delay penalty (``dp``, k2's): every label's log-probability at frame ``t`` gains
``dp * ((T_b - 1) / 2 - t)`` (the blank's does not) where the emissions are formed,
in every path. It spreads the states of a frame apart, by up to about
``|dp| T_b**2 / 8`` nats (state 0 against the others at mid-sequence when ``dp > 0``
and uniform logits; the last two states in ``beta'``), which the checked dropping above
absorbs (those states carry no mass), and neighbouring labels by up to
``|dp| (T_b - 1) / 2`` nats, which narrower blocks absorb (a block holds at most
``DP_BLOCK_NATS`` of it; down to one label). Past
``DP_LABEL_NATS`` for one label (``|dp| (T_b - 1) > 1536``: ``dp = 1.6`` at
``T_b = 1000``) the sequence takes the extended path directly. ``DP_BLOCK_NATS`` was
chosen on a grid (T_b 300-2000; randn, uniform and peaky logits; ``|dp|`` 0.015-1.5;
120 cases of three sequences): with 1200 (and the checked drops above) 94 cases run
wholly on the fast path, against 91 with 384 and no deferred checks; at ``T_b = 300``,
``dp = 0.5`` gives 16-label blocks, the width without a penalty.

Compile time (a fresh Numba cache compiles per dtype what a call reaches): Numba links
a callee's code into every caller and optimizes and emits it again there, and its IR
inliner and type inference cost more than linearly in a function's size, so the largest
functions, ``_ctc_fast_one`` and ``_ctc_seq``, are called through the address of their
compiled code (``_call_fast_one``, ``_call_seq``, the addresses in ``_ZERO``) and compiled
once each; ``_fast_alpha`` is a plain call with non-literal flags (one compile inside
``_ctc_fast_one``): through its address too, the forward pass ran 10-15% slower
(T=300-1000, 2-core machine, interleaved processes) for ~0.5 s less compile time; the
fused log-softmax pass (``_fused_rows``, with ``_max`` and ``_sum``) compiles on the first
fused call only, and
the extended and log-space paths (``_ctc_fallback``) only when an input needs them;
small helpers are inlined (each separate function is one more module, machine-code
emission and cache entry), and overloads that would each compile once more
(``np.zeros``, ``ndarray.sum``, ``ndarray.view``) are written out. float32 first call
(forward+backward, 2-core machine, CPU seconds, same-load pairs): ~22 s before the
addresses, 11-12 s with two of them, 9.5-10.5 s with three; 5.4-6 s on a faster machine now.

Why not log space throughout: the installed llvmlite has no vector math
library, so ``math.exp``/``math.log`` are scalar libm calls (~20-40 ns). The
``exp`` used here (``_exp``) is written out (Cody-Waite reduction, degree-12
Taylor polynomial, exponent built from integer bits) so that LLVM vectorizes
it; it is accurate to about 1 ulp on ``[-708, 1]``.

Memory: the gradient is the only logits-sized array (float32 scratch for
half-precision inputs, cast at the end). Per sequence, allocated by the thread
that runs it: the emissions and alphas of every frame while they take at most
``FULL_STORE_BYTES``; above that, of one segment of ``ceil(sqrt(T_b))`` frames,
plus one alpha row (a checkpoint) per segment: the backward sweep recomputes
each segment from its checkpoint, bit for bit (see "segments" below). The
forward alone keeps two rows.
"""

from __future__ import annotations

import math
import platform
import types as types_mod

import numpy as np
import torch
from llvmlite import ir
from numba import carray, njit
from numba.core import cgutils, types
from numba.core.callconv import excinfo_t
from numba.extending import intrinsic

from .._core import buffers, reduce
from .._core.numba_logspace import sub_normalizer as _sub_normalizer
from .._core.numba_pool import run_jobs
from .checks import ctc_values

NEG_INF = -np.inf
INF = np.inf
# Smallest value a nonzero state or product may take: float64's normal range
# (2**-1022) with two bits of headroom.
TINY = 2.0**-1020
# Smallest admissible frame sum of alpha_hat * beta_hat' (relative to its largest block
# exponent): a dropped state's paths (below 2**-898 of that, see "Exactness") are then
# below 2**-298 of the likelihood.
Z_MIN = 2.0**-600
# A state below DROP times its block's maximum is dropped (stored as an exact 0: no
# subnormal arithmetic on it later); one that underflows in a product is dropped only
# while the block's maximum (before rescaling) is at least DROP_MAX.
DROP = 2.0**-900
DROP_MAX = 2.0**-100
# _exp returns 0 below this (exp(-708) ~ 3.3e-308 is still a normal number).
EXP_MIN = -708.0

FAST, FALLBACK, INFEASIBLE, EXTENDED, POISONED = 0, 1, 2, 3, 4
# Left by ``_ctc_seq`` for ``_ctc_seq_slow`` (the extended and log-space paths).
PENDING = 5

_LOG2E = 1.4426950408889634
_LN2_HI = 0.6931471803691238
_LN2_LO = 1.9082149292705877e-10
_SHIFT = 6755399441055744.0  # 1.5 * 2**52: adding it rounds to an integer


@njit(inline="always", cache=True, error_model="numpy")
def _exp(x):
    """``exp(x)`` for ``x <= ~1``; exactly 0 below ``EXP_MIN`` (and for -inf, NaN).

    Branch-free so that loops calling it vectorize.
    """
    xx = max(x, EXP_MIN)
    n = (xx * _LOG2E + _SHIFT) - _SHIFT
    r = xx - n * _LN2_HI
    r = r - n * _LN2_LO
    p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r * (
        1.0 / 720 + r * (1.0 / 5040 + r * (1.0 / 40320 + r * (1.0 / 362880 + r * (
            1.0 / 3628800 + r * (1.0 / 39916800 + r * (1.0 / 479001600))))))))))))
    scale = np.int64((np.int64(n) + 1023) << 52).view(np.float64)
    v = p * scale
    return v if x >= EXP_MIN else 0.0


@njit(fastmath={"reassoc", "contract", "nsz"}, cache=True, error_model="numpy")
def _sum(a, n):
    s = 0.0
    for i in range(n):
        s += a[i]
    return s


@njit(fastmath={"nnan", "nsz"}, cache=True, error_model="numpy")
def _max(a):
    """Max of a row (NaN-free rows; a row holding NaN is poisoned by the caller anyway)."""
    m = NEG_INF
    for i in range(a.shape[0]):
        m = max(m, a[i])
    return m


@njit(inline="always", cache=True, error_model="numpy")
def _row(a, tb_layout, t, b):
    return a[t, b] if tb_layout else a[b, t]


@njit(inline="always", cache=True, error_model="numpy")
def _logaddexp(a, b):
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    if a > b:
        return a + math.log1p(math.exp(b - a))
    return b + math.log1p(math.exp(a - b))


@njit(inline="always", cache=True, error_model="numpy")
def _labels(targets, toff, b, Lb, blank):
    """Blank then sequence ``b``'s labels: row ``b`` of padded ``(B, S)`` targets
    (``toff`` empty), or ``targets[0, toff[b]:]`` of concatenated ones (``(1, N)``)."""
    lab = np.empty(Lb + 1, np.int64)
    lab[0] = blank
    if toff.shape[0] == 0:
        for j in range(Lb):
            lab[j + 1] = targets[b, j]
    else:
        n = targets.shape[1]
        for j in range(Lb):
            lab[j + 1] = targets[0, min(toff[b] + j, n - 1)]  # clamped: validate=False reads
    return lab


@njit(inline="always", cache=True, error_model="numpy")
def _poisoned(x, tb_layout, b, Tb, C):
    """Whether a frame ``t < T_b`` of sequence ``b`` holds NaN or ``+inf`` (any class)."""
    for t in range(Tb):
        for c in range(C):
            v = x[t, b, c] if tb_layout else x[b, t, c]
            if not v < INF:
                return True
    return False


@njit(inline="always", cache=True, error_model="numpy")
def _check_values(targets, concat, il, tl, T, C, blank):
    """The CTC value checks in one pass; 0 when they all hold, else nonzero (the
    caller then runs the Python checks, which raise the error naming the input).
    Also returns the concatenated targets' offsets (empty for padded targets)."""
    B = il.shape[0]
    width = targets.shape[1]
    toff = np.empty(B if concat else 0, np.int64)  # (np.zeros: one more overload to compile)
    toff[:] = 0
    for b in range(B):
        if il[b] < 0 or il[b] > T or tl[b] < 0 or tl[b] > width:
            return 1, toff
    off = 0
    for b in range(B):
        if concat:
            toff[b] = off
            if off + tl[b] > width:  # the lengths overrun the ids: never read past them
                return 3, toff
        for s in range(tl[b]):
            v = targets[0, off + s] if concat else targets[b, s]
            if v < 0 or v >= C or v == blank:
                return 2, toff
        off += tl[b] if concat else 0
    if concat and off != width:
        return 3, toff
    return 0, toff


@njit(inline="always", cache=True, error_model="numpy")
def _offsets(tl):
    toff = np.empty(tl.shape[0], np.int64)
    off = 0
    for b in range(tl.shape[0]):
        toff[b] = off
        off += max(tl[b], 0)
    return toff


# Constant arguments are typed as literals (``Literal[bool](True)``), and a function
# called with a literal in one place and a variable in another is compiled twice
# (``_fast_alpha``: ~5 s more on a fresh cache). These return the plain types.
@njit(inline="always", cache=True)
def _YES():
    return np.bool_(True)


@njit(inline="always", cache=True)
def _NO():
    return np.bool_(False)


@njit(inline="always", cache=True)
def _I0():
    return np.int64(0)


@njit(inline="always", cache=True, error_model="numpy")
def _zero_rows(grad, tb_layout, b, t0, t1):
    C = grad.shape[2]
    for t in range(t0, t1):
        for c in range(C):
            if tb_layout:
                grad[t, b, c] = 0.0
            else:
                grad[b, t, c] = 0.0


@njit(inline="always", cache=True, error_model="numpy")
def _copy_row(dst, i, src, j):
    """``dst[i] = src[j]`` for 2-D arrays of one width. Written out: an array assigned to a
    slice compiles the shape-mismatch error's message formatting (~3.5 s on a fresh cache)."""
    for c in range(dst.shape[1]):
        dst[i, c] = src[j, c]


@njit(inline="always", cache=True, error_model="numpy")
def _grad_sub(grad, tb_layout, t, b, c, v):
    if tb_layout:
        grad[t, b, c] -= v
    else:
        grad[b, t, c] -= v


# --------------------------------------------------------------------------- segments
# The backward sweep needs every frame's alpha (and emissions). They are kept for
# all ``T_b`` frames only while that takes at most FULL_STORE_BYTES per sequence.
# Above it, ring buffers of ``S ~ sqrt(T_b)`` rows hold one segment of frames; the
# first sweep saves alpha at every frame ``k S`` (a checkpoint), and the backward
# sweep, segment by segment from the last, recomputes the segment's emissions and
# alphas from its checkpoint (the last segment is still in the buffers). The
# recomputation runs the same code on the same inputs, so it reproduces the first
# sweep bit for bit: the results do not depend on the segment length. Stored
# state: O(sqrt(T_b) K) instead of O(T_b K), for one more forward sweep.
FULL_STORE_BYTES = 32 << 20
# Testing hook, read from Python at each call of ``ctc_loss_forward``: a segment
# length forced on every sequence; 0: automatic; -1: checkpointed whatever the size.
_SEGMENT_OVERRIDE = 0


@njit(inline="always", cache=True, error_model="numpy")
def _seg_len(Tb, row_bytes, compute_grad, seg):
    """Rows of the ring buffers (frames per segment) for a sequence of ``T_b >= 1`` frames."""
    if not compute_grad:
        S = 2  # the forward sweep alone reads one row back
    elif seg > 0:
        S = max(seg, 2)  # a ring of one row would overwrite the row it reads
    elif seg == 0 and Tb * row_bytes <= FULL_STORE_BYTES:
        S = Tb
    else:
        S = max(np.int64(math.ceil(math.sqrt(Tb))), 2)
    return min(S, Tb)


@njit(inline="always", cache=True, error_model="numpy")
def _softmax_lse(xr, C, ex):
    """``ex = exp(x - max)`` over a logits row; returns (log-sum-exp, sum of ex, max).

    A NaN anywhere in the row makes the log-sum-exp NaN (``_exp`` maps NaN to 0).
    """
    m = _max(xr)
    nan = 0
    for c in range(C):
        ex[c] = _exp(xr[c] - m)
        nan += xr[c] != xr[c]
    s = _sum(ex, C)
    return (m + math.log(s) if nan == 0 else np.nan), s, m


@njit(inline="always", cache=True, error_model="numpy")
def _write_softmax(grad, tb_layout, t, b, C, ex, s):
    inv = 1.0 / s
    if tb_layout:
        for c in range(C):
            grad[t, b, c] = ex[c] * inv
    else:
        for c in range(C):
            grad[b, t, c] = ex[c] * inv


# --------------------------------------------------------------------------- log space
@njit(cache=True, error_model="numpy")
def _log_alpha(x, tb_layout, b, C, lab, Tb, fused, dp, first, t0, t1, lse, lp, la, cla, skip):
    """Log-space emissions and alpha of frames ``t0 <= t < t1`` into ring rows ``t % S``.

    ``first``: the first sweep (``t0 == 0``): computes ``lse[t]`` (fused) and
    saves the rows of frames ``k S`` in ``cla`` (``k < len(cla)``). Otherwise row
    ``t0 % S`` of ``la`` holds alpha of ``t0`` (a checkpoint). ``dp``: the delay penalty.
    """
    nl = lab.shape[0]
    K = la.shape[1]
    S = la.shape[0]
    nck = cla.shape[0]
    for t in range(t0, t1):
        r = t % S
        xr = _row(x, tb_layout, t, b)
        if fused and first:
            m = NEG_INF
            for c in range(C):
                if xr[c] > m or xr[c] != xr[c]:
                    m = xr[c]
            if m == NEG_INF or m == INF or m != m:
                lse[t] = m  # -inf for a frame of -inf; +inf, NaN poison the sequence
            else:
                s = 0.0
                for c in range(C):
                    s += math.exp(xr[c] - m)
                lse[t] = m + math.log(s)
        lpr = lp[r]
        pen = dp * ((Tb - 1) * 0.5 - t)
        # a frame of -inf logits (lse = -inf): -inf, no path leaves it (logspace's rule)
        lpr[0] = _sub_normalizer(xr[lab[0]], lse[t])
        for j in range(1, nl):
            lpr[j] = _sub_normalizer(xr[lab[j]], lse[t]) + pen
        an = la[r]
        if t == t0:
            if first:
                an[:] = NEG_INF
                an[0] = lpr[0]
                if K > 1:
                    an[1] = lpr[1]
        else:
            ap = la[(t - 1) % S]
            for s in range(K):
                a = ap[s]
                if s >= 1:
                    a = _logaddexp(a, ap[s - 1])
                if skip[s]:
                    a = _logaddexp(a, ap[s - 2])
                an[s] = a + lpr[(s + 1) // 2 if s % 2 == 1 else 0]
        if first and r == 0 and t // S < nck:
            _copy_row(cla, t // S, la, r)


@njit(cache=True, error_model="numpy")
def _ctc_log_one(x, tb_layout, b, C, lab, Tb, blank, fused, dp, compute_grad, grad, seg):
    """Exact log-space CTC of one sequence (``T_b >= 1``); returns the loss.

    Updates: rows ``t < T_b`` of sequence ``b`` in ``grad`` (when ``compute_grad``).
    """
    nl = lab.shape[0]
    Lb = nl - 1
    K = 2 * Lb + 1
    S = _seg_len(Tb, 8 * (K + nl), compute_grad, seg)
    nseg = (Tb + S - 1) // S
    nck = nseg - 1 if compute_grad else 0
    lp = np.empty((S, nl))
    lse = np.zeros(Tb)
    skip = np.zeros(K, np.bool_)
    for s in range(3, K, 2):
        skip[s] = lab[(s + 1) // 2] != lab[(s - 1) // 2]
    la = np.full((S, K), NEG_INF)
    cla = np.empty((nck, K))
    _log_alpha(x, tb_layout, b, C, lab, Tb, fused, dp, _YES(), _I0(), Tb, lse, lp, la, cla, skip)
    laf = la[(Tb - 1) % S]
    ll = laf[K - 1]
    if K > 1:
        ll = _logaddexp(ll, laf[K - 2])
    if ll == NEG_INF:
        if compute_grad:
            _zero_rows(grad, tb_layout, b, _I0(), Tb)
        return INF
    if not compute_grad:
        return -ll
    lb = np.full(K, NEG_INF)  # beta' at t: paths from (t, s) on, excluding the emission at t
    lb[K - 1] = 0.0
    if K > 1:
        lb[K - 2] = 0.0
    inc = np.empty(K)
    occ = np.empty(nl)
    for k in range(nseg - 1, -1, -1):
        t0 = k * S
        t1 = min(Tb, t0 + S)
        if k < nseg - 1:
            _copy_row(la, 0, cla, k)
            _log_alpha(x, tb_layout, b, C, lab, Tb, fused, dp, _NO(), t0, t1, lse, lp, la, cla,
                       skip)
        for t in range(t1 - 1, t0 - 1, -1):
            r = t - t0
            lat = la[r]
            lpr = lp[r]
            occ[:] = 0.0
            for s in range(K):
                occ[(s + 1) // 2 if s % 2 == 1 else 0] += math.exp(lat[s] + lb[s] - ll)
            g = _row(grad, tb_layout, t, b)
            if fused:
                xr = _row(x, tb_layout, t, b)
                for c in range(C):
                    g[c] = math.exp(xr[c] - lse[t])
            else:
                g[:] = 0.0
            for j in range(nl):
                g[lab[j]] -= occ[j]
            if t == 0:
                break
            for s in range(K):
                inc[s] = lb[s] + lpr[(s + 1) // 2 if s % 2 == 1 else 0]
            for s in range(K):
                v = inc[s]
                if s + 1 < K:
                    v = _logaddexp(v, inc[s + 1])
                if s + 2 < K and skip[s + 2]:
                    v = _logaddexp(v, inc[s + 2])
                lb[s] = v
    return -ll


# --------------------------------------------------------------------------- probability domain

# Probability-domain block exponents: labels per block (a power of two, 2**BSH),
# and the exponent of an all-zero block. Long sequences take narrower blocks:
# the spread of alpha within a block grows with the frame index (at a band edge
# about log(t) nats per state, more with contrasted emissions), and with 16
# labels it leaves float64's range after ~5000 frames (randn logits, C = 30..1000),
# which sends such sequences to the ~2x slower extended path. Narrow blocks cost
# ~10-15% on short ones (more exponent bookkeeping).
BSH = 4
BSH_LONG = 2
LONG_T = 4096
# Nats of delay-penalty spread a block of labels may hold, and one label (see the
# module docstring, "Delay penalty").
DP_BLOCK_NATS = 1200.0
DP_LABEL_NATS = 768.0
KZ = -(1 << 40)
_LN2 = 0.6931471805599453


@njit(inline="always", cache=True, error_model="numpy")
def _p2(d):
    """``2.0**d`` for an int64 ``d``, clamped to ``[-1023, 1000]`` (0 below ``-1022``)."""
    dd = min(max(d, -1023), 1000)
    return np.int64((dd + 1023) << 52).view(np.float64)


@njit(inline="always", cache=True, error_model="numpy")
def _expo(m):
    """Binary exponent ``e`` of a positive normal float64 ``m = mantissa * 2**e``."""
    return ((np.float64(m).view(np.int64) >> 52) & 0x7FF) - 1023


@njit(inline="always", cache=True, error_model="numpy")
def _fast_emissions(xr, lab, lse, pen, lp, E, r):
    """``E[r] = exp(lp - M)`` for one frame's label log-probs ``lp = x[lab] - lse``, the
    labels' (not the blank's) plus the frame's delay penalty ``pen``.

    Returns ``(M, ok)``; not ok: every label masked (``M = -inf``, an exact zero
    that the caller decides in log space), a non-finite ``M``, or a nonzero label
    more than 708 nats below ``M`` (it would underflow), or a NaN (``max`` and
    ``_exp`` would pass over it).
    """
    nl = lab.shape[0]
    if lse == NEG_INF:  # fused, a frame of -inf logits: every label -inf (logspace's rule)
        return NEG_INF, False
    lp[0] = xr[lab[0]] - lse
    for j in range(1, nl):
        lp[j] = (xr[lab[j]] - lse) + pen
    M = NEG_INF
    for j in range(nl):
        M = max(M, lp[j])
    if not (M > NEG_INF and M < INF):
        return M, False
    under = False
    for j in range(nl):
        d = lp[j] - M
        E[r, j] = _exp(d)
        under |= ((d < EXP_MIN) & (lp[j] > NEG_INF)) | (lp[j] != lp[j])
    return M, not under


# Inlined (as ``_softmax_lse`` and ``_fast_emissions``): the per-frame array views
# passed to a call cost an atomic incref/decref each, ~30% of a short sequence's time
# (T=26, C=7: 10-15% faster inlined, 6% longer first-call compile).
@njit(inline="always", cache=True, error_model="numpy")
def _fast_alpha_step(t, Tb, K, Lb, AE, AO, KA, p, r, E, sk, bsh, strict):
    """Scaled alpha of frame ``t >= 1`` (ring rows ``r`` of ``AE``, ``AO``, ``KA``) from
    frame ``t - 1``'s (rows ``p``); emissions in row ``r`` of ``E``. Rows are indexed, not
    sliced: a row view costs an atomic incref/decref pair per frame.

    Writes the band of ``t``, its block exponents ``KA[r, :nb]`` (``KZ`` elsewhere), the
    bound of what each block lost to underflow ``KA[r, nb:]`` (``KZ``: nothing; the
    backward pass checks it against the frame's occupation) and exact zeros at the two
    states above the band (frame ``t + 1`` reads them). Returns the number of failed
    range checks (``strict``, a forward without that check: an underflow in a block whose
    maximum is below ``DROP_MAX`` fails too). Blocks of ``2**bsh`` labels.
    """
    bw = 1 << bsh
    nb = KA.shape[1] // 2
    lo = max(0, K - 2 * (Tb - t))
    hi = min(K - 1, 2 * t + 1)
    ie0, ie1 = (lo + 1) // 2, hi // 2
    io0, io1 = lo // 2, (hi - 1) // 2
    for j in range(KA.shape[1]):
        KA[r, j] = KZ
    eb = E[r, 0]
    nbad = 0
    jb0 = min(ie0, io0) >> bsh
    jb1 = (max(ie1, io1) >> bsh) + 1
    # A lower neighbour's state that would enter past float64's range: the extended path
    # (checked before the blocks: inside their loop, the check cost the forward 12-20%).
    for j in range(max(jb0, 1), jb1):
        nbad += (KA[p, j - 1] != KZ) & (KA[p, j] != KZ) & (KA[p, j - 1] - KA[p, j] > 1000)
    for j in range(jb0, jb1):
        base = j << bsh
        # block j is computed at its exponent of t - 1 (an all-zero block: its
        # lower neighbour's); the lower neighbour's last odd state enters scaled by f
        kl = KA[p, j - 1] if j > 0 else KZ
        kj = KA[p, j] if KA[p, j] != KZ else (kl if kl != KZ else 0)
        f = 0.0
        m = 0.0
        nuf = 0
        if kl != KZ:
            f = _p2(kl - kj)
        a0 = max(ie0, base)
        a1 = min(ie1, base + bw - 1)
        if a0 == 0 and a1 >= 0:
            w = AE[p, 0]
            v = w * eb
            AE[r, 0] = v
            nuf += (w > 0.0) & (eb > 0.0) & (v < TINY)
            m = max(m, v)
            a0 = 1
        for i in range(a0, a1 + 1):
            po = AO[p, i - 1]
            w = AE[p, i] + po * (f if i == base else 1.0)
            v = w * eb
            AE[r, i] = v
            nuf += ((w > 0.0) | (po > 0.0)) & (eb > 0.0) & (v < TINY)
            m = max(m, v)
        b0 = max(io0, base)
        b1 = min(io1, base + bw - 1)
        if b0 == 0 and b1 >= 0:
            w = AO[p, 0] + AE[p, 0]
            e = E[r, 1]
            v = w * e
            AO[r, 0] = v
            nuf += (w > 0.0) & (e > 0.0) & (v < TINY)
            m = max(m, v)
            b0 = 1
        for i in range(b0, b1 + 1):
            po = sk[i] * AO[p, i - 1]
            w = AO[p, i] + AE[p, i] + po * (f if i == base else 1.0)
            e = E[r, i + 1]
            v = w * e
            AO[r, i] = v
            nuf += ((w > 0.0) | (po > 0.0)) & (e > 0.0) & (v < TINY)
            m = max(m, v)
        # A state that underflowed (nuf) is dropped: it was below 2**(kj - 1020), which
        # the backward pass checks against the beta' it would have met (where the
        # block's max stays above DROP_MAX, it passes).
        if nuf:
            KA[r, nb + j] = kj - 1018
            nbad += strict & (m < DROP_MAX)
        if m > 0.0:
            ex_ = _expo(m)
            sc = _p2(-ex_)
            KA[r, j] = kj + ex_
            for i in range(max(ie0, base), a1 + 1):
                u = AE[r, i] * sc
                AE[r, i] = u if u >= DROP else 0.0
            for i in range(max(io0, base), b1 + 1):
                u = AO[r, i] * sc
                AO[r, i] = u if u >= DROP else 0.0
    for s in range(hi + 1, min(hi + 3, K)):
        if s % 2 == 0:
            AE[r, s // 2] = 0.0
        else:
            AO[r, s // 2] = 0.0
    return nbad


@njit(cache=True, error_model="numpy")
def _fast_alpha(x, tb_layout, b, C, lab, Tb, fused, dp, first, t0, t1, lses, E, AE, AO, KA,
                CE, CO, CK, sk, lp, bsh, strict):
    """Emissions and scaled alpha of frames ``t0 <= t < t1`` into ring rows ``t % S``.

    ``first``: the first sweep (``t0 == 0``): frame 0 starts the recursion, every
    range check is made, and the rows of frames ``k S`` are saved as checkpoints
    ``k < len(CE)``. Otherwise a recomputation: row ``t0 % S`` holds alpha of ``t0``
    (a checkpoint) and the checks, passed before, are skipped. ``fused``: the frames'
    log-softmax normalizers are in ``lses`` (``_fused_rows``).
    Returns ``(ok, sum of the frames' M_t)``.
    """
    nl = lab.shape[0]
    Lb = nl - 1
    K = 2 * Lb + 1
    S = E.shape[0]
    nck = CE.shape[0]
    logscale = 0.0
    for t in range(t0, t1):
        r = t % S
        xr = _row(x, tb_layout, t, b)
        lse = lses[t] if fused else 0.0
        M, ok = _fast_emissions(xr, lab, lse, dp * ((Tb - 1) * 0.5 - t), lp, E, r)
        if first and not ok:
            # Every label masked at this frame (an exact zero), or a non-finite
            # input that the caller will poison: decide in log space.
            return False, logscale
        logscale += M
        if t == t0:
            if first:  # frame 0; the buffers are fresh (zeros, KZ)
                if K - 2 * Tb <= 0:  # else (T_b = L_b) state 0 cannot reach the end
                    AE[r, 0] = E[r, 0]
                if K > 1:
                    AO[r, 0] = E[r, 1]
                m = max(AE[r, 0], AO[r, 0])
                if not m > 0.0:
                    return False, logscale
                e0 = _expo(m)
                sc = _p2(-e0)
                AE[r, 0] *= sc
                AO[r, 0] *= sc
                KA[r, 0] = e0
                v0, v1 = AE[r, 0], AO[r, 0]
                if (v0 > 0.0 and v0 < TINY) or (v1 > 0.0 and v1 < TINY):
                    return False, logscale
        else:
            nbad = _fast_alpha_step(t, Tb, K, Lb, AE, AO, KA, (t - 1) % S, r, E, sk, bsh,
                                    strict)
            if first and nbad:
                return False, logscale
        if first and r == 0 and t // S < nck:
            k = t // S
            _copy_row(CE, k, AE, r)
            _copy_row(CO, k, AO, r)
            _copy_row(CK, k, KA, r)
    return True, logscale


@njit(cache=True, error_model="numpy")
def _fused_rows(x, tb_layout, b, C, Tb, write_sm, grad, lses, ex):
    """The log-softmax normalizer of each frame ``t < T_b`` into ``lses[t]`` and, when
    ``write_sm``, the softmax row into ``grad`` (``softmax - occupation`` needs it):
    ``fused_log_softmax``'s first pass. A function of its own, called through its
    address (``_call_fused_rows``) and compiled on the first fused call: a call
    without fusion does not compile it (nor ``_max`` and ``_sum``)."""
    for t in range(Tb):
        lse, s, _m = _softmax_lse(_row(x, tb_layout, t, b), C, ex)
        lses[t] = lse
        if write_sm:
            _write_softmax(grad, tb_layout, t, b, C, ex, s)


@njit(cache=True, error_model="numpy")
def _zeros(n):
    # np.empty and a fill: np.zeros and np.full each compile one more overload per shape
    # and dtype (~0.1-0.3 s each on a fresh cache). Not inlined: compiled once for its
    # nine call sites (an allocation costs more than the call).
    a = np.empty(n)
    a[:] = 0.0
    return a


@njit(cache=True, error_model="numpy")
def _zeros2(n, m):
    a = np.empty((n, m))
    a[:] = 0.0
    return a


@njit(cache=True, error_model="numpy")
def _ctc_fast_one(addrs, x, tb_layout, b, C, lab, Tb, fused, dp, compute_grad, grad, out_loss,
                  seg):
    """Scaled probability-domain CTC of one sequence (``T_b >= 1``, feasible lengths).

    ``addrs``: the kind's addresses (see ``_ctc_chunk``).

    Returns ``FAST`` (``out_loss[b]`` and the rows ``t < T_b`` of ``grad`` written)
    or ``FALLBACK`` (a quantity left float64's range: nothing usable written).
    """
    nl = lab.shape[0]
    Lb = nl - 1
    K = 2 * Lb + 1
    no = max(Lb, 1)
    bsh = BSH if Tb <= LONG_T else BSH_LONG
    # A delay penalty moves neighbouring labels up to |dp| (T_b - 1) / 2 nats apart: blocks
    # narrow enough that a block's spread stays well inside float64's range; past what one
    # label a block can hold, the extended path (a fast attempt would fail on the way).
    spread = abs(dp) * (Tb - 1) * 0.5
    if spread > DP_LABEL_NATS:
        return FALLBACK
    while bsh > 0 and (1 << bsh) * spread > DP_BLOCK_NATS:
        bsh -= 1
    bw = 1 << bsh
    nb = (nl + bw - 1) >> bsh
    S = _seg_len(Tb, 8 * (nl + nl + no + 2 * nb), compute_grad, seg)
    nseg = (Tb + S - 1) // S
    nck = nseg - 1 if compute_grad else 0
    lses = np.empty(Tb if fused else 0)
    lp = np.empty(nl)
    if fused:
        _call_fused_rows(addrs[1], x, tb_layout, b, C, Tb, compute_grad, grad, lses, np.empty(C))
    sk = _zeros(nl)  # sk[i]: odd state i (label i+1) may be entered from odd state i-1
    for i in range(1, Lb):
        sk[i] = 1.0 if lab[i + 1] != lab[i] else 0.0

    # ---- emissions E (scaled by the frame's best label M_t) and alpha: band
    # [lo, hi] of states only; block j (labels j bw .. j bw + bw - 1, even and odd states)
    # of frame t is AE/AO * 2**KA[t, j]. Ring rows t % S; checkpoints CE, CO, CK.
    E = np.empty((S, nl))
    AE = _zeros2(S, nl)  # even states 2i (blank)
    AO = _zeros2(S, no)  # odd states 2i+1 (label i+1)
    KA = np.empty((S, 2 * nb), np.int64)  # block exponents, then underflow bounds
    KA[:] = KZ
    CE = np.empty((nck, nl))
    CO = np.empty((nck, no))
    CK = np.empty((nck, 2 * nb), np.int64)
    ok, logscale = _fast_alpha(x, tb_layout, b, C, lab, Tb, fused, dp, _YES(), _I0(), Tb,
                                lses, E, AE, AO, KA, CE, CO, CK, sk, lp, bsh, not compute_grad)
    if not ok:
        return FALLBACK
    rf = (Tb - 1) % S
    v1 = AE[rf, Lb]
    k1 = KA[rf, Lb >> bsh] if v1 > 0.0 else KZ
    v2 = AO[rf, Lb - 1] if Lb >= 1 else 0.0
    k2 = KA[rf, (Lb - 1) >> bsh] if v2 > 0.0 else KZ
    kk = max(k1, k2)
    if kk == KZ:
        return FALLBACK
    pf = v1 * _p2(k1 - kk) + v2 * _p2(k2 - kk)
    out_loss[b] = -(logscale + math.log(pf) + kk * _LN2)
    if not compute_grad:
        return FAST

    # ---- beta' (excluding the frame's own emission), block exponents KB; occupation
    be = _zeros(nl)
    bo = _zeros(no)
    be2 = _zeros(nl)
    bo2 = _zeros(no)
    ie_ = _zeros(nl + 1)  # emission-inclusive beta at t, one spare zero past the end
    io_ = _zeros(no + 1)
    KB = np.empty(nb, np.int64)
    KB[:] = KZ
    KB2 = np.empty(nb, np.int64)
    KB2[:] = KZ
    fb = _zeros(nb)
    # Per block: an emission product of frame t underflowed (uf); the exponent bound of
    # what block j of beta' at t - 1 lost to underflows (KD), checked against that
    # frame's occupation (see below).
    uf = _zeros(nb + 1)
    KD = np.empty(nb, np.int64)
    KD[:] = KZ
    be[Lb] = 1.0
    KB[Lb >> bsh] = 0
    if Lb >= 1:
        bo[Lb - 1] = 1.0
        KB[(Lb - 1) >> bsh] = 0
    for sg in range(nseg - 1, -1, -1):
        t0 = sg * S
        t1 = min(Tb, t0 + S)
        if sg < nseg - 1:  # the last segment is still in the ring
            _copy_row(AE, 0, CE, sg)
            _copy_row(AO, 0, CO, sg)
            _copy_row(KA, 0, CK, sg)
            _fast_alpha(x, tb_layout, b, C, lab, Tb, fused, dp, _NO(), t0, t1, lses,
                        E, AE, AO, KA, CE, CO, CK, sk, lp, bsh, _NO())
        for t in range(t1 - 1, t0 - 1, -1):
            r = t - t0
            lo = max(0, K - 2 * (Tb - t))
            hi = min(K - 1, 2 * t + 1)
            ie0, ie1 = (lo + 1) // 2, hi // 2
            io0, io1 = lo // 2, (hi - 1) // 2
            j0 = min(ie0, io0) >> bsh
            j1 = max(ie1, io1) >> bsh
            kmax = KZ
            for j in range(j0, j1 + 1):
                if KA[r, j] != KZ and KB[j] != KZ:
                    kmax = max(kmax, KA[r, j] + KB[j])
            if kmax == KZ:
                return FALLBACK
            for j in range(j0, j1 + 1):
                # beta' values of block j lost to underflow (each below 2**KD[j] / 2) times
                # its alpha (below 2**(KA + 1)), 2 bw states: below 2**-893 of the frame's
                # largest block product, so below 2**-293 of the likelihood (Z >= Z_MIN).
                if KD[j] != KZ and KA[r, j] != KZ and KA[r, j] + KD[j] > kmax - 900:
                    return FALLBACK
                # and alpha's, likewise
                if KA[r, nb + j] != KZ and KB[j] != KZ and KB[j] + KA[r, nb + j] > kmax - 900:
                    return FALLBACK
                fb[j] = _p2(KA[r, j] + KB[j] - kmax) if (KA[r, j] != KZ and KB[j] != KZ) else 0.0
            ze = 0.0
            zo = 0.0
            for j in range(j0, j1 + 1):
                fj = fb[j]
                base = j << bsh
                for i in range(max(ie0, base), min(ie1, base + bw - 1) + 1):
                    ze += AE[r, i] * be[i] * fj
                for i in range(max(io0, base), min(io1, base + bw - 1) + 1):
                    zo += AO[r, i] * bo[i] * fj
            Z = ze + zo
            if not Z >= Z_MIN:
                return FALLBACK
            invZ = 1.0 / Z
            if not fused:
                _zero_rows(grad, tb_layout, b, t, t + 1)
            _grad_sub(grad, tb_layout, t, b, lab[0], ze * invZ)
            for i in range(io0, io1 + 1):
                _grad_sub(grad, tb_layout, t, b, lab[i + 1],
                          AO[r, i] * bo[i] * (fb[i >> bsh] * invZ))
            if t == 0:
                break
            # emission-inclusive beta at t over the band of t, then beta' at t - 1
            eb = E[r, 0]
            nuf = 0
            for i in range(ie0, ie1 + 1):
                bv = be[i]
                v = bv * eb
                ie_[i] = v
                nuf += (bv > 0.0) & (eb > 0.0) & (v < TINY)
            for i in range(io0, io1 + 1):
                bv = bo[i]
                e = E[r, i + 1]
                v = bv * e
                io_[i] = v
                nuf += (bv > 0.0) & (e > 0.0) & (v < TINY)
            anyuf = nuf > 0
            if anyuf:  # rare: which blocks' products underflowed
                for j in range(j0, j1 + 2):
                    uf[j] = 0.0
                for i in range(ie0, ie1 + 1):
                    if (be[i] > 0.0) & (eb > 0.0) & (ie_[i] < TINY):
                        uf[i >> bsh] = 1.0
                for i in range(io0, io1 + 1):
                    if (bo[i] > 0.0) & (E[r, i + 1] > 0.0) & (io_[i] < TINY):
                        uf[i >> bsh] = 1.0
            KB2[:] = KZ
            KD[:] = KZ
            lo = max(0, K - 2 * (Tb - t + 1))
            hi = min(K - 1, 2 * t - 1)
            je0, je1 = (lo + 1) // 2, hi // 2
            jo0, jo1 = lo // 2, (hi - 1) // 2
            for j in range(min(je0, jo0) >> bsh, (max(je1, jo1) >> bsh) + 1):
                base = j << bsh
                top = base + bw - 1
                # at the exponent of t (an all-zero block: its upper neighbour's); the upper
                # neighbour's first states enter scaled by f
                ku = KB[j + 1] if j + 1 < nb else KZ
                kj = KB[j] if KB[j] != KZ else (ku if ku != KZ else 0)
                f = 0.0
                # underflowed products feeding the block: its own (at its exponent of t)
                # and its upper neighbour's first states (at that one's)
                kd = KZ
                if anyuf:
                    if uf[j] > 0.0:
                        kd = KB[j]
                    if uf[j + 1] > 0.0:
                        kd = max(kd, ku)
                nuf = 0
                if ku != KZ:
                    if ku - kj > 1000:
                        # The upper neighbour's states would enter past float64's range:
                        # the block works 2**1000 below it, its own products shifted down
                        # (those that underflow are dropped, and checked as any underflow).
                        kw = ku - 1000
                        g = _p2(kj - kw)
                        for i in range(max(ie0, base), min(ie1, top) + 1):
                            u = ie_[i]
                            ie_[i] = u * g
                            nuf += (u > 0.0) & (ie_[i] < TINY)
                        for i in range(max(io0, base), min(io1, top) + 1):
                            u = io_[i]
                            io_[i] = u * g
                            nuf += (u > 0.0) & (io_[i] < TINY)
                        kj = kw
                    f = _p2(ku - kj)
                m = 0.0
                a0 = max(je0, base)
                a1 = min(je1, top)
                for i in range(a0, a1 + 1):
                    v = ie_[i] + (io_[i] if i < Lb else 0.0)
                    be2[i] = v
                    m = max(m, v)
                b0 = max(jo0, base)
                b1 = min(jo1, top)
                for i in range(b0, b1 + 1):
                    po = ie_[i + 1] + (sk[i + 1] * io_[i + 1] if i + 1 < Lb else 0.0)
                    v = io_[i] + po * (f if i == top else 1.0)
                    bo2[i] = v
                    nuf += (po > 0.0) & (v < TINY)
                    m = max(m, v)
                # An underflow drops values below 2**(kd - 1020): checked at t - 1's
                # occupation against the alpha they would have met (exact where it passes;
                # a block of its own underflows whose max stays above DROP_MAX passes it).
                if nuf:
                    kd = max(kd, kj)
                if kd != KZ:
                    KD[j] = kd - 1018
                if m > 0.0:
                    ex_ = _expo(m)
                    sc = _p2(-ex_)
                    KB2[j] = kj + ex_
                    for i in range(a0, a1 + 1):
                        u = be2[i] * sc
                        be2[i] = u if u >= DROP else 0.0
                    for i in range(b0, b1 + 1):
                        u = bo2[i] * sc
                        bo2[i] = u if u >= DROP else 0.0
            be, be2 = be2, be
            bo, bo2 = bo2, bo
            KB, KB2 = KB2, KB
    return FAST


# --------------------------------------------------------------------------- extended range
# A value is a float64 mantissa in [1, 2) (or 0) times 2**k with an int64 k: the
# range never ends, so nothing underflows, and every operation keeps float64's
# relative precision. Terms more than 2**1022 below the largest term of a sum
# are dropped, which is below the sum's own rounding. Zero has exponent KNEG
# (three KNEGs still add up without int64 overflow).
KNEG = -(1 << 60)
# Log-probabilities below this (-1e9 nats: masks such as ``finfo.min``) go to the
# log-space sweep instead: their exponents, summed over up to 2**24 frames, must stay
# far above KNEG (at -1e19 they overflowed int64 and gave a wrong gradient).
_EXT_MIN_LP = -1e9


@njit(inline="always", cache=True, error_model="numpy")
def _pow2(d):
    """``2.0**d`` for int64 ``d <= 0``; 0 below ``-1022``."""
    dd = max(d, -1023)
    return np.int64((dd + 1023) << 52).view(np.float64)


@njit(inline="always", cache=True, error_model="numpy")
def _renorm(v, k):
    """``v * 2**k`` (``v >= 0`` normal or 0) as (mantissa in [1, 2), exponent) or (0, KNEG)."""
    bits = np.float64(v).view(np.int64)
    ex = ((bits >> 52) & 0x7FF) - 1023
    mm = np.int64((bits & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000).view(np.float64)
    pos = v > 0.0
    return (mm if pos else 0.0), (k + ex if pos else KNEG)




@njit(cache=True, error_model="numpy")
def _ext_emissions(xr, lab, lse, pen, em, ek):
    """Extended-range emissions ``(em, ek)`` of one frame (labels plus the delay penalty
    ``pen``); False on a non-finite log-probability or one below ``_EXT_MIN_LP`` (the
    caller then takes log space)."""
    nl = lab.shape[0]
    for j in range(nl):
        lp = xr[lab[j]] - lse
        if j > 0:
            lp += pen
        if lp == NEG_INF:
            em[j] = 0.0
            ek[j] = KNEG
        elif lp != lp or lp == INF or lp < _EXT_MIN_LP:
            return False
        else:
            n = math.floor(lp * _LOG2E + 0.5)
            r = (lp - n * _LN2_HI) - n * _LN2_LO
            em[j] = _exp(r)
            ek[j] = np.int64(n)
    return True


@njit(cache=True, error_model="numpy")
def _ext_alpha(x, tb_layout, b, C, lab, Tb, fused, dp, first, write_sm, grad, t0, t1, lses,
               Em, Ek, AEm, AEk, AOm, AOk, CEm, CEk, COm, COk, sk, ex):
    """Extended-range emissions and alpha of frames ``t0 <= t < t1`` into ring rows ``t % S``.

    ``first`` and the checkpoints as in ``_fast_alpha``. Returns False (first
    sweep only) on a non-finite input.
    """
    nl = lab.shape[0]
    Lb = nl - 1
    K = 2 * Lb + 1
    S = Em.shape[0]
    nck = CEm.shape[0]
    for t in range(t0, t1):
        r = t % S
        xr = _row(x, tb_layout, t, b)
        lse = 0.0
        if fused:
            if first:
                lse, s, m = _softmax_lse(xr, C, ex)
                if not (m > NEG_INF and m < INF):
                    return False
                lses[t] = lse
                if write_sm:
                    _write_softmax(grad, tb_layout, t, b, C, ex, s)
            else:
                lse = lses[t]
        if not _ext_emissions(xr, lab, lse, dp * ((Tb - 1) * 0.5 - t), Em[r], Ek[r]) and first:
            return False
        nm_e, nk_e, nm_o, nk_o = AEm[r], AEk[r], AOm[r], AOk[r]
        if t == t0:
            if first:  # frame 0; the buffers are fresh (zeros, KNEG)
                if K - 2 * Tb <= 0:
                    nm_e[0], nk_e[0] = _renorm(Em[r, 0], Ek[r, 0])
                if K > 1:
                    nm_o[0], nk_o[0] = _renorm(Em[r, 1], Ek[r, 1])
        else:
            p = (t - 1) % S
            lo = max(0, K - 2 * (Tb - t))
            hi = min(K - 1, 2 * t + 1)
            pm_e, pk_e, pm_o, pk_o = AEm[p], AEk[p], AOm[p], AOk[p]
            em0 = Em[r, 0]
            ek0 = Ek[r, 0]
            for i in range((lo + 1) // 2, hi // 2 + 1):
                k1 = pk_e[i]
                k2 = pk_o[i - 1] if i >= 1 else KNEG
                m2 = pm_o[i - 1] if i >= 1 else 0.0
                kk = max(k1, k2)
                w = pm_e[i] * _pow2(k1 - kk) + m2 * _pow2(k2 - kk)
                nm_e[i], nk_e[i] = _renorm(w * em0, kk + ek0)
            for i in range(lo // 2, (hi - 1) // 2 + 1):
                k1 = pk_o[i]
                k2 = pk_e[i]
                k3 = pk_o[i - 1] if (i >= 1 and sk[i]) else KNEG
                m3 = pm_o[i - 1] if (i >= 1 and sk[i]) else 0.0
                kk = max(k1, max(k2, k3))
                w = pm_o[i] * _pow2(k1 - kk) + pm_e[i] * _pow2(k2 - kk) + m3 * _pow2(k3 - kk)
                nm_o[i], nk_o[i] = _renorm(w * Em[r, i + 1], kk + Ek[r, i + 1])
            # exact zeros at the two states above the band: frame t + 1 reads them
            for s in range(hi + 1, min(hi + 3, K)):
                if s % 2 == 0:
                    nm_e[s // 2] = 0.0
                    nk_e[s // 2] = KNEG
                else:
                    nm_o[s // 2] = 0.0
                    nk_o[s // 2] = KNEG
        if first and r == 0 and t // S < nck:
            k = t // S
            _copy_row(CEm, k, AEm, r)
            _copy_row(CEk, k, AEk, r)
            _copy_row(COm, k, AOm, r)
            _copy_row(COk, k, AOk, r)
    return True


@njit(cache=True, error_model="numpy")
def _ctc_ext_one(x, tb_layout, b, C, lab, Tb, fused, dp, compute_grad, grad, out_loss, seg):
    """CTC of one sequence in extended-range probability arithmetic (``T_b >= 1``).

    Exact for any finite input (log-probabilities of any magnitude, ``-inf``
    included). Returns ``FAST`` (``out_loss[b]`` and rows ``t < T_b`` written),
    ``INFEASIBLE`` (likelihood exactly 0: ``+inf``, zero rows) or ``FALLBACK``
    (a non-finite input: nothing usable written).
    """
    nl = lab.shape[0]
    Lb = nl - 1
    K = 2 * Lb + 1
    no = max(Lb, 1)
    S = _seg_len(Tb, 16 * (nl + nl + no), compute_grad, seg)
    nseg = (Tb + S - 1) // S
    nck = nseg - 1 if compute_grad else 0
    lses = np.empty(Tb if fused else 0)
    ex = np.empty(C if fused else 0)
    sk = np.zeros(nl, np.bool_)
    for i in range(1, Lb):
        sk[i] = lab[i + 1] != lab[i]
    Em = np.empty((S, nl))
    Ek = np.empty((S, nl), np.int64)
    AEm = np.zeros((S, nl))
    AEk = np.full((S, nl), KNEG, np.int64)
    AOm = np.zeros((S, no))
    AOk = np.full((S, no), KNEG, np.int64)
    CEm = np.empty((nck, nl))
    CEk = np.empty((nck, nl), np.int64)
    COm = np.empty((nck, no))
    COk = np.empty((nck, no), np.int64)
    if not _ext_alpha(x, tb_layout, b, C, lab, Tb, fused, dp, _YES(), compute_grad, grad, _I0(), Tb,
                      lses, Em, Ek, AEm, AEk, AOm, AOk, CEm, CEk, COm, COk, sk, ex):
        return FALLBACK
    rf = (Tb - 1) % S
    k1 = AEk[rf, Lb]
    k2 = AOk[rf, Lb - 1] if Lb >= 1 else KNEG
    m2 = AOm[rf, Lb - 1] if Lb >= 1 else 0.0
    kk = max(k1, k2)
    pf = AEm[rf, Lb] * _pow2(k1 - kk) + m2 * _pow2(k2 - kk)
    if not pf > 0.0:
        out_loss[b] = INF
        if compute_grad:
            _zero_rows(grad, tb_layout, b, _I0(), Tb)
        return INFEASIBLE
    out_loss[b] = -(math.log(pf) + kk * math.log(2.0))
    if not compute_grad:
        return FAST

    bm_e = np.zeros(nl)
    bk_e = np.full(nl, KNEG, np.int64)
    bm_o = np.zeros(no)
    bk_o = np.full(no, KNEG, np.int64)
    cm_e = np.zeros(nl)
    ck_e = np.full(nl, KNEG, np.int64)
    cm_o = np.zeros(no)
    ck_o = np.full(no, KNEG, np.int64)
    im_e = np.zeros(nl + 1)
    ik_e = np.full(nl + 1, KNEG, np.int64)
    im_o = np.zeros(no + 1)
    ik_o = np.full(no + 1, KNEG, np.int64)
    gk_e = np.empty(nl, np.int64)
    gk_o = np.empty(no, np.int64)
    bm_e[Lb], bk_e[Lb] = 1.0, 0
    if Lb >= 1:
        bm_o[Lb - 1], bk_o[Lb - 1] = 1.0, 0
    for sg in range(nseg - 1, -1, -1):
        t0 = sg * S
        t1 = min(Tb, t0 + S)
        if sg < nseg - 1:  # the last segment is still in the ring
            _copy_row(AEm, 0, CEm, sg)
            _copy_row(AEk, 0, CEk, sg)
            _copy_row(AOm, 0, COm, sg)
            _copy_row(AOk, 0, COk, sg)
            _ext_alpha(x, tb_layout, b, C, lab, Tb, fused, dp, _NO(), _NO(), grad, t0, t1, lses,
                       Em, Ek, AEm, AEk, AOm, AOk, CEm, CEk, COm, COk, sk, ex)
        for t in range(t1 - 1, t0 - 1, -1):
            r = t - t0
            lo = max(0, K - 2 * (Tb - t))
            hi = min(K - 1, 2 * t + 1)
            ie0, ie1 = (lo + 1) // 2, hi // 2
            io0, io1 = lo // 2, (hi - 1) // 2
            am_e, ak_e, am_o, ak_o = AEm[r], AEk[r], AOm[r], AOk[r]
            kmax = KNEG
            for i in range(ie0, ie1 + 1):
                gk_e[i] = ak_e[i] + bk_e[i]
                kmax = max(kmax, gk_e[i])
            for i in range(io0, io1 + 1):
                gk_o[i] = ak_o[i] + bk_o[i]
                kmax = max(kmax, gk_o[i])
            ze = 0.0
            for i in range(ie0, ie1 + 1):
                ze += am_e[i] * bm_e[i] * _pow2(gk_e[i] - kmax)
            zo = 0.0
            for i in range(io0, io1 + 1):
                zo += am_o[i] * bm_o[i] * _pow2(gk_o[i] - kmax)
            Z = ze + zo
            if not Z > 0.0:
                return FALLBACK
            invZ = 1.0 / Z
            g = _row(grad, tb_layout, t, b)
            if not fused:
                g[:] = 0.0
            g[lab[0]] -= ze * invZ
            for i in range(io0, io1 + 1):
                g[lab[i + 1]] -= am_o[i] * bm_o[i] * _pow2(gk_o[i] - kmax) * invZ
            if t == 0:
                break
            em0 = Em[r, 0]
            ek0 = Ek[r, 0]
            for i in range(ie0, ie1 + 1):
                im_e[i] = bm_e[i] * em0
                ik_e[i] = bk_e[i] + ek0
            for i in range(io0, io1 + 1):
                im_o[i] = bm_o[i] * Em[r, i + 1]
                ik_o[i] = bk_o[i] + Ek[r, i + 1]
            lo = max(0, K - 2 * (Tb - t + 1))
            hi = min(K - 1, 2 * t - 1)
            for i in range((lo + 1) // 2, hi // 2 + 1):
                k1 = ik_e[i]
                k2 = ik_o[i] if i < Lb else KNEG
                m2 = im_o[i] if i < Lb else 0.0
                kk = max(k1, k2)
                w = im_e[i] * _pow2(k1 - kk) + m2 * _pow2(k2 - kk)
                cm_e[i], ck_e[i] = _renorm(w, kk)
            for i in range(lo // 2, (hi - 1) // 2 + 1):
                k1 = ik_o[i]
                k2 = ik_e[i + 1]
                ok3 = i + 1 < Lb and sk[i + 1]
                k3 = ik_o[i + 1] if ok3 else KNEG
                m3 = im_o[i + 1] if ok3 else 0.0
                kk = max(k1, max(k2, k3))
                w = im_o[i] * _pow2(k1 - kk) + im_e[i + 1] * _pow2(k2 - kk) + m3 * _pow2(k3 - kk)
                cm_o[i], ck_o[i] = _renorm(w, kk)
            bm_e, cm_e = cm_e, bm_e
            bk_e, ck_e = ck_e, bk_e
            bm_o, cm_o = cm_o, bm_o
            bk_o, ck_o = ck_o, bk_o
    return FAST


@njit(cache=True, error_model="numpy")
def _ctc_seq(addrs, x, tb_layout, targets, toff, il, tl, blank, fused, dp, compute_grad, grad,
             loss, status, mode, seg, w, b):
    """CTC loss (and gradient) of sequence ``b`` on the fast path, or ``PENDING``.

    ``seg``: frames per segment of the checkpointed sweeps, as ``_SEGMENT_OVERRIDE``.
    Updates: ``loss[b]`` (float64; float32 for float32 inputs), ``status[b]`` (FAST /
    INFEASIBLE / POISONED, or PENDING: the fast path failed or ``mode`` skips it, and
    ``_ctc_seq_slow`` finishes the sequence) and, when ``compute_grad``, sequence ``b``'s
    rows of ``grad``, scaled by the reduction's weight ``w`` while they are in cache.
    The slower paths are not called from here: Numba compiles every function a jitted
    function can reach, and each caller re-optimizes and re-emits its callees' code,
    so they cost a fresh cache ~60% more compile time although few inputs take them.
    Called through its address ``addrs[2]`` (``_call_seq``): compiled once, not
    inlined into ``_ctc_chunk`` (whose compile then took ~1.5 s more: Numba's IR inliner
    and type inference cost more than linearly in the function's size), nor optimized
    again there; ``_ctc_fast_one`` is called through its address ``addrs[0]``.
    """
    T = x.shape[0] if tb_layout else x.shape[1]
    C = x.shape[2]
    Tb = il[b]
    Lb = tl[b]
    if compute_grad:
        _zero_rows(grad, tb_layout, b, Tb, T)
    if _poisoned(x, tb_layout, b, Tb, C):
        # The values policy (API.md): NaN loss and gradient rows, this sequence only.
        loss[b] = np.nan
        status[b] = POISONED
        if compute_grad:
            for t in range(Tb):
                g = _row(grad, tb_layout, t, b)
                g[:] = np.nan
        return
    lab = _labels(targets, toff, b, Lb, blank)
    repeats = 0
    for j in range(1, Lb):
        repeats += lab[j + 1] == lab[j]
    if Tb == 0 or Tb < Lb + repeats:
        # Zero frames: only the empty target is feasible (probability 1).
        loss[b] = 0.0 if (Tb == 0 and Lb == 0) else INF
        status[b] = INFEASIBLE
        if compute_grad:
            _zero_rows(grad, tb_layout, b, _I0(), Tb)
        return
    st = PENDING
    if mode == 0:
        st = _call_fast_one(addrs[0], addrs, x, tb_layout, b, C, lab, Tb, fused, dp,
                            compute_grad, grad, loss, seg)
    if st != FAST:
        status[b] = PENDING
        return
    status[b] = FAST
    if compute_grad and w != 1.0:
        _scale_rows(grad, tb_layout, b, Tb, w)


@njit(inline="always", cache=True, error_model="numpy")
def _scale_rows(grad, tb_layout, b, Tb, w):
    for t in range(Tb):
        for c in range(grad.shape[2]):
            if tb_layout:
                grad[t, b, c] *= w
            else:
                grad[b, t, c] *= w


@njit(cache=True, error_model="numpy")
def _ctc_seq_slow(x, tb_layout, targets, toff, il, tl, blank, fused, dp, compute_grad, grad,
                  loss, status, mode, seg, w, b):
    """Sequence ``b`` left ``PENDING`` by ``_ctc_seq``: the extended-range path (unless
    ``mode == 2``), then log space; same updates as ``_ctc_seq``."""
    C = x.shape[2]
    Tb = il[b]
    lab = _labels(targets, toff, b, tl[b], blank)
    st = FALLBACK
    if mode <= 1:
        st = _ctc_ext_one(x, tb_layout, b, C, lab, Tb, fused, dp, compute_grad, grad, loss, seg)
        st = EXTENDED if st == FAST else st
    if st == FALLBACK:
        loss[b] = _ctc_log_one(x, tb_layout, b, C, lab, Tb, blank, fused, dp, compute_grad, grad,
                               seg)
    status[b] = st
    if compute_grad and w != 1.0:
        _scale_rows(grad, tb_layout, b, Tb, w)


# --------------------------------------------------------------------------- entry point
RED_NONE = reduce.NONE


def _jit_reduce(fn, **callees):
    """``fn`` of ``_core.reduce`` compiled here (inline), its calls to other functions of
    that module resolved to their compiled twins ``callees``: the reduction is written
    once, there, and this kernel runs it without a dispatch back to Python."""
    g = dict(fn.__globals__, **callees)
    return njit(inline="always", cache=True)(
        types_mod.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__))


_seq_weight = njit(inline="always", cache=True)(reduce.seq_weight)
_red_total = _jit_reduce(reduce.length_total)
_weighted_sum = _jit_reduce(reduce.weighted_sum, seq_weight=_seq_weight, length_total=_red_total)


@njit(inline="always", cache=True, error_model="numpy")
def _finish(loss, tl, red, zero_infinity, out, grad, tb_layout):
    """``zero_infinity`` (in place, on the losses and the gradient ``grad``, empty when
    none) and the reduction (``reduce.CODES``), as ``seqloss._core.reduce.finish``: the
    weighted sum ``sum_b w_b loss_b`` of the ``(B,)`` losses into the 0-D ``out``
    (accumulated in float64, one rounding)."""
    B = loss.shape[0]
    if zero_infinity:
        for b in range(B):
            if loss[b] == INF:
                # NaN stays NaN. An overflowed feasible path has finite occupations.
                loss[b] = 0.0
                if grad.size:
                    if tb_layout:
                        grad[:, b, :] = 0.0
                    else:
                        grad[b] = 0.0
    if red != RED_NONE:
        out[0] = _weighted_sum(red, loss, tl)


@intrinsic
def _ptr(typingctx, addr, like):
    """The integer ``addr`` as a pointer to values of ``like``'s type (for ``carray``)."""
    ptr_t = types.CPointer(like)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr_t))

    return ptr_t(addr, like), codegen


@intrinsic
def _call_fast_one(typingctx, addr, addrs, x, tb_layout, b, C, lab, Tb, fused, dp, compute_grad,
                   grad, out_loss, seg):
    """``_ctc_fast_one(x, ...)`` through the address ``addr`` of its compiled code.

    Why not a plain call: Numba links a callee's code into each caller and optimizes
    and emits it again there, so ``_ctc_fast_one`` (the largest function) was
    compiled three times over on a fresh cache (itself, ``_ctc_chunk`` and
    ``_ctc_fallback``); called through its address it is compiled once, per dtype,
    when that dtype is first used (``_ZERO``). The callee keeps Numba's calling
    convention (its exceptions propagate); the address is an argument, not a
    constant, so the callers stay cacheable.

    Subnormals are flushed to zero during the call (``flush``): the fast path treats a
    value below ``TINY`` as an underflow (dropped, or the sequence leaves the path), so
    a subnormal is never a result it keeps, but forming one costs a microcode assist; a
    delay penalty spreads the states apart, and k2's dp = 0.015 made T=1000 sequences
    2-7% slower (0-1% flushed). Gradient entries below the smallest normal number are
    written as 0.
    """
    argtys = (addrs, x, tb_layout, b, C, lab, Tb, fused, dp, compute_grad, grad, out_loss, seg)
    if argtys != _fast_one_sig(x.dtype):  # the address is of that signature's code
        raise TypeError(f"_call_fast_one: {argtys} != {_fast_one_sig(x.dtype)}")

    return types.int64(addr, *argtys), _call_codegen(types.int64, argtys, flush=True)


# MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6) flags, x86 only.
_FTZ_DAZ = 0x8040
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def _call_codegen(restype, argtys, flush=False):
    """Codegen of a call, in Numba's calling convention, of the function at ``args[0]``;
    ``flush``: with x86's FTZ and DAZ set for the call (the thread's MXCSR restored
    after it, before an exception propagates)."""

    def codegen(context, builder, signature, args):
        cc = context.call_conv
        fn = builder.inttoptr(args[0], cc.get_function_type(restype, argtys).as_pointer())
        retty = cc.get_return_type(restype).pointee
        ret = cgutils.alloca_once(builder, retty)
        builder.store(cgutils.get_null_value(retty), ret)
        exc = cgutils.alloca_once(builder, ir.PointerType(excinfo_t), name="excinfo")
        real = [ret, exc, *cc._get_arg_packer(argtys).as_arguments(builder, args[1:])]
        if flush and _X86:
            i8p = ir.IntType(8).as_pointer()
            fnty = ir.FunctionType(ir.VoidType(), [i8p])
            stx = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse.stmxcsr")
            ldx = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse.ldmxcsr")
            saved = cgutils.alloca_once(builder, ir.IntType(32))
            flags = cgutils.alloca_once(builder, ir.IntType(32))
            builder.call(stx, [builder.bitcast(saved, i8p)])
            builder.store(builder.or_(builder.load(saved), ir.Constant(ir.IntType(32), _FTZ_DAZ)),
                          flags)
            builder.call(ldx, [builder.bitcast(flags, i8p)])
            rc = builder.call(fn, real)
            builder.call(ldx, [builder.bitcast(saved, i8p)])
        else:
            rc = builder.call(fn, real)
        status = cc._get_return_status(builder, rc, builder.load(exc))
        with builder.if_then(status.is_error, likely=False):
            cc.return_status_propagate(builder, status)
        return context.get_returned_value(builder, restype, builder.load(ret))

    return codegen


def _address(disp, sig, restype):
    """The address of ``disp``'s code for the argument types ``sig`` (compiled, or loaded
    from the cache, now)."""
    disp.compile(sig)
    cres = disp.overloads[sig]
    if cres.signature.return_type != restype:
        raise AssertionError(cres.signature)  # the caller reads a restype
    return cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)


def _seq_sig(dt):
    """``_ctc_seq``'s argument types as ``_ctc_chunk`` and ``_ctc_fallback`` call it."""
    x = types.Array(dt, 3, "C")
    i64, flag, f64 = types.int64, types.boolean, types.float64
    a1, a2 = types.Array(i64, 1, "C"), types.Array(i64, 2, "C")
    return (a1, x, flag, a2, a1, a1, a1, i64, flag, f64, flag, x, types.Array(dt, 1, "C"), a1,
            i64, i64, f64, i64)


@intrinsic
def _call_seq(typingctx, addr, addrs, x, tb_layout, targets, toff, il, tl, blank, fused, dp,
              compute_grad, grad, loss, status, mode, seg, w, b):
    """``_ctc_seq(addrs, ...)`` through its address (as ``_call_fast_one``)."""
    argtys = (addrs, x, tb_layout, targets, toff, il, tl, blank, fused, dp, compute_grad, grad,
              loss, status, mode, seg, w, b)
    if argtys != _seq_sig(x.dtype):
        raise TypeError(f"_call_seq: {argtys} != {_seq_sig(x.dtype)}")
    return types.none(addr, *argtys), _call_codegen(types.none, argtys)


def _fused_rows_sig(dt):
    """``_fused_rows``' argument types as ``_ctc_fast_one`` calls it."""
    x = types.Array(dt, 3, "C")
    i64, flag = types.int64, types.boolean
    f1 = types.Array(types.float64, 1, "C")
    return (x, flag, i64, i64, i64, flag, x, f1, f1)


@intrinsic
def _call_fused_rows(typingctx, addr, x, tb_layout, b, C, Tb, write_sm, grad, lses, ex):
    """``_fused_rows(x, ...)`` through its address: compiled on the first fused call only."""
    argtys = (x, tb_layout, b, C, Tb, write_sm, grad, lses, ex)
    if argtys != _fused_rows_sig(x.dtype):
        raise TypeError(f"_call_fused_rows: {argtys} != {_fused_rows_sig(x.dtype)}")
    return types.none(addr, *argtys), _call_codegen(types.none, argtys)


@njit(nogil=True, cache=True, error_model="numpy")
def _ctc_chunk(kind, xp, tb_layout, T, B, C, tgp, R, S, concat, toffp, ilp, tlp, blank, fused,
               dp, compute_grad, gp, lossp, statusp, mode, seg, red, zero_infinity, outp, validate,
               chunk, job):
    """Sequences ``job * chunk`` to ``(job + 1) * chunk - 1``, one ``_ctc_seq`` each: a job
    of the pool (see ``_run_batch``).

    ``kind``: ``_ZERO[dtype]`` (``_FUSED[dtype]`` when ``fused``), the addresses of
    ``_ctc_fast_one``, ``_fused_rows`` (or 0) and ``_ctc_seq`` compiled for the
    inputs' dtype, in an array of that dtype. The arrays arrive as addresses of
    C-contiguous memory (torch tensors' ``data_ptr()``) with their shapes: ``x`` and
    ``grad`` ``(T, B, C)`` (``tb_layout``) or ``(B, T, C)`` of ``kind``'s dtype (float32
    or float64), ``targets (R, S)``, ``il``, ``tl`` and the offsets ``toff`` ``(B,)`` int64,
    ``loss (B,)``, ``status (B,)`` int64, ``out (1,)``.
    Address 0 (``toff``, ``loss``, ``status``, ``out``): not wanted, scratch memory is
    used. A numpy array per argument cost ``Tensor.numpy()`` (~0.5 us) or an allocation
    and ``torch.from_numpy`` each, and its unboxing here: a quarter of a B = 1 call.

    One dispatch from Python per chunk, not per sequence: a Numba call unboxes its
    arguments under the GIL, which takes as long as a short sequence's whole
    recursion, so per-sequence calls from a thread pool would mostly wait on the GIL.

    ``chunk = 0``: the whole call on the calling thread (a small batch, ``runs_inline``), in
    one dispatch instead of three: the value checks when ``validate`` (a nonzero
    return, as ``_check_values``: nothing computed; the offsets are then computed
    here), every sequence, then ``_finish`` into ``out``; or -1, nothing reduced, when a
    sequence is left ``PENDING`` (the caller then runs ``_ctc_fallback``). One function
    for both: a second entry point compiling the same callees costs 2.5-3.6 s more on a
    fresh cache.
    """
    zero = kind[0]
    i0 = np.int64(0)
    addrs = carray(_ptr(kind.ctypes.data, i0), (3,))  # (kind.view: one more overload)
    shape = (T, B, C) if tb_layout else (B, T, C)
    x = carray(_ptr(xp, zero), shape)
    grad = carray(_ptr(gp, zero), shape if compute_grad else (0, 0, 0))
    targets = carray(_ptr(tgp, i0), (R, S))
    il = carray(_ptr(ilp, i0), (B,))
    tl = carray(_ptr(tlp, i0), (B,))
    toff = carray(_ptr(toffp, i0), (B,)) if toffp != 0 else np.empty(0, np.int64)
    loss = carray(_ptr(lossp, zero), (B,)) if lossp != 0 else np.empty(B, x.dtype)
    status = carray(_ptr(statusp, i0), (B,)) if statusp != 0 else np.empty(B, np.int64)
    out = carray(_ptr(outp, zero), (1,)) if outp != 0 else np.empty(1, x.dtype)
    total = _red_total(red, tl)
    b0, b1 = job * chunk, min(B, (job + 1) * chunk)
    offs = toff
    if chunk == 0:
        b0, b1 = 0, B
        if validate:
            bad, offs = _check_values(targets, concat, il, tl, T, x.shape[2], blank)
            if bad:
                return bad
        elif concat:
            offs = _offsets(tl)
    pending = False
    for b in range(b0, b1):  # one call site: _ctc_seq is inlined
        _call_seq(addrs[2], addrs, x, tb_layout, targets, offs, il, tl, blank, fused, dp,
                  compute_grad, grad, loss, status, mode, seg, _seq_weight(red, tl[b], B, total), b)
        pending |= status[b] == PENDING
    if chunk > 0:
        return 0
    if pending:
        return -1  # the caller runs _ctc_fallback
    _finish(loss, tl, red, zero_infinity, out, grad, tb_layout)
    return 0


@njit(cache=True, error_model="numpy")
def _ctc_fallback(kind, xp, tb_layout, T, B, C, tgp, R, S, concat, toffp, ilp, tlp, blank,
                  fused, dp, compute_grad, gp, lossp, statusp, mode, seg, red, zero_infinity, outp,
                  validate):
    """``_ctc_chunk``'s arguments (the values checked): finishes the sequences that
    ``_ctc_chunk`` left ``PENDING`` (with ``statusp == 0`` it did not keep them: every
    sequence is run again, bit for bit), then ``_finish`` into ``out``. A separate
    entry point, so that it is compiled only when an input leaves the fast path."""
    zero = kind[0]
    i0 = np.int64(0)
    addrs = carray(_ptr(kind.ctypes.data, i0), (3,))  # (kind.view: one more overload)
    shape = (T, B, C) if tb_layout else (B, T, C)
    x = carray(_ptr(xp, zero), shape)
    grad = carray(_ptr(gp, zero), shape if compute_grad else (0, 0, 0))
    targets = carray(_ptr(tgp, i0), (R, S))
    il = carray(_ptr(ilp, i0), (B,))
    tl = carray(_ptr(tlp, i0), (B,))
    if toffp != 0:
        toff = carray(_ptr(toffp, i0), (B,))
    else:
        toff = _offsets(tl) if concat else np.empty(0, np.int64)
    loss = carray(_ptr(lossp, zero), (B,)) if lossp != 0 else np.empty(B, x.dtype)
    status = carray(_ptr(statusp, i0), (B,)) if statusp != 0 else np.empty(B, np.int64)
    out = carray(_ptr(outp, zero), (1,)) if outp != 0 else np.empty(1, x.dtype)
    total = _red_total(red, tl)
    for b in range(B):
        w = _seq_weight(red, tl[b], B, total)
        if statusp == 0:
            _call_seq(addrs[2], addrs, x, tb_layout, targets, toff, il, tl, blank, fused, dp,
                      compute_grad, grad, loss, status, mode, seg, w, b)
        if status[b] == PENDING:
            _ctc_seq_slow(x, tb_layout, targets, toff, il, tl, blank, fused, dp, compute_grad,
                          grad, loss, status, mode, seg, w, b)
    _finish(loss, tl, red, zero_infinity, out, grad, tb_layout)


# Lattice cells (the batch's sum of T_b (2 L_b + 1)) below which one thread runs them.
POOL_MIN_CELLS = 24000


def runs_inline(il: np.ndarray, tl: np.ndarray) -> bool:
    """Whether a batch of these ``(B,)`` int64 lengths runs on the calling thread (see
    ``_run_batch``): what ``ctc_loss_lane`` takes."""
    B = il.shape[0]
    return (B <= 1 or torch.get_num_threads() == 1
            or int(np.dot(il, 2 * tl + 1)) < POOL_MIN_CELLS)


def _run_batch(args: tuple, B: int, il: np.ndarray) -> None:
    """Run ``_ctc_seq`` for every sequence on the shared pool, in chunks, longest first.

    Why a thread pool and not ``prange``: a ``parallel=True`` driver around these
    functions took 25-45 s to compile (parfor lowering) on top of their own ~20 s,
    on every fresh install and for each dtype, and OpenMP's threads hang forked
    DataLoader workers; GIL-free calls give the same parallelism over the batch
    (sequences are independent: bit-deterministic whatever the schedule). A chunk is
    a contiguous range of sequences (about four chunks per thread), started in order
    of their total frames: in the ``(T, B, C)`` layout neighbouring sequences' rows
    share cache lines, and sequences interleaved between threads made every gradient
    write a false-sharing miss (T=26, B=64, C=7: two threads took 1.8x one thread's
    time, chunks of neighbours 0.55x).

    A small batch (``runs_inline``) runs on the calling thread instead: waking the pool's
    worker (and, on a small machine, sharing its core with torch's still-spinning
    OpenMP workers) costs more than it saves. Forward+backward, 2 threads against 1
    (us): T=50 B=8 L=10 197 / 152, T=26 B=16 L=8 212 / 140, B=32 243 / 238, B=64
    411 / 450.
    """
    n = max(1, min(torch.get_num_threads(), B))
    chunk = max(1, -(-B // (4 * n)))
    jobs = -(-B // chunk)
    cost = np.add.reduceat(il, np.arange(0, B, chunk)) if jobs > 1 else None
    run_jobs(_ctc_chunk, (*args, chunk), range(jobs), order=cost)


def _as_layout(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """A C-contiguous ``(T, B, C)`` (``True``) or ``(B, T, C)`` (``False``) view of ``x``."""
    if x.is_contiguous():
        return x, True
    if x.transpose(0, 1).is_contiguous():
        return x.transpose(0, 1), False
    return x.contiguous(), True


def _host_i64(t: torch.Tensor) -> torch.Tensor:
    if t.dtype != torch.int64 or not t.is_cpu or not t.is_contiguous() or t.requires_grad:
        t = t.detach().to(device="cpu", dtype=torch.int64).contiguous()
    return t


def _raise_bad(targets, input_lengths, target_lengths, T, C, blank) -> None:
    # The Numba checks found a bad value: the Python checks raise the error naming it.
    ctc_values(targets, input_lengths, target_lengths, T, C, blank, validate=True)
    raise AssertionError("seqloss: the Numba and Python CTC checks disagree")  # unreachable


_SCALAR = {torch.float32: torch.empty((), dtype=torch.float32),
           torch.float64: torch.empty((), dtype=torch.float64)}


def ctc_loss_lane(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    fused_log_softmax: bool,
    reduction: str,
    zero_infinity: bool,
    delay_penalty: float,
    compute_grad: bool,
    validate: bool,
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The eager CPU fast lane's whole call (``ctc/fast.py``): ``(loss, grad)`` (``grad``
    ``None`` unless ``compute_grad``) for a batch the calling thread runs
    (``runs_inline``) with dense targets and lengths and a dense ``(T, B, C)`` or
    ``(B, T, C)`` layout, else ``None`` (nothing done: the caller takes the general path).

    The op's arguments, checked by the caller: ``log_probs`` float32/float64 ``(T, B, C)``,
    ``targets`` int64 padded ``(B, S)`` or concatenated 1-D, lengths ``(B,)`` int64, all
    on the CPU; ``reduction`` resolved (no ``"mean"``). The values are checked here when
    ``validate`` (``ctc_values``'s errors, before anything is written). One Python frame
    from the caller to ``_ctc_chunk``: at T=20, B=1 the call's glue is a third of it.
    """
    T, B, C = log_probs.shape
    il, tl = input_lengths, target_lengths
    if B == 0 or not (targets.is_contiguous() and il.is_contiguous() and tl.is_contiguous()):
        return None
    if B > 1 and not runs_inline(il.numpy(), tl.numpy()):
        return None
    if log_probs.is_contiguous():
        tb_layout = True
    elif log_probs.transpose(0, 1).is_contiguous():
        tb_layout = False
    else:
        return None
    dt = log_probs.dtype
    grad = None
    if compute_grad:
        if T * B * C * dt.itemsize >= buffers.MIN_BYTES:  # long utterances: reused memory
            buf = buffers.empty((T, B, C) if tb_layout else (B, T, C), dt)
            view = buf if tb_layout else buf.transpose(0, 1)
            if view.stride() == log_probs.stride():
                grad = view
        if grad is None:
            # Dense in lp's layout (the kernel's view of it), the fake kernel's strides;
            # empty_like skips torch.empty's argument parsing (0.65 vs 1.3 us).
            grad = torch.empty_like(log_probs)
    red = reduce.CODES[reduction]
    # red 0 (RED_NONE): the (B,) losses; else the reduction, into a 0-D tensor
    if red == RED_NONE:
        res = log_probs.new_empty((B,))
        lossp, outp = res.data_ptr(), 0
    else:
        res = torch.empty_like(_SCALAR[dt])
        lossp, outp = 0, res.data_ptr()
    if targets.dim() == 1:
        concat, R, S = True, 1, targets.shape[0]
    else:
        concat = False
        R, S = targets.shape
    args = ((_FUSED if fused_log_softmax else _ZERO)[dt], log_probs.data_ptr(), tb_layout, T, B,
            C, targets.data_ptr(), R, S, concat, 0, il.data_ptr(), tl.data_ptr(), blank,
            fused_log_softmax, delay_penalty, grad is not None,
            0 if grad is None else grad.data_ptr(), lossp, 0, 0, _SEGMENT_OVERRIDE, red,
            zero_infinity, outp, validate)
    bad = _ctc_chunk(*args, 0, 0)
    if bad < 0:  # a sequence left the fast path
        _ctc_fallback(*args)
    elif bad:
        _raise_bad(targets, il, tl, T, C, blank)
    return res, grad


def ctc_loss_forward(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    fused_log_softmax: bool,
    compute_grad: bool,
    *,
    validate: bool = False,
    reduction: str = "none",
    zero_infinity: bool = False,
    delay_penalty: float = 0.0,
    _status: list | None = None,
    _path: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence CTC loss and gradient; see ``seqloss.ctc.reference.ctc_loss_forward``.

    Unlike the other backends it also takes concatenated 1-D targets, checks the
    values itself when ``validate`` (raising the same errors as ``ctc_values``,
    before anything is computed), applies the NaN policy in the kernel (a
    sequence with NaN or ``+inf`` in a read frame: NaN loss and gradient rows), and
    applies ``zero_infinity`` and the ``reduction`` as ``seqloss._core.reduce.finish``
    does (the mean's weights scale each sequence's gradient rows in the kernel): on a
    small batch the ~8 torch ops of ``finish`` cost as much as the recursion.

    ``delay_penalty``: k2's latency penalty (see the module docstring).

    Testing hooks: ``_status``, a list that receives the per-sequence path taken
    (``"fast"``, ``"extended"``, ``"logspace"``, ``"infeasible"`` or ``"nonfinite"``);
    ``_path`` (``"auto"``, ``"extended"``, ``"logspace"``) skips the faster paths.
    """
    T, B, C = log_probs.shape
    in_dtype = log_probs.dtype
    work = torch.float64 if in_dtype == torch.float64 else torch.float32
    tg = _host_i64(targets)
    concat = tg.dim() == 1
    R, S = (1, tg.shape[0]) if concat else tg.shape
    il_t = _host_i64(input_lengths)
    tl_t = _host_i64(target_lengths)
    il, tl = il_t.numpy(), tl_t.numpy()
    inline = runs_inline(il, tl)
    # inline: the one Numba call checks the values and finds the offsets
    toff = None if inline else _pool_offsets(tg, concat, R, S, il, tl, T, C, blank, validate,
                                             (targets, input_lengths, target_lengths))
    x = log_probs.detach()
    if x.dtype != work:
        x = x.to(work)  # half inputs: numba has no bfloat16; keeps the strides
    xv, tb_layout = _as_layout(x)
    gbuf = _grad_buffer((T, B, C) if tb_layout else (B, T, C), work) if compute_grad else None
    gp = 0 if gbuf is None else gbuf.data_ptr()
    grad = None if gbuf is None else (gbuf if tb_layout else gbuf.transpose(0, 1))
    # float32 losses are stored straight from the float64 accumulators (one rounding)
    loss = torch.empty(B, dtype=work)
    # the pool's jobs leave a sequence PENDING for _ctc_fallback in it
    status = torch.empty(B, dtype=torch.int64) if _status is not None or not inline else None
    red = _REDUCTIONS[reduction]
    out = torch.empty((), dtype=work)
    toff_t = torch.from_numpy(toff) if toff is not None and concat else None
    kind = (_FUSED if fused_log_softmax else _ZERO)[work]
    args = (kind, xv.data_ptr(), tb_layout, T, B, C, tg.data_ptr(), R, S, concat,
            0 if toff_t is None else toff_t.data_ptr(), il_t.data_ptr(), tl_t.data_ptr(),
            int(blank), bool(fused_log_softmax), float(delay_penalty), bool(compute_grad), gp,
            loss.data_ptr(), 0 if status is None else status.data_ptr(), _MODES[_path],
            int(_SEGMENT_OVERRIDE), red, bool(zero_infinity), out.data_ptr(), bool(validate))
    if inline:
        bad = _ctc_chunk(*args, 0, 0)
        if bad > 0:
            _raise_bad(targets, input_lengths, target_lengths, T, C, blank)
        if bad < 0:
            _ctc_fallback(*args)
    else:
        _run_pool(args, B, il, status, loss, out, gbuf, tl, red, zero_infinity, tb_layout)
    loss = loss if red == RED_NONE else out
    if _status is not None:
        _status.extend(_PATH_NAMES[int(s)] for s in status)
    if grad is None:
        return loss, log_probs.new_empty(0)
    return loss, (grad if grad.dtype == in_dtype else grad.to(in_dtype))


_MODES = {"auto": 0, "extended": 1, "logspace": 2}
_REDUCTIONS = reduce.CODES
_PATH_NAMES = {FAST: "fast", FALLBACK: "logspace", INFEASIBLE: "infeasible",
               EXTENDED: "extended", POISONED: "nonfinite"}


def _run_pool(args, B, il, status, loss, out, gbuf, tl, red, zero_infinity, tb_layout):
    """The batch on the pool (``_run_batch``), then the sequences it left ``PENDING`` and
    the reduction (``_ctc_fallback``), or else the reduction here (``_finish``)."""
    _run_batch(args, B, il)
    if (status.numpy() == PENDING).any():
        _ctc_fallback(*args)
    elif zero_infinity or red != RED_NONE:
        gv = gbuf.numpy() if gbuf is not None else np.empty((0, 0, 0), loss.numpy().dtype)
        _finish(loss.numpy(), tl, red, bool(zero_infinity), out.numpy().reshape(1), gv,
                tb_layout)


def _pool_offsets(tg, concat, R, S, il, tl, T, C, blank, validate, given):
    """For a batch the pool runs: the values checked when ``validate`` (the general path's
    errors, naming the ``given`` targets and lengths, before anything is computed) and the
    concatenated targets' offsets (``None`` for padded ones)."""
    if validate:
        bad, toff = _check_values(tg.numpy().reshape(R, S), concat, il, tl, T, C, int(blank))
        if bad:
            _raise_bad(*given, T, C, blank)
        return toff
    return _offsets(tl) if concat else None


def _grad_buffer(shape, dtype):
    """The gradient's buffer: reused memory for long utterances, else a fresh tensor."""
    if math.prod(shape) * dtype.itemsize >= buffers.MIN_BYTES:
        return buffers.empty(shape, dtype)
    return torch.empty(shape, dtype=dtype)


def _fast_one_sig(dt):
    """``_ctc_fast_one``'s argument types as ``_ctc_seq`` calls it, for ``dt`` (a numba dtype)."""
    x = types.Array(dt, 3, "C")
    i64, flag = types.int64, types.boolean
    return (types.Array(i64, 1, "C"), x, flag, i64, i64, types.Array(i64, 1, "C"), i64, flag,
            types.float64, flag, x, types.Array(dt, 1, "C"), i64)


class _Kinds(dict):
    """torch dtype -> the entry points' first argument (see ``_ctc_chunk``): the addresses
    of the dtype's ``_ctc_fast_one``, for ``fused`` kinds ``_fused_rows``
    (else 0), and ``_ctc_seq`` -- compiled, or loaded from the cache, on the first call
    that needs them -- in an array of that dtype. An array, not a tuple: the dispatcher
    types an array in C, a tuple in Python (~30 us a call)."""

    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.fused = fused

    def __missing__(self, dtype):
        f32 = dtype == torch.float32
        dt = types.float32 if f32 else types.float64
        addr = np.array([_address(_ctc_fast_one, _fast_one_sig(dt), types.int64),
                         _address(_fused_rows, _fused_rows_sig(dt), types.none) if self.fused
                         else 0,
                         _address(_ctc_seq, _seq_sig(dt), types.none)], np.int64)
        kind = self[dtype] = addr.view(np.float32 if f32 else np.float64)
        return kind


_ZERO = _Kinds(False)
_FUSED = _Kinds(True)
