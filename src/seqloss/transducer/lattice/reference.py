r"""The transducer lattice in pure PyTorch: the float64 oracle and the kernel interface.

Every backend of the lattice (``numba_cpu.py``, ``triton_cuda.py`` beside this file)
exposes the same function with the same signature::

    transducer_lattice(arc_blank, arc_emit, logit_lengths, target_lengths,
                       blank_durations, emit_durations, compute_occupations,
                       emit_can_end=False) -> (log_likelihood, occ_blank, occ_emit)

It knows nothing of logits, vocabularies or log-softmax: every transducer flavour
(RNN-T, multi-blank, TDT, pruned) only builds different arc scores for it (the
joint's *prologue*, ``seqloss.transducer.joint``) and maps the arc occupations back
to its own gradient (the *epilogue*). ``seqloss.transducer_lattice`` is the public,
differentiable op on top of it.

The lattice
-----------
For sequence ``b`` with ``T_b`` frames and ``U_b`` target labels, the states are
``(t, u)`` with ``0 <= t <= T_b``, ``0 <= u <= U_b``; ``alpha(0, 0) = 0`` and the
final state is ``(T_b, U_b)``. Arcs leave frames ``t < T_b`` only:

* blank-like arc ``i`` (score ``arc_blank[b, t, u, i]``):
  ``(t, u) -> (t + blank_durations[i], u)``, allowed when ``t + d_i <= T_b``;
* emission arc ``j`` (score ``arc_emit[b, t, u, j]``):
  ``(t, u) -> (t + emit_durations[j], u + 1)``, allowed when ``u < U_b`` and
  ``t + d_j < T_b`` (an emission never ends the utterance: NeMo's multi-blank
  and TDT end on a blank-like arc), or ``t + d_j <= T_b`` with ``emit_can_end``
  (k2's "modified" topology, where a path may end on an emission)::

    alpha(t, u) = logsumexp( { alpha(t - d_i, u)     + arc_blank[t - d_i, u, i]     }_i
                           u { alpha(t - d_j, u - 1) + arc_emit[t - d_j, u - 1, j]  }_j )
    beta(t, u)  = logsumexp( { arc_blank[t, u, i] + beta(t + d_i, u)     }_i
                           u { arc_emit[t, u, j]  + beta(t + d_j, u + 1) }_j ),  beta(T_b, U_b) = 0
    log_likelihood[b] = alpha(T_b, U_b)       (-inf when T_b == 0: no frame, no path)
    occ_blank[b, t, u, i] = exp(alpha(t, u) + arc_blank[t, u, i] + beta(t + d_i, u)
                                - log_likelihood[b])
    occ_emit[b, t, u, j]  = exp(alpha(t, u) + arc_emit[t, u, j]  + beta(t + d_j, u + 1)
                                - log_likelihood[b])

An occupation is the posterior probability that a path takes the arc, i.e.
``d log_likelihood / d arc_score``. Blank durations must be ``>= 1`` and emission
durations ``>= 0``; every arc advances ``t + u``, so anti-diagonals are
independent (the reference iterates over them; a GPU kernel can too).

RNN-T (Graves, 2012) is ``blank_durations = (1,)``, ``emit_durations = (0,)``,
``arc_blank[t, u] = log p(blank | t, u)``, ``arc_emit[t, u] = log p(y_{u+1} | t, u)``.
Multi-blank RNN-T adds blank-like arcs (the big blanks' durations); TDT uses
``blank_durations = durations \ {0}`` and ``emit_durations = durations``, adding the
duration log-probabilities to the arc scores; the pruned RNN-T scatters its
``(B, T, s_range)`` window (first ``u`` of frame ``t`` at ``ranges[b, t, 0]``) into
the ``(B, T, U+1)`` arc grids with ``-inf`` outside, and gathers occupations back.

The max-plus semiring (Viterbi)
-------------------------------
The same lattice with ``max`` for ``logsumexp`` gives the best path instead of the sum
over paths (the alignments of ``seqloss.align``). Every backend also exposes::

    transducer_viterbi(arc_blank, arc_emit, logit_lengths, target_lengths,
                       blank_durations, emit_durations, emit_can_end=False)
        -> (score (B,) float64, frames (B, U) int64, emit_arcs (B, U) int64)

``delta(t, u) = max`` over the same incoming arcs of ``delta(source) + arc``, in float64
(one addition per arc, exact maxima, so every backend gives the same bits), with an
argmax back-pointer per state (stored, or recomputed by the backtrack from ``delta``
alone: the same sums, so the same bits); ``score = delta(T_b, U_b)``. Following the
back-pointers from ``(T_b, U_b)`` gives, for token ``u`` (``u < U_b``), the frame
its emission arc leaves (``frames``) and which emission arc it is (``emit_arcs``, an
index into ``emit_durations``); ``-1`` past ``U_b`` and for a sequence with no path
(``score = -inf``, and whenever ``T_b = 0``).

Ties (``viterbi_order``): the candidates of a state are ranked by the frame they
leave, earliest first (longest duration first), and at the same frame a blank-like
arc before an emission; a later candidate wins only when strictly greater. Read
backwards from the end, the path taken is, among the best ones, the one whose states
``(t, u)`` come earliest in ``t`` (then latest in ``u``) at the first place two best
paths differ. For RNN-T that is "the blank wins ties": each token is emitted at the
earliest frame a best path allows.

Conventions shared by every backend
-----------------------------------
* Arc tensors are ``(B, T, U+1, D)`` (``D`` arcs of the kind per state), float32
  or float64. Every backend accumulates alpha and beta in float64 (they reach
  thousands of nats, where float32's rounding would cost the occupations 1e-3) and
  rounds the log-likelihood and each occupation once to the arcs' dtype.
  Entries outside a sequence's valid arcs (``t >= T_b``, ``u > U_b``, emissions at
  ``u = U_b``, arcs landing past their limit) are never read and may hold
  anything, NaN included. Occupations there are exactly 0, and so is every
  occupation of a sequence with ``log_likelihood = -inf`` (infeasible).
* The recursion uses a guarded logaddexp: ``-inf`` is an exact zero, no epsilon.
  A term ``state + arc`` is ``-inf`` when either is, even if the other is NaN, and
  an occupation is exactly 0 when its source's alpha, its arc or its destination's
  beta is ``-inf``: a non-finite score on an arc no complete path takes never
  reaches the log-likelihood or a gradient.
* NaN/``+inf`` detection is the prologue's job (it reads every logit anyway):
  such a sequence gets a NaN loss and a NaN gradient on the region it reads
  (``t < T_b``, ``u <= U_b``, every class); padding gets exactly 0.
"""

from __future__ import annotations

import torch

from ..._core.logspace import logaddexp

NEG_INF = float("-inf")


def _term(s: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``s + x``, where -inf on either side is an exact zero, even beside a NaN: an arc out
    of an unreachable state (or into a dead end), or a masked arc, adds nothing."""
    return torch.where((s == NEG_INF) | (x == NEG_INF), NEG_INF, s + x)


def _diag(n: int, T: int, U1: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(t, u)``: the states of anti-diagonal ``t + u = n`` inside ``(T + 1, U1)``."""
    u = torch.arange(max(0, n - T), min(n, U1 - 1) + 1, device=device)
    return n - u, u


def _alpha(arc_blank: torch.Tensor, arc_emit: torch.Tensor, Tb: torch.Tensor, Ub: torch.Tensor,
           blank_durations: tuple[int, ...], emit_durations: tuple[int, ...],
           emit_can_end: bool) -> torch.Tensor:
    """``alpha (B, T + 1, U + 1)``, one anti-diagonal at a time (float64 arcs)."""
    B, T, U1, _ = arc_blank.shape
    dt, device = arc_blank.dtype, arc_blank.device
    alpha = torch.full((B, T + 1, U1), NEG_INF, dtype=dt, device=device)
    alpha[:, 0, 0] = 0.0
    for n in range(1, T + U1):
        t, u = _diag(n, T, U1, device)
        if t.numel() == 0:
            continue
        terms = []
        for i, d in enumerate(blank_durations):
            ts = t - d
            ok = (ts >= 0)[None] & (ts[None] < Tb) & (t[None] <= Tb) & (u[None] <= Ub)
            tsc = ts.clamp(min=0)
            v = _term(alpha[:, tsc, u], arc_blank[:, tsc, u, i])
            terms.append(torch.where(ok, v, NEG_INF))
        for j, d in enumerate(emit_durations):
            ts, us = t - d, u - 1
            # Destination frame t: < T_b, or <= T_b when an emission may end the path
            # (then the source frame must still be < T_b: arcs leave frames t < T_b only).
            dst_ok = (t[None] <= Tb) & (ts[None] < Tb) if emit_can_end else (t[None] < Tb)
            ok = (ts >= 0)[None] & (us >= 0)[None] & dst_ok & (u[None] <= Ub)
            tsc, usc = ts.clamp(min=0, max=max(T - 1, 0)), us.clamp(min=0)
            v = _term(alpha[:, tsc, usc], arc_emit[:, tsc, usc, j])
            terms.append(torch.where(ok, v, NEG_INF))
        alpha[:, t, u] = logaddexp(*terms)
    return alpha


def _beta(arc_blank: torch.Tensor, arc_emit: torch.Tensor, Tb: torch.Tensor, Ub: torch.Tensor,
          blank_durations: tuple[int, ...], emit_durations: tuple[int, ...],
          emit_can_end: bool) -> torch.Tensor:
    """``beta (B, T + 1, U + 1)``, ``beta(T_b, U_b) = 0``, one anti-diagonal at a time."""
    B, T, U1, _ = arc_blank.shape
    dt, device = arc_blank.dtype, arc_blank.device
    b1 = torch.arange(B, device=device)
    beta = torch.full((B, T + 1, U1), NEG_INF, dtype=dt, device=device)
    beta[b1, Tb[:, 0], Ub[:, 0]] = 0.0
    for n in range(T + U1 - 2, -1, -1):
        t, u = _diag(n, T, U1, device)
        if t.numel() == 0:
            continue
        src_ok = (t[None] < Tb) & (u[None] <= Ub)
        tc = t.clamp(max=T - 1) if T > 0 else t
        terms = []
        for i, d in enumerate(blank_durations):
            ok = src_ok & (t[None] + d <= Tb)
            v = _term(arc_blank[:, tc, u, i], beta[:, (t + d).clamp(max=T), u])
            terms.append(torch.where(ok, v, NEG_INF))
        for j, d in enumerate(emit_durations):
            lands = (t[None] + d <= Tb) if emit_can_end else (t[None] + d < Tb)
            ok = src_ok & (u[None] < Ub) & lands
            v = _term(arc_emit[:, tc, u, j],
                      beta[:, (t + d).clamp(max=T), (u + 1).clamp(max=U1 - 1)])
            terms.append(torch.where(ok, v, NEG_INF))
        beta[:, t, u] = torch.where(src_ok, logaddexp(*terms), beta[:, t, u])
    return beta


def _occupations(arc_blank: torch.Tensor, arc_emit: torch.Tensor, alpha: torch.Tensor,
                 beta: torch.Tensor, ll: torch.Tensor, Tb: torch.Tensor, Ub: torch.Tensor,
                 blank_durations: tuple[int, ...], emit_durations: tuple[int, ...],
                 emit_can_end: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(occ_blank, occ_emit)`` shaped like the arcs: ``exp(alpha + arc + beta - ll)``."""
    _, T, U1, _ = arc_blank.shape
    device = arc_blank.device
    tt = torch.arange(T, device=device)[None, :, None]
    uu = torch.arange(U1, device=device)[None, None, :]
    src_ok = (tt < Tb[:, :, None]) & (uu <= Ub[:, :, None])
    a = alpha[:, :T]
    ll_safe = torch.where(ll == NEG_INF, torch.zeros_like(ll), ll)[:, None, None]
    feasible = (ll != NEG_INF)[:, None, None]

    def occ(score: torch.Tensor, dst_beta: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
        # An arc no complete path takes (either end state, or the arc, -inf) is exactly 0.
        ok = ok & feasible & (a != NEG_INF) & (score != NEG_INF) & (dst_beta != NEG_INF)
        x = torch.where(ok, a + score + dst_beta - ll_safe, NEG_INF)
        return torch.exp(x)

    occ_blank = torch.zeros_like(arc_blank)
    for i, d in enumerate(blank_durations):
        dst = beta[:, (torch.arange(T, device=device) + d).clamp(max=T)]
        ok = src_ok & (tt + d <= Tb[:, :, None])
        occ_blank[..., i] = occ(arc_blank[..., i], dst, ok)
    occ_emit = torch.zeros_like(arc_emit)
    for j, d in enumerate(emit_durations):
        dst = beta[:, (torch.arange(T, device=device) + d).clamp(max=T)]
        dst = torch.cat([dst[:, :, 1:], torch.full_like(dst[:, :, :1], NEG_INF)], dim=2)
        lands = (tt + d <= Tb[:, :, None]) if emit_can_end else (tt + d < Tb[:, :, None])
        ok = src_ok & (uu < Ub[:, :, None]) & lands
        occ_emit[..., j] = occ(arc_emit[..., j], dst, ok)
    return occ_blank, occ_emit


def transducer_lattice(
    arc_blank: torch.Tensor,
    arc_emit: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank_durations: tuple[int, ...],
    emit_durations: tuple[int, ...],
    compute_occupations: bool,
    emit_can_end: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The transducer lattice recursion (see the module docstring for the math).

    Args:
        arc_blank: ``(B, T, U+1, Db)`` float32/float64 scores of the blank-like arcs.
        arc_emit: ``(B, T, U+1, De)`` scores of the emission arcs (same dtype).
        logit_lengths: ``(B,)`` int64 ``T_b <= T``, validated.
        target_lengths: ``(B,)`` int64 ``U_b <= U``, validated.
        blank_durations: ``Db`` frame advances, each ``>= 1`` (RNN-T: ``(1,)``).
        emit_durations: ``De`` frame advances, each ``>= 0`` (RNN-T: ``(0,)``).
        compute_occupations: also return the arc occupations (else empty tensors).
        emit_can_end: an emission may land on the final frame ``T_b`` (k2's
            "modified" topology): allowed when ``t + e_j <= T_b`` instead of ``< T_b``.

    Returns:
        ``log_likelihood (B,)`` in the arcs' dtype (``-inf`` when no path exists),
        ``occ_blank`` and ``occ_emit`` shaped like the arcs (or empty).

    The reference runs one vectorized step per anti-diagonal ``n = t + u``
    (batch and the diagonal's states at once), in float64 whatever the arcs' dtype;
    the results are rounded once to the arcs' dtype.
    """
    out_dt = arc_blank.dtype
    if out_dt != torch.float64:
        ll, ob, oe = transducer_lattice(arc_blank.double(), arc_emit.double(), logit_lengths,
                                        target_lengths, blank_durations, emit_durations,
                                        compute_occupations, emit_can_end)
        return ll.to(out_dt), ob.to(out_dt), oe.to(out_dt)
    B, T, U1, Db = arc_blank.shape
    device, dt = arc_blank.device, arc_blank.dtype
    if T == 0:  # every T_b = 0: no path (and no frame to index)
        ll = torch.full((B,), NEG_INF, dtype=dt, device=device)
        if not compute_occupations:
            return ll, arc_blank.new_empty(0), arc_emit.new_empty(0)
        return ll, torch.zeros_like(arc_blank), torch.zeros_like(arc_emit)
    Tb = logit_lengths.to(device)[:, None]
    Ub = target_lengths.to(device)[:, None]
    alpha = _alpha(arc_blank, arc_emit, Tb, Ub, blank_durations, emit_durations, emit_can_end)
    b1 = torch.arange(B, device=device)
    ll = alpha[b1, logit_lengths.to(device), target_lengths.to(device)]
    ll = torch.where(logit_lengths.to(device) == 0, NEG_INF, ll)
    if not compute_occupations:
        return ll, arc_blank.new_empty(0), arc_emit.new_empty(0)
    beta = _beta(arc_blank, arc_emit, Tb, Ub, blank_durations, emit_durations, emit_can_end)
    return (ll, *_occupations(arc_blank, arc_emit, alpha, beta, ll, Tb, Ub, blank_durations,
                              emit_durations, emit_can_end))


def viterbi_order(blank_durations: tuple[int, ...],
                  emit_durations: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """The tie-break rank of a state's incoming arcs, as ``(is_emission, index, duration)``:
    the earliest source frame first (the longest duration), a blank-like arc before an
    emission leaving the same frame, then by index. Shared by every backend."""
    arcs = [(0, i, int(d)) for i, d in enumerate(blank_durations)]
    arcs += [(1, j, int(d)) for j, d in enumerate(emit_durations)]
    return sorted(arcs, key=lambda a: (-a[2], a[0], a[1]))


def transducer_viterbi(
    arc_blank: torch.Tensor,
    arc_emit: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank_durations: tuple[int, ...],
    emit_durations: tuple[int, ...],
    emit_can_end: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The best path through the lattice (the max-plus semiring; module docstring).

    Arguments as ``transducer_lattice``'s. Returns ``(score (B,) float64, frames (B, U)
    int64, emit_arcs (B, U) int64)``. One vectorized step per anti-diagonal (batch and
    the diagonal's states at once), then a backtrack vectorized over the batch.
    """
    B, T, U1, _ = arc_blank.shape
    U = U1 - 1
    device = arc_blank.device
    f64 = torch.float64
    score = torch.full((B,), NEG_INF, dtype=f64, device=device)
    frames = torch.full((B, U), -1, dtype=torch.int64, device=device)
    arcs = torch.full((B, U), -1, dtype=torch.int64, device=device)
    if T == 0 or B == 0:
        return score, frames, arcs
    Tb = logit_lengths.to(device)[:, None]
    Ub = target_lengths.to(device)[:, None]
    delta = torch.full((B, T + 1, U1), NEG_INF, dtype=f64, device=device)
    delta[:, 0, 0] = 0.0
    # The back-pointer: the arc's code, i (blank-like) or Db + j (emission); -1: none.
    Db = len(blank_durations)
    bp = torch.full((B, T + 1, U1), -1, dtype=torch.int64, device=device)
    order = viterbi_order(blank_durations, emit_durations)
    for n in range(1, T + U1):
        u = torch.arange(max(0, n - T), min(n, U) + 1, device=device)
        t = n - u
        best = torch.full((B, u.numel()), NEG_INF, dtype=f64, device=device)
        arg = torch.full((B, u.numel()), -1, dtype=torch.int64, device=device)
        for is_emit, k, d in order:
            ts, us = t - d, u - is_emit
            if is_emit:
                dst_ok = (t[None] <= Tb) & (ts[None] < Tb) if emit_can_end else (t[None] < Tb)
                x = arc_emit[..., k]
            else:
                dst_ok = t[None] <= Tb
                x = arc_blank[..., k]
            ok = (ts >= 0)[None] & (us >= 0)[None] & dst_ok & (u[None] <= Ub)
            tsc, usc = ts.clamp(0, T - 1), us.clamp(min=0)
            v = delta[:, tsc, usc] + x[:, tsc, usc].to(f64)
            # Strictly greater: an earlier candidate in the order keeps a tie (and -inf
            # or NaN never wins).
            take = ok & (v > best)
            best = torch.where(take, v, best)
            arg = torch.where(take, k + Db * is_emit, arg)
        delta[:, t, u] = best
        bp[:, t, u] = arg

    b1 = torch.arange(B, device=device)
    Tl, Ul = logit_lengths.to(device), target_lengths.to(device)
    score = torch.where(Tl > 0, delta[b1, Tl, Ul], NEG_INF)
    if U == 0:
        return score, frames, arcs
    bd = torch.tensor([0, *blank_durations], dtype=torch.int64, device=device)
    ed = torch.tensor(emit_durations, dtype=torch.int64, device=device)
    t, u = Tl.clone(), Ul.clone()
    live = score > NEG_INF
    for _ in range(T + U):
        code = torch.where(live, bp[b1, t, u], -1)
        live = code >= 0
        if not bool(live.any()):
            break
        emit = live & (code >= Db)
        j = (code - Db).clamp(min=0)
        t = t - torch.where(emit, ed[j], bd[(code + 1).clamp(max=Db)])
        u = u - emit.long()
        col = u.clamp(0, U - 1)
        frames[b1, col] = torch.where(emit, t, frames[b1, col])
        arcs[b1, col] = torch.where(emit, j, arcs[b1, col])
    return score, frames, arcs
