r"""The transducer lattice with Triton: CUDA, or CPU under ``TRITON_INTERPRET=1``.

Implements ``transducer_lattice`` of ``seqloss.transducer.lattice.reference`` (same
signature and semantics: any blank and emission durations, ``emit_can_end``). The
joint's prologue and epilogue (``seqloss.transducer.joint.triton_cuda``) reuse
``transducer_alpha_beta`` (padded arcs) or ``transducer_alpha_beta_packed`` (arcs per
packed row, alpha and beta in per-sequence blocks at device-side offsets: sized from
shapes only, no device-to-host sync) and the helpers below.

Launches, in stream order (each phase is its own launch, so no program ever
reads what another program of the same launch writes):

1. ``transducer_alpha_beta_kernel``, grid ``(B, 2)``: program ``(b, 0)`` runs the
   forward recursion of sequence ``b`` and program ``(b, 1)`` the backward one,
   concurrently (they share nothing); each walks the anti-diagonals
   ``n = t + u`` with the diagonal's states in the lanes and stores them to its
   own ``(T_b+1, U_b+1)`` scratch. Grid ``(B, 1)`` (alpha only) without occupations.
2. ``transducer_occupation_kernel``: one program per block of states
   ``(b, t, u)``, ``occ = exp(alpha + arc + beta(destination) - log p)``; it reads
   alpha and beta, written by the previous launch, and writes only its own states'
   occupations.

Accumulation in float64 whatever the arcs' dtype (see the kernel). ``emit_can_end`` is
a ``tl.constexpr``: the default topology compiles exactly as before it existed. So is
the semiring (``MAXPLUS``: the alpha pass with ``max``, Viterbi's forward pass, launched
by ``triton_viterbi``): the log semiring's kernels compile to the same PTX as before it.
"""

# No ``from __future__ import annotations``: the interpreter of triton < 3.2 takes a
# parameter for ``tl.constexpr`` only when its annotation is the object itself.
import contextlib

import torch
import triton
import triton.language as tl

from ..._core.triton_compat import state_warps as _state_warps  # also: the interpreter fixes

__all__ = ["transducer_alpha_beta", "transducer_alpha_beta_packed", "transducer_lattice"]

NEG_INF = float("-inf")
NAN = float("nan")


# --------------------------------------------------------------------------- helpers
@triton.jit
def _occupation(b_a, b_arc, b_beta, b_ll, m):
    """``exp(alpha + arc + beta(destination) - log p)`` on ``m``, else exactly 0.

    Also exactly 0 where ``alpha``, the arc or ``beta`` is ``-inf`` (an arc no complete
    path takes), whatever the others hold: a NaN there must not reach a gradient."""
    m = m & (b_a != float("-inf")) & (b_arc != float("-inf")) & (b_beta != float("-inf"))
    b_ll = tl.where(m, b_ll, 0.0)
    return tl.where(m, tl.exp(tl.where(m, b_a + b_arc + b_beta - b_ll, float("-inf"))), 0.0)


@triton.jit
def _round_bf16(x):
    """float32 ``x`` rounded to the nearest bfloat16 (ties to even), still as float32.

    Compiled Triton casts float32 to bfloat16 with round-to-nearest-even, but the
    interpreter truncates; after this rounding both casts are exact, so the CPU
    results equal the GPU ones and torch's ``.to(torch.bfloat16)``. (Inf stays inf,
    NaN stays NaN: the carry never leaves an all-ones exponent.)
    """
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


# --------------------------------------------------------------------------- lattice
@triton.jit
def _alpha_pass(p_ab, p_ae, bd_ptr, ed_ptr, p_a, ll_ptr, i_b, T_b, U_b, U1, o_u,
                s_ab_t, s_ab_d, s_ae_t, s_ae_u, s_ae_d,
                NB: tl.constexpr, NE: tl.constexpr, EMIT_CAN_END: tl.constexpr, ACC: tl.constexpr,
                BLOCK_U: tl.constexpr, MAXPLUS: tl.constexpr):
    """Forward variables of one sequence, diagonal by diagonal (lane ``u``: state ``(n-u, u)``);
    with ``MAXPLUS`` the best scores instead (``max`` for the log-sum-exp: a NaN or
    ``-inf`` term never wins: ``-inf`` when no term is above it)."""
    tl.store(p_a + o_u, tl.zeros([BLOCK_U], ACC), mask=o_u == 0)
    tl.debug_barrier()
    # Each state is an online log-sum-exp over its incoming arcs, kept as
    # exp(m) * (1 + r): m the largest term so far, r >= 0 the others relative to it.
    # A new term v either adds exp(v - m) to r or becomes the maximum (r rescaled
    # by exp(m - v)); the result is m + log1p(r). Carrying r rather than 1 + r keeps
    # the small contributions' digits (the two-term case is exactly
    # max + log1p(exp(min - max))). -inf is an exact zero: the shift is 0 while
    # every term is -inf (no -inf - -inf), and m = -inf, r = 0 gives -inf.
    # log1p(r) = log(1 + r) * r / ((1 + r) - 1) (Goldberg, 1991, Thm. 4): exact to
    # a few ulps with any correctly rounded log; Triton has no log1p of its own.
    # A term is -inf when its state or its arc is (exactly zero, even beside a NaN:
    # an arc no complete path takes cannot poison the sum).
    # Written out rather than as a @triton.jit helper: the interpreter re-patches
    # the language module on every nested call (milliseconds), which dominated.
    for n in range(1, T_b + U_b + 1):
        t = n - o_u
        m_st = (o_u <= U_b) & (t >= 0) & (t <= T_b)
        b_m = tl.full([BLOCK_U], float("-inf"), ACC)
        b_r = tl.zeros([BLOCK_U], ACC)
        for i in tl.static_range(NB):
            ts = t - tl.load(bd_ptr + i)
            m_a = m_st & (ts >= 0)
            b_s = tl.load(p_a + ts * U1 + o_u, mask=m_a, other=float("-inf"))
            b_x = tl.load(p_ab + ts * s_ab_t + i * s_ab_d, mask=m_a, other=float("-inf")).to(ACC)
            b_v = tl.where((b_s == float("-inf")) | (b_x == float("-inf")), float("-inf"),
                           b_s + b_x)
            if MAXPLUS:
                b_m = tl.where(b_v > b_m, b_v, b_m)
            else:
                b_hi = tl.maximum(b_m, b_v, propagate_nan=tl.PropagateNan.ALL)
                b_e = tl.exp(tl.minimum(b_m, b_v) - tl.where(b_hi == float("-inf"), 0.0, b_hi))
                b_r = tl.where(b_v > b_m, (1.0 + b_r) * b_e, b_r + b_e)
                b_m = b_hi
        for j in tl.static_range(NE):
            ts = t - tl.load(ed_ptr + j)
            # An emission lands on the last frame T_b only with EMIT_CAN_END (else the
            # utterance ends on a blank); it always leaves a frame ts < T_b.
            if EMIT_CAN_END:
                m_a = m_st & (ts < T_b) & (o_u >= 1) & (ts >= 0)
            else:
                m_a = m_st & (t < T_b) & (o_u >= 1) & (ts >= 0)
            b_s = tl.load(p_a + ts * U1 + o_u - 1, mask=m_a, other=float("-inf"))
            b_x = tl.load(p_ae + ts * s_ae_t - s_ae_u + j * s_ae_d, mask=m_a,
                          other=float("-inf")).to(ACC)
            b_v = tl.where((b_s == float("-inf")) | (b_x == float("-inf")), float("-inf"),
                           b_s + b_x)
            if MAXPLUS:
                b_m = tl.where(b_v > b_m, b_v, b_m)
            else:
                b_hi = tl.maximum(b_m, b_v, propagate_nan=tl.PropagateNan.ALL)
                b_e = tl.exp(tl.minimum(b_m, b_v) - tl.where(b_hi == float("-inf"), 0.0, b_hi))
                b_r = tl.where(b_v > b_m, (1.0 + b_r) * b_e, b_r + b_e)
                b_m = b_hi
        if MAXPLUS:
            b_val = b_m
        else:
            b_u = 1.0 + b_r
            one = b_u == 1.0
            b_val = b_m + tl.where(one, b_r, tl.log(b_u) * (b_r / tl.where(one, 1.0, b_u - 1.0)))
        tl.store(p_a + t * U1 + o_u, b_val, mask=m_st)
        tl.debug_barrier()
    b_ll = tl.load(p_a + T_b * U1 + U_b)
    # No frame, no path (alpha(0, 0) = 0 is the empty path, not a transduction).
    tl.store(ll_ptr + i_b, tl.where(T_b > 0, b_ll, float("-inf")))


@triton.jit
def _beta_pass(p_ab, p_ae, bd_ptr, ed_ptr, p_b, T_b, U_b, U1, o_u,
               s_ab_t, s_ab_d, s_ae_t, s_ae_d,
               NB: tl.constexpr, NE: tl.constexpr, EMIT_CAN_END: tl.constexpr, ACC: tl.constexpr,
               BLOCK_U: tl.constexpr):
    """Backward variables of one sequence, diagonals from ``T_b + U_b`` down to 0."""
    for k in range(0, T_b + U_b + 1):
        n = T_b + U_b - k
        t = n - o_u
        m_st = (o_u <= U_b) & (t >= 0) & (t <= T_b)
        m_src = m_st & (t < T_b)  # arcs leave frames t < T_b only
        b_m = tl.full([BLOCK_U], float("-inf"), ACC)
        b_r = tl.zeros([BLOCK_U], ACC)
        for i in tl.static_range(NB):
            td = t + tl.load(bd_ptr + i)
            m_a = m_src & (td <= T_b)
            b_x = tl.load(p_ab + t * s_ab_t + i * s_ab_d, mask=m_a, other=float("-inf")).to(ACC)
            b_s = tl.load(p_b + td * U1 + o_u, mask=m_a, other=float("-inf"))
            b_v = tl.where((b_s == float("-inf")) | (b_x == float("-inf")), float("-inf"),
                           b_s + b_x)
            b_hi = tl.maximum(b_m, b_v, propagate_nan=tl.PropagateNan.ALL)
            b_e = tl.exp(tl.minimum(b_m, b_v) - tl.where(b_hi == float("-inf"), 0.0, b_hi))
            b_r = tl.where(b_v > b_m, (1.0 + b_r) * b_e, b_r + b_e)
            b_m = b_hi
        for j in tl.static_range(NE):
            td = t + tl.load(ed_ptr + j)
            if EMIT_CAN_END:
                m_a = m_src & (o_u < U_b) & (td <= T_b)
            else:
                m_a = m_src & (o_u < U_b) & (td < T_b)
            b_x = tl.load(p_ae + t * s_ae_t + j * s_ae_d, mask=m_a, other=float("-inf")).to(ACC)
            b_s = tl.load(p_b + td * U1 + o_u + 1, mask=m_a, other=float("-inf"))
            b_v = tl.where((b_s == float("-inf")) | (b_x == float("-inf")), float("-inf"),
                           b_s + b_x)
            b_hi = tl.maximum(b_m, b_v, propagate_nan=tl.PropagateNan.ALL)
            b_e = tl.exp(tl.minimum(b_m, b_v) - tl.where(b_hi == float("-inf"), 0.0, b_hi))
            b_r = tl.where(b_v > b_m, (1.0 + b_r) * b_e, b_r + b_e)
            b_m = b_hi
        b_u = 1.0 + b_r
        one = b_u == 1.0
        b_val = b_m + tl.where(one, b_r, tl.log(b_u) * (b_r / tl.where(one, 1.0, b_u - 1.0)))
        # Last frame: only the final state (T_b, U_b) is an end (beta = 0).
        b_val = tl.where(t == T_b, tl.where(o_u == U_b, 0.0, float("-inf")), b_val)
        tl.store(p_b + t * U1 + o_u, b_val, mask=m_st)
        tl.debug_barrier()


@triton.jit
def _sequence_layout(ab_ptr, ae_ptr, off_ptr, soff_ptr, i_b, U_b, T, U1, o_u,
                     s_ab_b, s_ab_t, s_ab_u, s_ae_b, s_ae_t, s_ae_u, PACKED: tl.constexpr):
    """Sequence ``i_b``'s arcs at ``t = 0`` per lane ``u`` and its frame strides, its row
    length and the offset of its states: ``(p_ab, p_ae, s_ab_ts, s_ae_ts, U1_s, o_seq)``.
    Layouts as in ``transducer_alpha_beta_kernel``."""
    o_u64 = o_u.to(tl.int64)  # for the strides: a non-contiguous arc tensor's may be large
    if PACKED:
        U1_s = U_b + 1  # the sequence's own row length
        o_row = tl.load(off_ptr + i_b)
        p_ab = ab_ptr + o_row * s_ab_b + o_u64 * s_ab_u
        p_ae = ae_ptr + o_row * s_ae_b + o_u64 * s_ae_u
        s_ab_ts = U1_s * s_ab_b
        s_ae_ts = U1_s * s_ae_b
        o_seq = tl.load(soff_ptr + i_b)
    else:
        U1_s = U1
        p_ab = ab_ptr + i_b * s_ab_b + o_u64 * s_ab_u
        p_ae = ae_ptr + i_b * s_ae_b + o_u64 * s_ae_u
        s_ab_ts = s_ab_t
        s_ae_ts = s_ae_t
        o_seq = i_b * (T + 1) * U1
    return p_ab, p_ae, s_ab_ts, s_ae_ts, U1_s, o_seq


@triton.jit
def transducer_alpha_beta_kernel(
    ab_ptr, ae_ptr, bd_ptr, ed_ptr, il_ptr, tl_ptr, off_ptr, soff_ptr, alpha_ptr, beta_ptr, ll_ptr,
    T, U1,
    s_ab_b, s_ab_t, s_ab_u, s_ab_d, s_ae_b, s_ae_t, s_ae_u, s_ae_d,
    NB: tl.constexpr, NE: tl.constexpr, EMIT_CAN_END: tl.constexpr,
    PACKED: tl.constexpr, BLOCK_U: tl.constexpr, MAXPLUS: tl.constexpr = False,
):
    r"""Program ``(b, 0)``: alpha of sequence ``b``; program ``(b, 1)``: its beta.
    ``MAXPLUS``: the max-plus semiring, alpha only (Viterbi's best scores, ``ll`` the best
    path's; ``triton_viterbi`` backtracks from them).

    Anti-diagonal ``n = t + u`` holds the states ``(n - u, u)``, one per lane ``u``::

        alpha(t, u) = logsumexp_i (alpha(t - d_i, u) + arc_blank[t - d_i, u, i])
                         (+) logsumexp_j (alpha(t - d_j, u - 1) + arc_emit[t - d_j, u - 1, j])
        beta(t, u)  = logsumexp_i (arc_blank[t, u, i] + beta(t + d_i, u))
                         (+) logsumexp_j (arc_emit[t, u, j] + beta(t + d_j, u + 1))

    (arc conditions as in ``seqloss.transducer.lattice.reference``). Every arc advances
    ``t + u`` by ``d + (emission)`` >= 1, so a diagonal depends only on earlier
    diagonals (later ones for beta), possibly several back when durations exceed 1.

    Layouts. Padded: arcs ``(B, T, U+1, .)`` (strides ``s_*_b, s_*_t, s_*_u, s_*_d``),
    alpha and beta ``(B, T+1, U+1)``. ``PACKED``: arcs are packed rows ``(N, .)``,
    sequence ``b``'s ``(t, u)`` at row ``off[b] + t (U_b+1) + u`` (``s_*_b`` = ``s_*_u``
    the row stride, ``s_*_t`` unused), and alpha, beta are flat, sequence ``b``'s
    ``(T_b+1) (U_b+1)`` states at ``soff[b] + t (U_b+1) + u``: no extent of the batch
    is needed on the host.

    Race-freedom on a GPU: the predecessors of a lane's state live in other lanes
    (other threads), so each diagonal goes through the program's own scratch in
    global memory. (1) No other program touches it: one program per (sequence,
    direction), alpha and beta have separate scratch, and the sequences' blocks are
    disjoint (packed: ``soff`` is the exclusive prefix sum of the block sizes).
    (2) Each state is stored
    exactly once, on its diagonal, and the loads of diagonal ``n`` address only
    diagonals stored at earlier iterations, each of which ended with
    ``tl.debug_barrier()`` (``bar.sync``: the CTA's earlier global stores are
    visible to all its threads after it). Arcs reaching back several diagonals
    (durations > 1) read states stored several barriers ago, which are never
    rewritten. So there is no read-after-write race (the barrier) and no
    write-after-read one (no slot is reused).

    Updates:
        alpha: ``log_alpha`` of the states ``t <= T_b``, ``u <= U_b``.
        beta: ``log_beta`` of the same states (programs ``(b, 1)``).
        ll (B,): ``alpha(T_b, U_b)``, ``-inf`` when ``T_b = 0``.

    In float64 whatever the arcs' dtype (read as they are): alpha and beta grow to
    thousands of nats, where float32's rounding summed over the ``T + U`` diagonals
    left the occupations wrong by 1e-3 and more.
    """
    ACC = tl.float64
    i_b = tl.program_id(0).to(tl.int64)
    i_dir = tl.program_id(1)
    T_b = tl.load(il_ptr + i_b)
    U_b = tl.load(tl_ptr + i_b)
    o_u = tl.arange(0, BLOCK_U)
    p_ab, p_ae, s_ab_ts, s_ae_ts, U1_s, o_seq = _sequence_layout(
        ab_ptr, ae_ptr, off_ptr, soff_ptr, i_b, U_b, T, U1, o_u,
        s_ab_b, s_ab_t, s_ab_u, s_ae_b, s_ae_t, s_ae_u, PACKED)
    if MAXPLUS:
        _alpha_pass(p_ab, p_ae, bd_ptr, ed_ptr, alpha_ptr + o_seq, ll_ptr, i_b, T_b, U_b, U1_s,
                    o_u, s_ab_ts, s_ab_d, s_ae_ts, s_ae_u, s_ae_d, NB, NE, EMIT_CAN_END, ACC,
                    BLOCK_U, True)
    elif i_dir == 0:
        _alpha_pass(p_ab, p_ae, bd_ptr, ed_ptr, alpha_ptr + o_seq, ll_ptr, i_b, T_b, U_b, U1_s,
                    o_u, s_ab_ts, s_ab_d, s_ae_ts, s_ae_u, s_ae_d, NB, NE, EMIT_CAN_END, ACC,
                    BLOCK_U, False)
    else:
        _beta_pass(p_ab, p_ae, bd_ptr, ed_ptr, beta_ptr + o_seq, T_b, U_b, U1_s, o_u,
                   s_ab_ts, s_ab_d, s_ae_ts, s_ae_d, NB, NE, EMIT_CAN_END, ACC, BLOCK_U)


@triton.jit
def transducer_occupation_kernel(
    ab_ptr, ae_ptr, bd_ptr, ed_ptr, il_ptr, tl_ptr, alpha_ptr, beta_ptr, ll_ptr, ob_ptr, oe_ptr,
    B, T, U1,
    s_ab_b, s_ab_t, s_ab_u, s_ab_d, s_ae_b, s_ae_t, s_ae_u, s_ae_d,
    NB: tl.constexpr, NE: tl.constexpr, EMIT_CAN_END: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """Arc occupations of a block of ``BLOCK_R`` states ``r = (b * T + t) * (U+1) + u``.

    ``occ = exp(alpha(t, u) + arc + beta(destination) - log p)`` on the arcs that
    exist (source ``t < T_b``, ``u <= U_b``; blank lands at ``t + d <= T_b``; emission
    needs ``u < U_b`` and lands at ``t + d < T_b``, or ``<= T_b`` with ``EMIT_CAN_END``)
    of feasible sequences, else 0.

    Updates:
        occ_blank (B, T, U+1, NB), occ_emit (B, T, U+1, NE) (contiguous): every entry,
        formed in float64 and rounded once to the arcs' dtype.
    """
    ACC = tl.float64
    i_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    TU1 = tl.cast(T, tl.int64) * U1  # 64-bit: B T (U+1) states may pass 2**31
    m_r = i_r < B * TU1
    i_b = i_r // TU1
    i_t = (i_r // U1) % T
    i_u = i_r % U1
    T_b = tl.load(il_ptr + i_b, mask=m_r, other=0)
    U_b = tl.load(tl_ptr + i_b, mask=m_r, other=0)
    b_ll = tl.load(ll_ptr + i_b, mask=m_r, other=float("-inf"))
    m_src = m_r & (i_t < T_b) & (i_u <= U_b) & (b_ll != float("-inf"))
    o_seq = i_b * (T + 1) * U1
    b_a = tl.load(alpha_ptr + o_seq + i_t * U1 + i_u, mask=m_src, other=float("-inf"))
    for i in tl.static_range(NB):
        td = i_t + tl.load(bd_ptr + i)
        m_a = m_src & (td <= T_b)
        b_arc = tl.load(ab_ptr + i_b * s_ab_b + i_t * s_ab_t + i_u * s_ab_u + i * s_ab_d,
                        mask=m_a, other=float("-inf")).to(ACC)
        b_beta = tl.load(beta_ptr + o_seq + td * U1 + i_u, mask=m_a, other=float("-inf"))
        tl.store(ob_ptr + i_r * NB + i, _occupation(b_a, b_arc, b_beta, b_ll, m_a), mask=m_r)
    for j in tl.static_range(NE):
        td = i_t + tl.load(ed_ptr + j)
        if EMIT_CAN_END:
            m_a = m_src & (i_u < U_b) & (td <= T_b)
        else:
            m_a = m_src & (i_u < U_b) & (td < T_b)
        b_arc = tl.load(ae_ptr + i_b * s_ae_b + i_t * s_ae_t + i_u * s_ae_u + j * s_ae_d,
                        mask=m_a, other=float("-inf")).to(ACC)
        b_beta = tl.load(beta_ptr + o_seq + td * U1 + i_u + 1, mask=m_a, other=float("-inf"))
        tl.store(oe_ptr + i_r * NE + j, _occupation(b_a, b_arc, b_beta, b_ll, m_a), mask=m_r)


# --------------------------------------------------------------------------- launchers
_DURATIONS: dict[tuple[tuple[int, ...], torch.device], torch.Tensor] = {}


def _durations(durations: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The durations as an int64 device tensor, cached (no host-to-device copy per call)."""
    key = (tuple(int(d) for d in durations), device)
    t = _DURATIONS.get(key)
    if t is None:
        t = torch.tensor(key[0] or (0,), dtype=torch.int64, device=device)
        _DURATIONS[key] = t
    return t


def _device_guard(x: torch.Tensor):
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _row_blocks(V: int) -> tuple[int, int]:
    block_v = min(triton.next_power_of_2(max(V, 1)), 1024)
    return max(1, min(64, 4096 // block_v)), block_v


def _launch_alpha_beta(arc_blank, arc_emit, il, tlen, off, soff, alpha, beta, ll, T, U1,
                       max_u1, blank_durations, emit_durations, do_beta, emit_can_end,
                       packed):
    device = arc_blank.device
    block_u = max(16, triton.next_power_of_2(max_u1))
    # A zero-size arc axis has no usable strides; nothing is loaded from it.
    ae = arc_emit if arc_emit.numel() else arc_blank
    if packed:
        s_ab = (arc_blank.stride(0), 0, arc_blank.stride(0), arc_blank.stride(1))
        s_ae = (ae.stride(0), 0, ae.stride(0), ae.stride(1))
    else:
        s_ab, s_ae = arc_blank.stride(), ae.stride()
    transducer_alpha_beta_kernel[(il.shape[0], 2 if do_beta else 1)](
        arc_blank, ae, _durations(blank_durations, device), _durations(emit_durations, device),
        il, tlen, off, soff, alpha, beta, ll, T, U1, *s_ab, *s_ae,
        NB=len(blank_durations), NE=len(emit_durations), EMIT_CAN_END=bool(emit_can_end),
        PACKED=packed, BLOCK_U=block_u,
        num_warps=_state_warps(block_u),
    )


def transducer_alpha_beta(
    arc_blank: torch.Tensor,
    arc_emit: torch.Tensor,
    il: torch.Tensor,
    tlen: torch.Tensor,
    blank_durations: tuple[int, ...],
    emit_durations: tuple[int, ...],
    do_beta: bool,
    emit_can_end: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch ``transducer_alpha_beta_kernel``: ``(ll (B,), alpha, beta)``.

    ``beta`` is ``alpha`` itself when not ``do_beta``.

    ``il``, ``tlen``: int64 on the arcs' device; ``T >= 1``, ``B >= 1``.
    """
    B, T, U1, _ = arc_blank.shape
    device = arc_blank.device
    alpha = torch.empty((B, T + 1, U1), dtype=torch.float64, device=device)
    beta = torch.empty((B, T + 1, U1), dtype=torch.float64, device=device) if do_beta else alpha
    ll = torch.empty((B,), dtype=torch.float64, device=device)
    _launch_alpha_beta(arc_blank, arc_emit, il, tlen, il, il, alpha, beta, ll, T, U1, U1,
                       blank_durations, emit_durations, do_beta, emit_can_end, False)
    return ll, alpha, beta


def transducer_alpha_beta_packed(
    arc_blank: torch.Tensor,
    arc_emit: torch.Tensor,
    il: torch.Tensor,
    tlen: torch.Tensor,
    row_offsets: torch.Tensor,
    state_offsets: torch.Tensor,
    num_states: int,
    max_u1: int,
    blank_durations: tuple[int, ...],
    emit_durations: tuple[int, ...],
    do_beta: bool,
    emit_can_end: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``transducer_alpha_beta`` on packed arcs ``(N, NB)``, ``(N, NE)``: no host sync.

    Sequence ``b``'s arcs at rows ``row_offsets[b] + t (U_b+1) + u``; its alpha and beta
    (flat, ``(num_states,)``) at ``state_offsets[b] + t (U_b+1) + u``, ``t <= T_b``.
    ``num_states`` and ``max_u1 >= U_b + 1`` (every ``b`` with ``T_b >= 1``) are host
    bounds from shapes only; ``B >= 1``.
    """
    device = arc_blank.device
    alpha = torch.empty((num_states,), dtype=torch.float64, device=device)
    beta = torch.empty((num_states,), dtype=torch.float64, device=device) if do_beta else alpha
    ll = torch.empty((il.shape[0],), dtype=torch.float64, device=device)
    _launch_alpha_beta(arc_blank, arc_emit, il, tlen, row_offsets, state_offsets, alpha, beta, ll,
                       0, 0, max_u1, blank_durations, emit_durations, do_beta, emit_can_end, True)
    return ll, alpha, beta


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
    """See ``seqloss.transducer.lattice.reference.transducer_lattice``."""
    B, T, U1, _ = arc_blank.shape
    dt = arc_blank.dtype
    device = arc_blank.device
    if B == 0 or T == 0:
        ll = torch.full((B,), NEG_INF, dtype=dt, device=device)
        if not compute_occupations:
            return ll, arc_blank.new_empty(0), arc_emit.new_empty(0)
        return ll, torch.zeros_like(arc_blank), torch.zeros_like(arc_emit)
    il = logit_lengths.to(device=device, dtype=torch.int64).contiguous()
    tlen = target_lengths.to(device=device, dtype=torch.int64).contiguous()
    with _device_guard(arc_blank):
        ll, alpha, beta = transducer_alpha_beta(arc_blank, arc_emit, il, tlen, blank_durations,
                                                emit_durations, compute_occupations, emit_can_end)
        if not compute_occupations:
            return ll.to(dt), arc_blank.new_empty(0), arc_emit.new_empty(0)
        occ_b = torch.empty(arc_blank.shape, dtype=dt, device=device)
        occ_e = torch.empty(arc_emit.shape, dtype=dt, device=device)
        ae = arc_emit if arc_emit.numel() else arc_blank
        block_r = 256
        transducer_occupation_kernel[(triton.cdiv(B * T * U1, block_r),)](
            arc_blank, ae, _durations(blank_durations, device), _durations(emit_durations, device),
            il, tlen, alpha, beta, ll, occ_b, occ_e, B, T, U1, *arc_blank.stride(), *ae.stride(),
            NB=len(blank_durations), NE=len(emit_durations), EMIT_CAN_END=bool(emit_can_end),
            BLOCK_R=block_r,
        )
    return ll.to(dt), occ_b, occ_e


