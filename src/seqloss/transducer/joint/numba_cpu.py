r"""The table-driven joint on CPU: row passes over the logits and the lattice, in Numba.

Implements ``joint_loss_forward`` and ``joint_loss_forward_pair`` of
``seqloss.transducer.joint.reference`` (same signatures and semantics) for any
``JointTable``: RNN-T, multi-blank, TDT, HAT (its ``"hat"`` normalizer: the row passes
at any width, ``numba_rows``'s HAT jobs). Both read the token block and the duration
block through views of their own (``_forward``), so TDT's pair of tensors is never
concatenated.

Where the time goes: the loss is bound by one ``exp`` per logit and by memory traffic.
For float32/float64 logits at unit stride, rows of at least ``TABLE_MIN_ROW_WIDTH``
classes (HAT's: any), the prologue's passes run row by row in Numba (``numba_rows``: a
vectorized ``exp``, each row read from memory once per pass, many jobs on the shared
pool); the other cases (half precision, log-probabilities, a caller's gradient buffer
for the many-arc tables, other layouts) take torch's ops over chunks of frames for the
prologue, each chunk staying in cache between its passes (benchmarks/RESULTS.md has the
measurements behind the widths). The epilogue is Numba's row jobs everywhere.
The ``(B, T, U+1)`` lattice runs in Numba: one GIL-free function per
(sequence, direction) or sequence, on the shared thread pool
(:func:`seqloss._core.numba_pool.run_jobs`: fork-safe, the same result whatever the
thread count).

Memory: the gradient is the only logits-sized allocation (reused between calls:
``seqloss._core.buffers``), and none at all when the caller passes ``grad_buffer=logits``.
The prologue writes ``exp(x - m)`` into the gradient's buffer, and the epilogue rescales
it in place: one ``exp`` per logit, which bounds these passes (recomputing it in the
epilogue instead, one read of the logits for a write and a read of the buffer, measured
10-20% slower). Every gradient row, token or duration block, is written by one row
epilogue, ``numba_rows.grad_row``: called by the row jobs (``RowPasses.epilogue``) for
the ``_forward`` path and by the lattice kernel for the many-arc tables' compact path.
Half-precision gradients go through chunk-sized float32 temporaries (a half buffer is too
coarse to hold the exponentials: they are recomputed there, a second ``exp`` pass), cast
in once.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from numba import njit

from ..._core import buffers
from ..._core.numba_exp import vexp
from ..._core.numba_pool import CELL, own_lines, run_jobs
from ..lattice.numba_cpu import LOG, sweep, transducer_lattice
from .numba_rows import RowPasses, _flat, _rows_of, grad_row, rows_ok

# the backend's tile epilogue (the losses from the joint), re-exported
from .numba_rows import joint_tile_grad as joint_tile_grad
from .numba_rows import window_arcs as window_arcs
from .table import JointTable

NEG_INF = float("-inf")
NAN = float("nan")
# Elements per chunk of a sequence's logits (16 MiB in float32, within L3): a chunk written by
# one pass is still in cache for the next (L2/L3-sized on current x86 parts).
CHUNK_ELEMS = 1 << 22
# Token rows at least this wide (one vector of the row maximum's lanes) take the Numba
# row prologue, for every table (HAT's at any width: ``_row_prologue``); narrower ones
# torch's chunked ops. It won at every width measured: the many-arc tables down to 32
# (TDT, 2 threads: V = 128 -> 123 token classes 36.6 / 30.4 ms against 45.5 / 34.5 with
# torch's passes); RNN-T, once its epilogue was Numba's row jobs at every width too
# (B4-T200-U50, joint_loss_forward, row prologue / torch's: 2 threads V = 16 0.61, 32
# 0.78, 64 0.79, 128 0.63, 256 0.72, 511 0.79; 1 thread V = 16 0.87, 32 0.89, 128 0.83,
# 256 0.91), where torch's prologue left its OpenMP worker spinning through the lattice
# and the epilogue on the pool's (V = 128: the lattice 2.1 -> 3.5 ms).
TABLE_MIN_ROW_WIDTH = 16


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _seq_view(x: torch.Tensor, b: int, tb: int, ub: int, off: int) -> torch.Tensor:
    """Sequence ``b``'s read region as a ``(T_b, U_b+1, V)`` view (padded or packed)."""
    if x.dim() == 4:
        return x[b, :tb, : ub + 1]
    return x[off : off + tb * (ub + 1)].unflatten(0, (tb, ub + 1))


def _chunks(tb: int, ub: int, V: int):
    step = max(1, CHUNK_ELEMS // max(1, (ub + 1) * V))
    for t0 in range(0, tb, step):
        yield t0, min(tb, t0 + step)


# --------------------------------------------------------------------------- many-arc tables
# Multi-blank and TDT (any table but RNN-T's, float32/float64 input): the arcs are never
# materialized. Per state the lattice keeps compact scores (one log-prob per distinct blank
# class, one for the next label, the D duration log-probs), each arc's score is a sum of
# two of them (the lattice's sweep gathers them), and one Numba job per sequence runs
# alpha and beta, then per state the arcs' occupations and the whole epilogue of its
# gradient row (the occupations are kept for one frame only: the lattice's peak is a
# few numbers per state).


@njit(cache=True, nogil=True)
def _duration_rows(gd, g0, gsu, sd, t, n, od, tot, p, cls, fused, clamp, gscale, tiny):
    """The duration block's gradient rows of states ``(t, u)``, ``u < n``, starting at
    ``gd[g0 + u gsu]``: ``grad_row`` with the block's own normalizer, over the
    frame's ``n D`` entries at once (the ``D`` classes of each state, ``cls = 0 .. n D -
    1``), in a float64 scratch ``p``: ``exp(sd[t, u]) tot[u]`` (``fused``: the duration
    softmax times the state's occupancy, ``w = 1``), minus the occupations ``od[u D + k]``
    of the state's arcs taking duration ``k``; then stored in ``gd``'s dtype (``D``
    numbers a row: float64, rounded once). The exp in ``gd``'s dtype (float32: twice as
    fast; a relative error of eps in one term, where the lattice's scores are exact),
    written out (libm's, a call per entry, cost the epilogue of TDT with a caller's
    buffer 3 ms of 33, B4-T200-U50-V256).
    A function of its own: inlined into the lattice kernel's loop over the states, a
    second ``grad_row`` there cost its token rows 25-30% (multi-blank B4-T200-U50-V256),
    and one call per state 10% (TDT, ``D = 5``)."""
    D = sd.shape[2]
    if fused:
        sdt = sd[t].reshape(-1)  # the frame's rows, contiguous
        for j in range(n * D):
            p[j] = np.float64(vexp(gd.dtype.type(sdt[j])))
        for u in range(n):
            for k in range(D):
                p[u * D + k] *= tot[u]
    grad_row(p, 0, n * D, fused, 1.0, False, cls, od, 0, n * D, -1, 0.0, -1, 0.0, clamp,
             gscale, tiny)
    for u in range(n):
        d0 = g0 + u * gsu
        for k in range(D):
            gd[d0 + k] = p[u * D + k]


@njit(cache=True, nogil=True)
def _duration_scores(xd, fused, sd):
    """Duration log-probs of one sequence's rows: ``sd[t, u] = log_softmax(xd[t, u])``
    (``xd`` as given if not ``fused``); guarded (a row of ``-inf`` stays ``-inf``). The
    exps in ``xd``'s dtype (float32 for float32 input), the sum, the log and ``sd``
    in float64.

    Returns: whether a row holds NaN or ``+inf`` (the sequence's loss is then NaN).
    """
    tb, u1, D = xd.shape
    bad = False
    row = np.empty(D, dtype=xd.dtype)
    for t in range(tb):
        for u in range(u1):
            m = xd.dtype.type(NEG_INF)
            for k in range(D):
                v = xd[t, u, k]
                row[k] = v
                if v != v or v == math.inf:
                    bad = True
                if v > m:
                    m = v
            if not fused:
                for k in range(D):
                    sd[t, u, k] = row[k]
                continue
            if m == NEG_INF:
                for k in range(D):
                    sd[t, u, k] = NEG_INF
                continue
            for k in range(D):
                row[k] = row[k] - m
            s = 0.0
            for k in range(D):
                s += math.exp(row[k])
            ls = math.log(s)
            mv = np.float64(m)
            for k in range(D):
                # x - m exact in float64 (in float32 it is off by eps |x - m|: 3e-7 of
                # gradient error at logit scale 300); only the sum's exps in float32.
                sd[t, u, k] = (np.float64(xd[t, u, k]) - mv) - ls
    return bad


@njit(cache=True, nogil=True)
def _duration_job(xd, Tl, Ul, fused, sd, bad, job):
    """``_duration_scores`` of sequence ``b = job`` of a padded ``(B, T, U+1, D)`` block
    (a pool job: the other core is idle while the main thread computes them)."""
    b = job
    tb, ub = Tl[b], Ul[b]
    if tb == 0:
        bad[b] = 0
        return
    bad[b] = 1 if _duration_scores(xd[b, :tb, : ub + 1], fused, sd[b, :tb, : ub + 1]) else 0


@njit(cache=True, nogil=True)
def _token_scores(xb, xe, m, s, fused, sigma, dp, sb, se):
    """One sequence's blank-class and next-label log-probs minus ``sigma``.

    ``xb (T_b, U_b+1, nu)``, ``xe (T_b, U_b)`` the gathered logits; ``m``, ``s`` the rows'
    shift and ``sum exp(x - m)`` (a row with ``s = 0`` has no arc out of it). The
    log-prob is ``(x - m) - log(s)``, never ``x - (m + log(s))`` (logits of 1e4).
    The next label's also gains the delay penalty ``dp ((T_b - 1) / 2 - t)``: every
    emission arc leaving frame ``t`` scores it.
    """
    tb, u1, nu = xb.shape
    for t in range(tb):
        pen = dp * ((tb - 1) * 0.5 - t)
        for u in range(u1):
            if fused:
                sv = np.float64(s[t, u])
                if sv == 0.0:
                    for k in range(nu):
                        sb[t, u, k] = NEG_INF
                    if u < u1 - 1:
                        se[t, u] = NEG_INF
                    continue
                mv = np.float64(m[t, u])
                ls = math.log(sv)
                for k in range(nu):
                    sb[t, u, k] = ((np.float64(xb[t, u, k]) - mv) - ls) - sigma
                if u < u1 - 1:
                    se[t, u] = (((np.float64(xe[t, u]) - mv) - ls) - sigma) + pen
            else:
                for k in range(nu):
                    sb[t, u, k] = np.float64(xb[t, u, k]) - sigma
                if u < u1 - 1:
                    se[t, u] = (np.float64(xe[t, u]) - sigma) + pen


@njit(cache=True, nogil=True)
def table_lattice_kernel(sb, se, sd, Tl, Ul, bcol, bdl, bd, edl, ed, ce, skip, ll,
                         compute_grad, fused, scale, clamp, gscale, rs, tg, uniq,
                         gt, V, Wt, gd, Wd, cd, base, st, tiny, job):
    """Sequence ``b = job``: ``ll[b]`` and, with ``compute_grad``, its gradient rows.

    Arc ``i`` of the blank-like arcs scores ``sb[t, u, bcol[i]] (+ sd[t, u, bdl[i]])`` and
    advances ``bd[i]`` frames; emission ``j`` scores ``se[t, u, 0] (+ sd[t, u, edl[j]])``
    and advances ``ed[j]`` frames (``bdl``/``edl`` ``-1``: no duration term). Alpha and
    beta are the lattice's one recursion (``lattice.numba_cpu.sweep``, float64) on that
    gather; then, per state, its arcs' occupations ``exp(alpha + arc + beta' - ll)`` and
    its gradient row.

    The gradient row of state ``(t, u)`` is written where row ``base[b] + t st[b] + u``
    starts: ``gt[r Wt : r Wt + V]`` (token block, holding ``exp(x - m)`` when ``fused``)
    and ``gd[r Wd + cd : ... + D]`` (duration block), both by ``grad_row`` (the
    duration rows through ``_duration_rows``): ``softmax * total - occupations`` per
    block (``-occupations`` if not ``fused``), clamped to ``[-clamp, clamp]`` when
    ``clamp > 0``, then times ``gscale``. ``rs``: the token rows' ``sum exp(x - m)``.
    Sequences with ``skip[b]`` (NaN logits) and without a path get no row written.
    """
    b = job
    Tb, Ub = Tl[b], Ul[b]
    if skip[b]:
        ll[b] = NAN
        return
    if Tb == 0:
        ll[b] = NEG_INF
        return
    Db, De = bd.shape[0], ed.shape[0]
    nu, D = uniq.shape[0], sd.shape[3]
    sbb, seb, sdb = sb[b], se[b], sd[b]
    ecol = np.empty(De, dtype=np.int64)  # np.empty and fills: no np.zeros/np.arange compile
    ecol[:] = 0
    alpha = np.empty((Tb + 1, Ub + 1), dtype=np.float64)
    beta = np.empty((Tb + 1 if compute_grad else 1, Ub + 1), dtype=np.float64)
    lb = NEG_INF
    # One call site with a run-time direction: literal 0 and 1 compiled the sweep twice.
    for d in range(2 if compute_grad else 1):
        sweep(sbb, seb, sdb, bcol, bdl, ecol, edl, bd, ed, ce, Tb, Ub, beta if d else alpha, d,
              LOG)
        if d == 0:
            lb = alpha[Tb, Ub]
            ll[b] = lb
            if not compute_grad or lb == NEG_INF or lb != lb:
                return
    # Per frame, each arc's occupations along u (a vectorized float64 exp; the scores
    # are finite or -inf here: a NaN/+inf sequence is skipped, -inf gives exactly 0).
    occ = np.empty((Db + De, Ub + 1), dtype=np.float64)
    occ[:] = 0.0
    oc = np.empty(nu, dtype=np.float64)
    od = np.empty((Ub + 1) * D, dtype=np.float64)  # per state of the frame, per duration
    tot = np.empty(Ub + 1, dtype=np.float64)  # the frame's state occupancies
    pd, dcls = np.empty((Ub + 1) * D, dtype=np.float64), np.empty((Ub + 1) * D, dtype=np.int64)
    for k in range(dcls.shape[0]):
        dcls[k] = k
    for t in range(Tb - 1, -1, -1):
        a = alpha[t]
        for i in range(Db):
            o = occ[i]
            td = t + bd[i]
            if td > Tb:
                o[:] = 0.0
                continue
            bn = beta[td]
            ci, di = bcol[i], bdl[i]
            for u in range(Ub + 1):
                x = sbb[t, u, ci] + (sdb[t, u, di] if di >= 0 else 0.0)
                o[u] = vexp(a[u] + x + bn[u] - lb)
        for j in range(De):
            o = occ[Db + j]
            td = t + ed[j]
            o[Ub] = 0.0
            if td >= Tb + ce:
                o[:] = 0.0
                continue
            bn = beta[td]
            dj = edl[j]
            for u in range(Ub):
                x = seb[t, u, 0] + (sdb[t, u, dj] if dj >= 0 else 0.0)
                # FastEmit's (1 + lambda) on emissions
                o[u] = vexp(a[u] + x + bn[u + 1] - lb) * scale
        bt = beta[t]
        for u in range(Ub, -1, -1):
            # ---- the state's occupations -> its gradient row
            total = 0.0
            oe = 0.0
            for k in range(nu):
                oc[k] = 0.0
            d0 = u * D
            for k in range(D):
                od[d0 + k] = 0.0
            # Every value of the state's gradient row is at most its occupancy
            # exp(alpha + beta - ll) times (1 + lambda): at or below ``tiny`` (halved,
            # against rounding) the whole row is written 0, as computed in full.
            if math.exp(a[u] + bt[u] - lb) * scale * 2.0 > tiny:
                for i in range(Db):
                    o = occ[i, u]
                    oc[bcol[i]] += o
                    if bdl[i] >= 0:
                        od[d0 + bdl[i]] += o
                    total += o
                for j in range(De):
                    o = occ[Db + j, u]
                    oe += o
                    if edl[j] >= 0:
                        od[d0 + edl[j]] += o
                    total += o
            tot[u] = total
            r = base[b] + t * st[b] + u
            w = gt.dtype.type(0.0)  # not fused: the gradient of log-probabilities
            if fused:
                sv = np.float64(rs[b, t, u])
                wv = total / sv if sv > 0.0 else 0.0
                # every exp(x - m) w <= w: at or below tiny the row is written 0 (the
                # row's values are finite: a NaN sequence is skipped), scaled by 0 in
                # grad_row's loop: a memset of a cold row (ascending, rep stosb) cost
                # more than this prefetched stream (multi-blank at delay_penalty=0.5,
                # where ~40% of the rows are improbable: +8 ms of 43 ms)
                w = gt.dtype.type(wv) if wv > tiny else gt.dtype.type(0.0)
            # Backwards, as the sweep visits the rows: one descending stream through the
            # gradient, which the hardware prefetcher follows (rows read forwards each
            # started on cold lines: B4-T200-U50-V256 453 -> 205 ns a state, V=1024 498 ->
            # 296, V=128 248 -> 183). Values of magnitude below ``tiny`` are stored as 0
            # directly, without the microcode assist a subnormal result costs (rows of
            # improbable states).
            grad_row(gt, r * Wt, V, fused, w, True, uniq, oc, 0, nu, tg[b, u] if u < Ub else -1,
                     oe, -1, 0.0, clamp, gscale, tiny)
        if D:
            _duration_rows(gd, (base[b] + t * st[b]) * Wd + cd, Wd, sdb, t, Ub + 1, od, tot, pd,
                           dcls, fused, clamp, gscale, tiny)


# Gradient values below these are written as 0: float32/float64's smallest normal (the
# subnormals flushed, as by every Numba joint path: see numba_rows.grad_row), half
# precision's least subnormal halved (its block is float64, cast: what rounds to 0).
_TINY = {torch.float32: 2.0**-126, torch.float64: 2.0**-1022, torch.float16: 2.0**-25,
         torch.bfloat16: 2.0**-134}


def _is_rnnt(table: JointTable) -> bool:
    return (table.blank_durations == (1,) and table.emit_durations == (0,)
            and not table.emit_can_end and not table.num_durations)


def _table_path(table: JointTable, dtype: torch.dtype, grad_buffer: torch.Tensor | None) -> bool:
    """The compact many-arc path: any table but RNN-T's, float32/float64, no caller buffer."""
    return (not _is_rnnt(table) and dtype in (torch.float32, torch.float64)
            and grad_buffer is None)


def _forward_table(
    logits: torch.Tensor,
    dur_logits: torch.Tensor | None,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    table: JointTable,
    fused_log_softmax: bool,
    grad_tok: torch.Tensor | None,
    grad_dur: torch.Tensor | None,
    grad_scale: float,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """``_forward`` for many-arc tables (float32/float64), compact scores, fused epilogue.

    ``grad_tok``: the contiguous gradient buffer the token block's rows start in (the
    joint's whole gradient when ``rows`` -- the joint -- is given: the duration block is
    then its last ``D`` columns; else a tensor of its own, as ``grad_dur``). No gradient
    when ``grad_tok`` is ``None``.
    """
    acc = _acc_dtype(logits.dtype)
    packed = logits.dim() == 2
    D = table.num_durations
    Tl, Ul, T, U1, offs = _layout(logits, logit_lengths, target_lengths)
    B = len(Tl)
    tg = targets.cpu()
    nu = len(set(table.blank_tokens))
    compute_grad = grad_tok is not None
    whole = rows is not None and compute_grad  # token rows and duration columns in one buffer

    # Compact scores in float64 whatever the input: a float32 score of -60 (logits of
    # scale 30) is off by up to 2e-6, which the lattice sums along every path (TDT,
    # T=1000, U=100, V=16, logits times 30: 4.1e-6 of relative gradient error against
    # float64, 1e-7 this way). A few numbers per state, beside V + D logits.
    f64 = torch.float64
    sb = torch.empty((B, T, U1, nu), dtype=f64)
    se = torch.empty((B, T, U1, 1), dtype=f64)  # one column: the lattice's arc layout
    sd = torch.empty((B, T, U1, D) if D else (B, 1, 1, 0), dtype=f64)
    row_sum = torch.empty((B, T, U1), dtype=acc)
    skip = np.zeros(B, dtype=np.uint8)
    dur_bad = None
    if D and not packed and B > 1:
        # The duration log-probs of every sequence at once, on the pool.
        dur_bad = np.zeros(B, dtype=np.uint8)
        i64 = np.int64
        Tla, Ula = own_lines(np.asarray(Tl, dtype=i64)), own_lines(np.asarray(Ul, dtype=i64))
        run_jobs(_duration_job, (dur_logits.detach().numpy(), Tla, Ula, bool(fused_log_softmax),
                                 sd.numpy(), dur_bad),
                 range(B), order=[tb * (ub + 1) for tb, ub in zip(Tl, Ul, strict=True)],
                 work=CELL * sum(tb * (ub + 1) for tb, ub in zip(Tl, Ul, strict=True)))
    _table_prologue(logits, dur_logits, tg, Tl, Ul, offs, table, fused_log_softmax,
                    grad_tok, rows if whole else None, row_sum, sb, se, sd, skip, dur_bad)

    # ---- the lattice and, per state, its gradient row (one job per sequence)
    ll = _table_lattice(sb, se, sd, row_sum, tg, Tl, Ul, offs, T, table, fused_log_softmax,
                        skip, grad_tok, grad_dur if not whole else None, grad_scale,
                        packed, logits.dtype)
    del sb, se, sd, row_sum
    loss = (-ll * (1.0 + table.fastemit_lambda)).to(acc)  # NaN where skipped
    loss = loss.to(logits.device)
    if not compute_grad:
        return loss

    # ---- padding, sequences without a path (zero) and NaN sequences (NaN)
    _fill_grads((grad_tok,) if whole or not D else (grad_tok, grad_dur), ll.tolist(), skip, Tl,
                Ul, offs, packed)
    return loss


def _table_prologue(logits, dur_logits, tg, Tl, Ul, offs, table, fused_log_softmax, grad_tok,
                    rows, row_sum, sb, se, sd, skip, dur_bad) -> None:
    """The many-arc tables' prologue: each sequence's compact scores into ``sb``/``se``
    (``sd``: the duration log-probs, unless ``dur_bad`` says they are done), ``row_sum``,
    ``exp(x - m)`` into ``grad_tok`` (``rows``: the whole joint's rows), ``skip[b] = 1``
    for a sequence with a NaN/``+inf`` logit."""
    acc = _acc_dtype(logits.dtype)
    V, D = table.num_tokens, table.num_durations
    B, T, U1 = row_sum.shape
    uniq = sorted(set(table.blank_tokens))
    compute_grad = grad_tok is not None
    whole = rows is not None
    # The token rows' shift, sum and exp(x - m) (into the gradient, for the lattice
    # kernel to rescale) in one Numba pass per row where the layout allows. (Storing
    # the states' occupations for a parallel row epilogue that recomputes exp(x - m)
    # measured slower: two exps per logit instead of one.)
    g_tok = (grad_tok[..., :V] if whole else grad_tok) if compute_grad else None
    seq_bad = None
    if fused_log_softmax and rows_ok(V, logits, *(() if g_tok is None else (g_tok,)),
                                     min_width=TABLE_MIN_ROW_WIDTH):
        row_max = torch.empty((B, T, U1), dtype=acc)
        seq_bad = RowPasses(logits, Tl, Ul, offs, V, row_max, row_sum).prologue(g_tok)
    for b in range(B):
        tb, ub = Tl[b], Ul[b]
        if tb == 0:
            continue
        x = _seq_view(logits, b, tb, ub, offs[b])
        idx = tg[b, :ub].to(x.device)[None, :, None].expand(tb, ub, 1)
        xb = x[..., uniq].to(acc, copy=True)
        xe = x[:, :ub].gather(2, idx)[..., 0].to(acc)
        any_bad = False
        if dur_bad is not None:
            any_bad = bool(dur_bad[b])
        elif D:
            xd = _seq_view(dur_logits, b, tb, ub, offs[b]).detach()
            any_bad = _duration_scores(xd.numpy(), fused_log_softmax, sd[b, :tb, : ub + 1].numpy())
        s_b = row_sum[b, :tb, : ub + 1]
        if seq_bad is not None:
            m_b = row_max[b, :tb, : ub + 1]
            any_bad |= bool(seq_bad[b])
        else:
            m_b = torch.empty((tb, ub + 1), dtype=acc)
        g = _seq_view(grad_tok, b, tb, ub, offs[b]) if compute_grad else None
        xr = _seq_view(rows, b, tb, ub, offs[b]) if whole else None
        for t0, t1 in (() if seq_bad is not None else _chunks(tb, ub, V + (D if whole else 0))):
            xc = x[t0:t1]
            m = xc.amax(-1).to(acc)  # NaN/+inf anywhere poisons the row
            any_bad |= bool((~(m < float("inf"))).any())
            if not fused_log_softmax:
                continue
            m = torch.where(m == NEG_INF, 0.0, m)  # a row of -inf: shift 0, sum 0
            if g is not None:
                gc = g[t0:t1]
                # Whole rows of the joint (the duration columns: scratch, overwritten by
                # the kernel): a row of the token view alone is misaligned, slower.
                torch.sub(xr[t0:t1] if whole else xc, m[..., None], out=gc)
                gc.exp_()
                s = (gc[..., :V] if whole else gc).sum(-1, dtype=acc)
            else:
                s = torch.exp(xc.to(acc) - m[..., None]).sum(-1)
            s_b[t0:t1] = s
            m_b[t0:t1] = m
        if any_bad:
            skip[b] = 1
            continue
        _token_scores(xb.numpy(), xe.numpy(), m_b.numpy(), s_b.numpy(), fused_log_softmax,
                      float(table.sigma), float(table.delay_penalty), sb[b, :tb, : ub + 1].numpy(),
                      se[b, :tb, :ub, 0].numpy())
        del xb, xe, m_b


def _table_lattice(sb, se, sd, row_sum, tg, Tl, Ul, offs, T, table, fused_log_softmax, skip,
                   grad_tok, grad_dur, grad_scale, packed, dtype) -> torch.Tensor:
    """``log p (B,)`` float64 from ``table_lattice_kernel``, one job per sequence, and the
    gradient rows it writes (``grad_dur`` None: the duration block is the last ``D``
    columns of ``grad_tok``'s rows, or there is none)."""
    acc = _acc_dtype(dtype)
    V, D = table.num_tokens, table.num_durations
    B = len(Tl)
    uniq = sorted(set(table.blank_tokens))
    bcol = [uniq.index(c) for c in table.blank_tokens]
    bdl = [-1 if a.duration_logit is None else a.duration_logit for a in table.blank_arcs]
    edl = [-1 if a.duration_logit is None else a.duration_logit for a in table.emit_arcs]
    compute_grad = grad_tok is not None
    whole = grad_dur is None and D > 0
    ll = torch.empty((B,), dtype=torch.float64)
    i64 = np.int64
    if compute_grad:
        W = grad_tok.shape[-1]
        gt = grad_tok.view(-1).numpy()
        gd = gt if whole or not D else grad_dur.view(-1).numpy()
        Wd = W if whole or not D else D
        cd = V if whole else 0
        if packed:
            base, st = offs, [ub + 1 for ub in Ul]
        else:
            U1f = grad_tok.shape[2]
            base, st = [b * T * U1f for b in range(B)], [U1f] * B
    else:
        gt = gd = np.empty(0, dtype=np.float32 if acc == torch.float32 else np.float64)
        W = Wd = 1
        cd = 0
        base = st = [0] * B
    Tla, Ula = own_lines(np.asarray(Tl, dtype=i64)), own_lines(np.asarray(Ul, dtype=i64))
    run_jobs(table_lattice_kernel,
             (sb.numpy(), se.numpy(), sd.numpy(), Tla, Ula,
              own_lines(np.asarray(bcol, dtype=i64)), own_lines(np.asarray(bdl, dtype=i64)),
              own_lines(np.asarray(table.blank_durations, dtype=i64)),
              own_lines(np.asarray(edl, dtype=i64)),
              own_lines(np.asarray(table.emit_durations, dtype=i64)),
              int(table.emit_can_end), own_lines(skip), ll.numpy(), compute_grad,
              bool(fused_log_softmax), 1.0 + table.fastemit_lambda, float(table.clamp),
              float(grad_scale), row_sum.numpy(), np.ascontiguousarray(tg.numpy().astype(i64)),
              own_lines(np.asarray(uniq, dtype=i64)), gt, V, W, gd, Wd, cd,
              own_lines(np.asarray(base, dtype=i64)), own_lines(np.asarray(st, dtype=i64)),
              _TINY[dtype]),
             range(B), order=[tb * (ub + 1) for tb, ub in zip(Tl, Ul, strict=True)],
             work=(CELL + (W if compute_grad else 0))
             * sum(tb * (ub + 1) for tb, ub in zip(Tl, Ul, strict=True)))
    return ll


def _fill_grads(grads, llist, skip, Tl, Ul, offs, packed) -> None:
    """Zero on padding and for a sequence without a path, NaN for a skipped one."""
    for b in range(len(Tl)):
        tb, ub = Tl[b], Ul[b]
        if not packed:
            for gg in grads:
                gg[b, tb:].zero_()
                gg[b, :tb, ub + 1 :].zero_()
        if tb and (skip[b] or llist[b] == NEG_INF):
            for gg in grads:
                _seq_view(gg, b, tb, ub, offs[b]).fill_(NAN if skip[b] else 0.0)


def joint_loss_forward(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    table: JointTable,
    fused_log_softmax: bool,
    compute_grad: bool,
    grad_buffer: torch.Tensor | None = None,
    grad_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """See ``seqloss.transducer.joint.reference.joint_loss_forward``."""
    V, D = table.num_tokens, table.num_durations
    if _table_path(table, logits.dtype, grad_buffer):
        grad = buffers.empty(logits.shape, logits.dtype) if compute_grad else None
        loss = _forward_table(logits[..., :V] if D else logits, logits[..., V:] if D else None,
                              targets, logit_lengths, target_lengths, table, fused_log_softmax,
                              grad, None, grad_scale, rows=logits if D else None)
        return loss, (grad if grad is not None else logits.new_empty(0))
    grad = None
    if compute_grad:
        grad = grad_buffer if grad_buffer is not None else buffers.empty(
            logits.shape, logits.dtype, like=logits)
    loss = _forward(logits[..., :V] if D else logits, logits[..., V:] if D else None,
                    targets, logit_lengths, target_lengths, table, fused_log_softmax,
                    None if grad is None else (grad[..., :V] if D else grad),
                    None if grad is None or not D else grad[..., V:], grad_scale)
    return loss, (grad if grad is not None else logits.new_empty(0))


def joint_loss_forward_pair(
    token_logits: torch.Tensor,
    duration_logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    table: JointTable,
    fused_log_softmax: bool,
    compute_grad: bool,
    grad_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """See ``seqloss.transducer.joint.reference.joint_loss_forward_pair``."""
    if _table_path(table, token_logits.dtype, None):
        gt = buffers.empty(token_logits.shape, token_logits.dtype) if compute_grad else None
        gd = (buffers.empty(duration_logits.shape, duration_logits.dtype)
              if compute_grad else None)
        loss = _forward_table(token_logits, duration_logits, targets, logit_lengths,
                              target_lengths, table, fused_log_softmax, gt, gd, grad_scale)
        if not compute_grad:
            return loss, token_logits.new_empty(0), duration_logits.new_empty(0)
        return loss, gt, gd
    gt = (buffers.empty(token_logits.shape, token_logits.dtype, like=token_logits)
          if compute_grad else None)
    gd = (buffers.empty(duration_logits.shape, duration_logits.dtype, like=duration_logits)
          if compute_grad else None)
    loss = _forward(token_logits, duration_logits, targets, logit_lengths, target_lengths,
                    table, fused_log_softmax, gt, gd, grad_scale)
    if not compute_grad:
        return loss, token_logits.new_empty(0), duration_logits.new_empty(0)
    return loss, gt, gd


def _forward(
    logits: torch.Tensor,
    dur_logits: torch.Tensor | None,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    table: JointTable,
    fused_log_softmax: bool,
    grad: torch.Tensor | None,
    grad_dur: torch.Tensor | None,
    grad_scale: float,
) -> torch.Tensor:
    """The loss; the gradient written into ``grad`` (token block) and ``grad_dur``.

    ``logits`` is the token block ``(..., V)`` and ``dur_logits`` the duration block
    ``(..., D)`` (``None`` when ``D = 0``): views of one joint, or two tensors. No
    gradient when ``grad`` is ``None``. The gradient may be written over the logits
    (a caller's buffer): every logit is read before its entry is written.
    """
    acc = _acc_dtype(logits.dtype)
    Tl, Ul, T, U1, offs = _layout(logits, logit_lengths, target_lengths)
    B, D = len(Tl), table.num_durations
    tg = targets.cpu()
    # The lattice runs in float64 whatever the input: arc scores of -2e4 (logits of
    # 1e4) keep their small parts, and Numba's scalar log/exp cost the same.
    arc_blank = torch.empty((B, T, U1, len(table.blank_arcs)), dtype=torch.float64)
    arc_emit = torch.empty((B, T, U1, len(table.emit_arcs)), dtype=torch.float64)
    # Per row of the token block: the shift m (the max, 0 for a row of -inf) and
    # sum(exp(x - m)). Log-probs are (x - m) - log(sum), never x - (m + log(sum)):
    # with logits of 1e4 the latter loses float32's last digits to the rounding.
    row_max = torch.empty((B, T, U1), dtype=acc)
    row_sum = torch.empty((B, T, U1), dtype=acc)
    if table.hat and not fused_log_softmax:
        raise ValueError("a 'hat' table takes raw logits (fused_log_softmax=True)")
    passes, bad = _row_prologue(logits, grad, tg, Tl, Ul, offs, table, fused_log_softmax,
                                row_max, row_sum, arc_blank, arc_emit)
    # The duration log-probs (float64), kept for the epilogue: the duration gradient
    # may be written over the duration logits.
    sd = torch.empty((B, T, U1, D), dtype=torch.float64) if D else None
    work = None
    if passes is None:
        # torch's chunked passes for the prologue; the epilogue is the row jobs' all the same
        passes = RowPasses(logits, Tl, Ul, offs, table.num_tokens, row_max, row_sum,
                           hat_blank=table.blank_arcs[0].token if table.hat else -1)
        # A half-precision buffer is too coarse to hold exp(x - m): a chunk's scratch
        # instead (without a gradient too), for the prologue and the epilogue.
        work = (_scratch(Tl, Ul, table.num_tokens, acc)
                if grad is None or logits.dtype in (torch.float16, torch.bfloat16) else None)
        gathered = _prologue(logits, dur_logits, tg, Tl, Ul, offs, table, fused_log_softmax,
                             grad, row_max, row_sum, sd, work)
        bad = _arc_scores(gathered, Tl, Ul, table, fused_log_softmax, row_max, row_sum,
                          passes.hat_lsb, sd, arc_blank, arc_emit)
        del gathered

    # ---- core recursion
    ll, occ_b, occ_e = transducer_lattice(
        arc_blank, arc_emit, logit_lengths, target_lengths, table.blank_durations,
        table.emit_durations, grad is not None, table.emit_can_end, occupation_dtype=acc,
    )
    del arc_blank, arc_emit
    scale = 1.0 + table.fastemit_lambda
    loss = (-ll * scale).to(acc)
    if any(bad):
        loss = torch.where(torch.tensor(bad), NAN, loss)
    loss = loss.to(logits.device)
    if grad is None:
        return loss

    # ---- epilogue: occupations -> gradient, in the buffer holding exp(x - m)
    _gradients(logits, grad, grad_dur, tg, Tl, Ul, offs, table, fused_log_softmax, grad_scale,
               ll, occ_b, occ_e, bad, passes, sd, work)
    return loss


def _row_prologue(logits, grad, tg, Tl, Ul, offs, table, fused_log_softmax, row_max, row_sum,
                  arc_blank, arc_emit) -> tuple[RowPasses | None, list[bool] | None]:
    """``(passes, bad)`` where the Numba row passes take the prologue (RNN-T's topology,
    float32/float64 rows: the normalizers and the arcs; log-probabilities: the arcs);
    ``(None, None)`` otherwise."""
    # The passes over the logits row by row in Numba (one read of each row from memory)
    # where the layout allows; torch's ops over chunks of frames otherwise.
    # HAT's rows at any width (torch's ops would take the blank out of each row by a copy).
    if not (_is_rnnt(table)
            and rows_ok(table.num_tokens, logits, *(() if grad is None else (grad,)),
                        min_width=2 if table.hat else TABLE_MIN_ROW_WIDTH)):
        return None, None  # rows_ok: float32/float64 only
    passes = RowPasses(logits, Tl, Ul, offs, table.num_tokens, row_max, row_sum,
                       hat_blank=table.blank_arcs[0].token if table.hat else -1)
    # exp(x - m) goes into the gradient's buffer for the epilogue to rescale: one exp
    # per logit (the passes are bound by it) for a write and a read of the buffer.
    # The arcs too (RNN-T's topology: one blank arc, one emission arc), each row's
    # logits read once, before its exp is written (maybe over them).
    # Log-probabilities: no exp, the arcs read off the rows (the epilogue overwrites them).
    arcs = (arc_blank, arc_emit, table.blank_tokens[0], tg, table.sigma, table.delay_penalty)
    seq_bad = (passes.prologue(grad, arcs) if fused_log_softmax
               else passes.prologue(arcs=arcs, logprobs=True))
    return passes, [bool(seq_bad[b]) and Tl[b] > 0 for b in range(len(Tl))]


def _gradients(logits, grad, grad_dur, tg, Tl, Ul, offs, table, fused_log_softmax, grad_scale,
               ll, occ_b, occ_e, bad, passes, sd, work) -> None:
    """The epilogue: every gradient row by ``numba_rows.grad_row``, zero on padding and for
    a sequence without a path, NaN for a bad one. The token block: ``passes``' epilogue
    jobs in place over the ``exp(x - m)`` the prologue wrote into ``grad``, or over
    float32 chunk temporaries for a half-precision one (``_chunked_epilogue``); the
    duration block: ``_duration_grads``."""
    llist = ll.tolist()
    B = len(Tl)
    nan = np.asarray(bad, dtype=np.uint8)
    skip = np.asarray([bad[b] or llist[b] == NEG_INF for b in range(B)], dtype=np.uint8)
    args = (occ_b, occ_e, list(table.blank_tokens), tg, 1.0 + table.fastemit_lambda,
            table.clamp, grad_scale, skip)
    if grad.dtype in (torch.float32, torch.float64):
        passes.epilogue(grad, *args, scaled=fused_log_softmax)
    else:
        _chunked_epilogue(passes, logits, grad, passes.row_max, Tl, Ul, offs, fused_log_softmax,
                          args, work)
    grads = (grad,)
    if grad_dur is not None:
        _duration_grads(grad_dur, sd, occ_b, occ_e, Tl, Ul, offs, table, fused_log_softmax,
                        grad_scale, skip)
        grads = (grad, grad_dur)
    _fill_grads(grads, llist, nan, Tl, Ul, offs, logits.dim() == 2)


def _chunked_epilogue(passes, logits, grad, row_max, Tl, Ul, offs, fused_log_softmax, args,
                      work) -> None:
    """``passes.epilogue`` for a half-precision gradient: over chunks of frames in the
    float32 scratch ``work`` (``_scratch``), cast into ``grad`` (its buffer was too coarse
    to hold ``exp(x - m)``, which is recomputed from the logits here; Numba has no half
    type). ``args``: the epilogue's."""
    V, skip = passes.V, args[-1]
    for b in range(len(Tl)):
        tb, ub = Tl[b], Ul[b]
        if tb == 0 or skip[b]:
            continue
        g = _seq_view(grad, b, tb, ub, offs[b])
        x = _seq_view(logits, b, tb, ub, offs[b])
        for t0, t1 in _chunks(tb, ub, V):
            e = work[: (t1 - t0) * (ub + 1) * V].view(t1 - t0, ub + 1, V)
            if fused_log_softmax:
                e.copy_(x[t0:t1]).sub_(row_max[b, t0:t1, : ub + 1, None]).exp_()
            passes.epilogue(e, *args, scaled=fused_log_softmax, window=(b, t0, t1))
            g[t0:t1].copy_(e)


def _scratch(Tl: list[int], Ul: list[int], V: int, dtype: torch.dtype) -> torch.Tensor:
    """A flat scratch for the largest of ``_chunks``' chunks (one for every chunk: fresh
    pages for each would be faults)."""
    n = max((min(tb, max(1, CHUNK_ELEMS // ((ub + 1) * V))) * (ub + 1) * V
             for tb, ub in zip(Tl, Ul, strict=True)), default=0)
    return torch.empty(n, dtype=dtype)


@njit(cache=True, nogil=True)
def _duration_grad_job(sd, ob, oe, Tl, Ul, bdl, edl, fused, scale, clamp, gscale, tiny, gd, go,
                       gst, gsu, skip, job):
    """Sequence ``b = job``'s duration gradient rows, row ``(t, u)`` at ``gd[go[b] + t
    gst[b] + u gsu[b]]``, from its duration log-probs ``sd (B, T, U1, D)`` (raw values if
    not ``fused``) and arc occupations ``ob``/``oe`` (``(B, T, U1, Db/De)``; emissions on
    rows ``u < U_b``, times ``scale``), by ``_duration_rows``. ``bdl``/``edl``: each arc's
    duration column, -1 for none."""
    b = job
    if skip[b]:
        return
    D, Db, De, n = sd.shape[3], ob.shape[3], oe.shape[3], Ul[b] + 1
    sdb = sd[b]
    od = np.empty(n * D, dtype=np.float64)
    tot = np.empty(n, dtype=np.float64)
    p, cls = np.empty(n * D, dtype=np.float64), np.empty(n * D, dtype=np.int64)
    for k in range(cls.shape[0]):
        cls[k] = k
    for t in range(Tl[b]):
        od[:] = 0.0
        for u in range(n):
            total = 0.0
            for i in range(Db):
                o = np.float64(ob[b, t, u, i])
                total += o
                if bdl[i] >= 0:
                    od[u * D + bdl[i]] += o
            for j in range(De if u < n - 1 else 0):
                o = np.float64(oe[b, t, u, j]) * scale
                total += o
                if edl[j] >= 0:
                    od[u * D + edl[j]] += o
            tot[u] = total
        _duration_rows(gd, go[b] + t * gst[b], gsu[b], sdb, t, n, od, tot, p, cls, fused, clamp,
                       gscale, tiny)


def _duration_grads(grad_dur, sd, occ_b, occ_e, Tl, Ul, offs, table, fused_log_softmax,
                    grad_scale, skip) -> None:
    """The duration block's gradient into ``grad_dur`` by ``_duration_grad_job``: in place
    (float32/float64 at unit stride), else into a float64 ``(B, T, U1, D)`` block copied in
    per sequence (``D`` numbers a row)."""
    i64 = np.int64
    direct = (grad_dur.dtype in (torch.float32, torch.float64)
              and (grad_dur.shape[-1] <= 1 or grad_dur.stride(-1) == 1))
    gd = grad_dur if direct else torch.empty(sd.shape, dtype=torch.float64)
    addr = (own_lines(np.asarray(a, i64)) for a in _rows_of(gd, Tl, Ul, offs))
    bdl = [-1 if a.duration_logit is None else a.duration_logit for a in table.blank_arcs]
    edl = [-1 if a.duration_logit is None else a.duration_logit for a in table.emit_arcs]
    run_jobs(_duration_grad_job,
             (sd.numpy(), occ_b.numpy(), occ_e.numpy(), own_lines(np.asarray(Tl, i64)),
              own_lines(np.asarray(Ul, i64)), own_lines(np.asarray(bdl, i64)),
              own_lines(np.asarray(edl, i64)), bool(fused_log_softmax),
              1.0 + table.fastemit_lambda, float(table.clamp), float(grad_scale),
              _TINY[grad_dur.dtype], _flat(gd), *addr, own_lines(skip)),
             range(len(Tl)), order=[tb * (ub + 1) for tb, ub in zip(Tl, Ul, strict=True)],
             work=CELL * sum(tb * (ub + 1) for tb, ub in zip(Tl, Ul, strict=True)))
    for b in range(len(Tl)):
        tb, ub = Tl[b], Ul[b]
        if not direct and tb and not skip[b]:
            _seq_view(grad_dur, b, tb, ub, offs[b]).copy_(gd[b, :tb, : ub + 1])


def _layout(logits: torch.Tensor, logit_lengths: torch.Tensor,
            target_lengths: torch.Tensor) -> tuple[list[int], list[int], int, int, list[int]]:
    """``(T_b list, U_b list, T, U + 1, offs)``: ``offs[b]`` sequence ``b``'s first row
    in the packed layout (padded: ``T`` is the logits' and ``offs`` unused)."""
    Tl = logit_lengths.tolist()
    Ul = target_lengths.tolist()
    B = len(Tl)
    T = max(Tl, default=0) if logits.dim() == 2 else logits.shape[1]
    U1 = max(Ul, default=0) + 1
    offs = [0] * B
    for b in range(1, B):
        offs[b] = offs[b - 1] + Tl[b - 1] * (Ul[b - 1] + 1)
    return Tl, Ul, T, U1, offs


def _prologue(logits, dur_logits, tg, Tl, Ul, offs, table, fused_log_softmax, grad, row_max,
              row_sum, sd, work) -> list[tuple | None]:
    """Per sequence (torch's chunked passes): the normalizers into ``row_max``/``row_sum``
    (``exp(x - m)`` into ``grad``, or ``work``: see ``_normalizers``), the duration
    log-probs into ``sd``, NaN/``+inf`` detection and the gathers the arcs need, ``(xb,
    xe, any_bad)``; ``None`` for a sequence without frames."""
    acc = _acc_dtype(logits.dtype)
    V, D = table.num_tokens, table.num_durations
    uniq = sorted(set(table.blank_tokens))  # TDT: its blank arcs all score one class
    hb = table.blank_arcs[0].token if table.hat else -1  # HAT: the blank's class
    gathered: list[tuple | None] = [None] * len(Tl)
    for b in range(len(Tl)):
        tb, ub = Tl[b], Ul[b]
        if tb == 0:
            continue
        x = _seq_view(logits, b, tb, ub, offs[b])
        idx = tg[b, :ub].to(x.device)[None, :, None].expand(tb, ub, 1)
        # Gather before the buffer (maybe the logits themselves) is overwritten.
        xb = x[..., uniq].to(acc, copy=True)  # (tb, ub+1, distinct blank classes)
        xe = x[:, :ub].gather(2, idx)[..., 0].to(acc)
        any_bad = False
        if D:
            xd = _seq_view(dur_logits, b, tb, ub, offs[b]).detach().to(torch.float64)
            any_bad = _duration_scores(xd.numpy(), fused_log_softmax,
                                       sd[b, :tb, : ub + 1].numpy())
        g = _seq_view(grad, b, tb, ub, offs[b]) if grad is not None else None
        any_bad |= _normalizers(x, g, V, fused_log_softmax, hb, work, acc,
                                row_max[b, :tb, : ub + 1], row_sum[b, :tb, : ub + 1])
        gathered[b] = (xb, xe, any_bad)
    return gathered


def _normalizers(x, g, V, fused_log_softmax, hb, work, acc, m_b, s_b) -> bool:
    """One sequence's row normalizers over chunks of frames, into ``m_b``/``s_b``
    ``(T_b, U_b+1)``, ``exp(x - m)`` into ``g``, or into ``work`` (a flat scratch of a
    chunk in ``acc``: half precision, whose buffer is too coarse, or no gradient);
    whether a row holds a NaN/``+inf``. ``hb``: HAT's blank class (``-1``: a softmax
    table)."""
    any_bad = False
    for t0, t1 in _chunks(x.shape[0], x.shape[1] - 1, V):
        xc = x[t0:t1]
        m = xc.amax(-1).to(acc)  # NaN/+inf anywhere poisons the row
        any_bad |= bool((~(m < float("inf"))).any())
        if not fused_log_softmax:
            continue
        e = None if work is None else work[: xc.numel()].view(xc.shape).copy_(xc)
        if hb >= 0:  # the labels only: the blank's class out of the softmax
            e = xc.to(acc, copy=True) if e is None else e
            e[..., hb] = NEG_INF
            m = e.amax(-1)
        # A row of -inf logits has no arc out of it: shift by 0, sum 0, log_z -inf.
        m = torch.where(m == NEG_INF, 0.0, m)
        if work is None:
            torch.sub(xc if e is None else e, m[..., None], out=g[t0:t1])
            e = g[t0:t1]
        else:
            e.sub_(m[..., None])
        s_b[t0:t1] = e.exp_().sum(-1, dtype=acc)
        m_b[t0:t1] = m
    return any_bad


def _arc_scores(gathered, Tl, Ul, table, fused_log_softmax, row_max, row_sum, lsb, sd,
                arc_blank, arc_emit) -> list[bool]:
    """Each sequence's arc scores into ``arc_blank``/``arc_emit`` (float64) from its
    gathers, normalizers and duration log-probs ``sd`` (HAT: the blank's logsigmoid into
    ``lsb (B, T, U1)``, for the epilogue); which are bad."""
    lat = torch.float64
    sigma, dp = table.sigma, table.delay_penalty
    uniq = sorted(set(table.blank_tokens))
    tok_col = [uniq.index(c) for c in table.blank_tokens]
    b_dl = [a.duration_logit for a in table.blank_arcs]
    e_dl = [a.duration_logit for a in table.emit_arcs]
    bad = [False] * len(Tl)
    for b in range(len(Tl)):
        tb, ub = Tl[b], Ul[b]
        if tb == 0:
            continue
        xb, xe, any_bad = gathered[b]
        gathered[b] = None
        bad[b] = any_bad
        xb, xe = xb.to(lat), xe.to(lat)
        ld = sd[b, :tb, : ub + 1] if sd is not None else None
        if fused_log_softmax:
            m = row_max[b, :tb, : ub + 1].to(lat)
            s = row_sum[b, :tb, : ub + 1].to(lat)
            ls = torch.log(s)
            # A row of -inf logits (s = 0) has no arc out of it.
            xe = torch.where(s[:, :ub] == 0, NEG_INF, (xe - m[:, :ub]) - ls[:, :ub])
            if table.hat:  # the blank's sigmoid: its arc, and the labels' share
                zb = xb[..., 0]
                xb = F.logsigmoid(zb)
                lsb[b, :tb, : ub + 1] = xb
                xb = xb[..., None]
                xe = xe + F.logsigmoid(-zb[:, :ub])
            else:
                xb = torch.where(s[..., None] == 0, NEG_INF,
                                 (xb - m[..., None]) - ls[..., None])
        if sigma:
            xb = xb - sigma
            xe = xe - sigma
        if dp:
            # k2's delay penalty on every emission leaving frame t (float64: exact).
            xe = xe + dp * ((tb - 1) * 0.5 - torch.arange(tb, dtype=lat))[:, None]
        for i, dl in enumerate(b_dl):
            xi = xb[..., tok_col[i]]
            arc_blank[b, :tb, : ub + 1, i] = xi if dl is None else xi + ld[..., dl]
        for j, dl in enumerate(e_dl):
            arc_emit[b, :tb, :ub, j] = xe if dl is None else xe + ld[:, :ub, dl]
    return bad
