r"""The lattice's max-plus semiring (Viterbi) with Triton: CUDA, or CPU under TRITON_INTERPRET=1.

Implements ``transducer_viterbi`` of ``seqloss.transducer.lattice.reference`` (same
signature, semantics and bits: one float64 addition per arc, exact maxima, the same
tie-break). Two launches, one program per sequence each:

1. ``viterbi_forward_kernel`` walks the anti-diagonals ``n = t + u`` as the log
   semiring's alpha pass does (``triton_cuda._alpha_pass``: lane ``u`` holds state
   ``(n - u, u)``, each diagonal stored to the program's own ``(T+1, U+1)`` scratch
   and followed by ``tl.debug_barrier()``; the race-freedom argument is that kernel's),
   keeping the maximum and the arc that gives it (the back-pointer);
2. ``viterbi_backtrack_kernel`` follows the back-pointers from ``(T_b, U_b)``, a scalar
   loop of at most ``T_b + U_b`` steps.
"""

# No ``from __future__ import annotations``: the interpreter of triton < 3.2 takes a
# parameter for ``tl.constexpr`` only when its annotation is the object itself.
import contextlib

import torch
import triton
import triton.language as tl

from ..._core.triton_compat import state_warps as _state_warps  # also: the interpreter fixes
from .reference import viterbi_order

__all__ = ["transducer_viterbi"]

NEG_INF = float("-inf")


@triton.jit
def viterbi_forward_kernel(
    ab_ptr, ae_ptr, bd_ptr, ed_ptr, rb_ptr, re_ptr, il_ptr, tl_ptr, delta_ptr, bp_ptr, score_ptr,
    T, U1,
    s_ab_b, s_ab_t, s_ab_u, s_ab_d, s_ae_b, s_ae_t, s_ae_u, s_ae_d,
    NB: tl.constexpr, NE: tl.constexpr, EMIT_CAN_END: tl.constexpr, BLOCK_U: tl.constexpr,
):
    """Program ``b``: ``delta(t, u) = max(delta(source) + arc)`` over sequence ``b``'s states.

    The candidates are visited blank-like arcs first, then emissions; ``rb``/``re`` hold
    each arc's rank in ``reference.viterbi_order``, and a candidate takes over when
    strictly greater, or equal (and finite) with a smaller rank: the maximum with the
    first-ranked arc among those that reach it, as the reference's ordered strict
    comparison gives.

    Updates:
        delta (B, T+1, U+1) float64, bp (B, T+1, U+1) int32 (the arc's code: ``i`` for
        blank-like arc ``i``, ``NB + j`` for emission ``j``, -1 for none): the states
        ``t <= T_b``, ``u <= U_b``.
        score (B,): ``delta(T_b, U_b)``, ``-inf`` when ``T_b = 0``.
    """
    ACC = tl.float64
    i_b = tl.program_id(0).to(tl.int64)
    T_b = tl.load(il_ptr + i_b)
    U_b = tl.load(tl_ptr + i_b)
    o_u = tl.arange(0, BLOCK_U)
    o_u64 = o_u.to(tl.int64)  # for the strides: a non-contiguous arc tensor's may be large
    p_ab = ab_ptr + i_b * s_ab_b + o_u64 * s_ab_u
    p_ae = ae_ptr + i_b * s_ae_b + o_u64 * s_ae_u
    o_seq = i_b * (T + 1) * U1
    p_d = delta_ptr + o_seq
    p_bp = bp_ptr + o_seq
    tl.store(p_d + o_u, tl.zeros([BLOCK_U], ACC), mask=o_u == 0)
    tl.store(p_bp + o_u, tl.full([BLOCK_U], -1, tl.int32), mask=o_u == 0)
    tl.debug_barrier()
    for n in range(1, T_b + U_b + 1):
        t = n - o_u
        m_st = (o_u <= U_b) & (t >= 0) & (t <= T_b)
        b_best = tl.full([BLOCK_U], float("-inf"), ACC)
        b_arg = tl.full([BLOCK_U], -1, tl.int32)
        b_rank = tl.full([BLOCK_U], NB + NE, tl.int32)
        for i in tl.static_range(NB):
            ts = t - tl.load(bd_ptr + i)
            m_a = m_st & (ts >= 0)
            b_s = tl.load(p_d + ts * U1 + o_u, mask=m_a, other=float("-inf"))
            b_x = tl.load(p_ab + ts * s_ab_t + i * s_ab_d, mask=m_a, other=float("-inf")).to(ACC)
            b_v = b_s + b_x
            r = tl.load(rb_ptr + i).to(tl.int32)
            take = m_a & ((b_v > b_best) | ((b_v == b_best) & (b_v > float("-inf"))
                                            & (r < b_rank)))
            b_best = tl.where(take, b_v, b_best)
            b_arg = tl.where(take, i, b_arg)
            b_rank = tl.where(take, r, b_rank)
        for j in tl.static_range(NE):
            ts = t - tl.load(ed_ptr + j)
            if EMIT_CAN_END:
                m_a = m_st & (ts < T_b) & (o_u >= 1) & (ts >= 0)
            else:
                m_a = m_st & (t < T_b) & (o_u >= 1) & (ts >= 0)
            b_s = tl.load(p_d + ts * U1 + o_u - 1, mask=m_a, other=float("-inf"))
            b_x = tl.load(p_ae + ts * s_ae_t - s_ae_u + j * s_ae_d, mask=m_a,
                          other=float("-inf")).to(ACC)
            b_v = b_s + b_x
            r = tl.load(re_ptr + j).to(tl.int32)
            take = m_a & ((b_v > b_best) | ((b_v == b_best) & (b_v > float("-inf"))
                                            & (r < b_rank)))
            b_best = tl.where(take, b_v, b_best)
            b_arg = tl.where(take, NB + j, b_arg)
            b_rank = tl.where(take, r, b_rank)
        tl.store(p_d + t * U1 + o_u, b_best, mask=m_st)
        tl.store(p_bp + t * U1 + o_u, b_arg, mask=m_st)
        tl.debug_barrier()
    b_sc = tl.load(p_d + T_b * U1 + U_b)
    tl.store(score_ptr + i_b, tl.where(T_b > 0, b_sc, float("-inf")))


@triton.jit
def viterbi_backtrack_kernel(
    bd_ptr, ed_ptr, il_ptr, tl_ptr, bp_ptr, score_ptr, frames_ptr, arcs_ptr,
    T, U1, U,
    NB: tl.constexpr,
):
    """Program ``b``: walk the back-pointers from ``(T_b, U_b)`` to ``(0, 0)``.

    Updates:
        frames (B, U), arcs (B, U): each token's source frame and emission arc (found
        paths only; the rest keep their -1).
    """
    i_b = tl.program_id(0).to(tl.int64)
    T_b = tl.load(il_ptr + i_b)
    U_b = tl.load(tl_ptr + i_b)
    found = tl.load(score_ptr + i_b) > float("-inf")
    p_bp = bp_ptr + i_b * (T + 1) * U1
    t = T_b
    u = U_b
    # Stores go through a two-lane block whose second lane is always masked off:
    # triton <= 3.2 tests a mask with ``if not mask`` and so, under the interpreter,
    # stores unmasked whenever a scalar (or one-lane) mask is False.
    o_2 = tl.arange(0, 2)
    for _ in range(0, T_b + U_b):
        code = tl.load(p_bp + t * U1 + u, mask=found & ((t > 0) | (u > 0)), other=-1)
        live = code >= 0
        emit = live & (code >= NB)
        j = tl.where(emit, code - NB, 0)
        i = tl.where(live & (code < NB), code, 0)
        d_e = tl.load(ed_ptr + j)
        d_b = tl.load(bd_ptr + i)
        t = tl.where(emit, t - d_e, tl.where(live, t - d_b, t))
        u = tl.where(emit, u - 1, u)
        m = o_2 < tl.where(emit, 1, 0)
        tl.store(frames_ptr + i_b * U + u + o_2, t + o_2 * 0, mask=m)
        tl.store(arcs_ptr + i_b * U + u + o_2, (j + o_2 * 0).to(tl.int64), mask=m)


_SMALL: dict[tuple[tuple[int, ...], torch.device], torch.Tensor] = {}


def _ints(vals: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """A few ints as an int64 device tensor, cached (no host-to-device copy per call)."""
    key = (tuple(int(v) for v in vals), device)
    t = _SMALL.get(key)
    if t is None:
        t = _SMALL[key] = torch.tensor(key[0] or (0,), dtype=torch.int64, device=device)
    return t


def _device_guard(x: torch.Tensor):
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


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
    U = U1 - 1
    device = arc_blank.device
    score = torch.full((B,), NEG_INF, dtype=torch.float64, device=device)
    frames = torch.full((B, U), -1, dtype=torch.int64, device=device)
    arcs = torch.full((B, U), -1, dtype=torch.int64, device=device)
    if T == 0 or B == 0:
        return score, frames, arcs
    Db = len(blank_durations)
    rank = {(e, k): r for r, (e, k, _) in enumerate(viterbi_order(blank_durations,
                                                                  emit_durations))}
    rb = _ints(tuple(rank[(0, i)] for i in range(Db)), device)
    re = _ints(tuple(rank[(1, j)] for j in range(len(emit_durations))), device)
    bd, ed = _ints(blank_durations, device), _ints(emit_durations, device)
    il = logit_lengths.to(device=device, dtype=torch.int64).contiguous()
    tlen = target_lengths.to(device=device, dtype=torch.int64).contiguous()
    delta = torch.empty((B, T + 1, U1), dtype=torch.float64, device=device)
    bp = torch.empty((B, T + 1, U1), dtype=torch.int32, device=device)
    # A zero-size arc axis has no usable strides; nothing is loaded from it.
    ae = arc_emit if arc_emit.numel() else arc_blank
    block_u = max(16, triton.next_power_of_2(U1))
    with _device_guard(arc_blank):
        viterbi_forward_kernel[(B,)](
            arc_blank, ae, bd, ed, rb, re, il, tlen, delta, bp, score, T, U1,
            *arc_blank.stride(), *ae.stride(),
            NB=Db, NE=len(emit_durations), EMIT_CAN_END=bool(emit_can_end), BLOCK_U=block_u,
            num_warps=_state_warps(block_u),
        )
        viterbi_backtrack_kernel[(B,)](
            bd, ed, il, tlen, bp, score, frames, arcs, T, U1, max(U, 1), NB=Db, num_warps=1,
        )
    return score, frames, arcs
