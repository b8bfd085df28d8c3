r"""The lattice's max-plus semiring (Viterbi) with Triton: CUDA, or CPU under TRITON_INTERPRET=1.

Implements ``transducer_viterbi`` of ``seqloss.transducer.lattice.reference`` (same
signature, semantics and bits: one float64 addition per arc, exact maxima, the same
tie-break). Two launches, one program per sequence each:

1. the lattice's own ``triton_cuda.transducer_alpha_beta_kernel`` with ``MAXPLUS``: its
   alpha pass with ``max`` for the log-sum-exp fills ``delta``, the best score of every
   state, and the score;
2. ``viterbi_backtrack_kernel`` walks from ``(T_b, U_b)``, a scalar loop of at most
   ``T_b + U_b`` steps, recomputing each state's candidates (no back-pointers stored).
"""

# No ``from __future__ import annotations``: the interpreter of triton < 3.2 takes a
# parameter for ``tl.constexpr`` only when its annotation is the object itself.
import contextlib

import torch
import triton
import triton.language as tl

from ..._core.triton_compat import state_warps as _state_warps  # also: the interpreter fixes
from .reference import viterbi_order
from .triton_cuda import transducer_alpha_beta_kernel

__all__ = ["transducer_viterbi"]

NEG_INF = float("-inf")


@triton.jit
def viterbi_backtrack_kernel(
    ab_ptr, ae_ptr, bd_ptr, ed_ptr, rb_ptr, re_ptr, il_ptr, tl_ptr, delta_ptr, score_ptr,
    frames_ptr, arcs_ptr,
    T, U1, U,
    s_ab_b, s_ab_t, s_ab_u, s_ab_d, s_ae_b, s_ae_t, s_ae_u, s_ae_d,
    NB: tl.constexpr, NE: tl.constexpr, EMIT_CAN_END: tl.constexpr,
):
    """Program ``b``: the best path from ``(T_b, U_b)`` back to ``(0, 0)``.

    At each state the candidates ``delta(source) + arc`` are recomputed: the one that
    equals ``delta`` of the state and comes first in ``reference.viterbi_order``
    (``rb``/``re``: each arc's rank) is the back-pointer the reference stores. The
    sums are the very ones the max-plus pass maxed over (its -inf guard changes a sum
    only where a side is -inf, never on a path scoring above -inf), so the equality
    is exact.

    Updates:
        frames (B, U), arcs (B, U): each token's source frame and emission arc (found
        paths only; the rest keep their -1).
    """
    ACC = tl.float64
    i_b = tl.program_id(0).to(tl.int64)
    T_b = tl.load(il_ptr + i_b)
    U_b = tl.load(tl_ptr + i_b)
    found = tl.load(score_ptr + i_b) > float("-inf")
    p_d = delta_ptr + i_b * (T + 1) * U1
    p_ab = ab_ptr + i_b * s_ab_b
    p_ae = ae_ptr + i_b * s_ae_b
    t = T_b
    u = U_b
    # Stores go through a two-lane block whose second lane is always masked off:
    # triton <= 3.2 tests a mask with ``if not mask`` and so, under the interpreter,
    # stores unmasked whenever a scalar (or one-lane) mask is False.
    o_2 = tl.arange(0, 2)
    for _ in range(0, T_b + U_b):
        go = found & ((t > 0) | (u > 0))
        best = tl.load(p_d + t * U1 + u, mask=go, other=float("-inf"))
        b_rank = NB + NE
        b_code = -1
        b_ts = t
        for i in tl.static_range(NB):
            ts = t - tl.load(bd_ptr + i)
            m_a = go & (ts >= 0)
            v = (tl.load(p_d + ts * U1 + u, mask=m_a, other=float("-inf"))
                 + tl.load(p_ab + ts * s_ab_t + u * s_ab_u + i * s_ab_d, mask=m_a,
                           other=float("-inf")).to(ACC))
            r = tl.load(rb_ptr + i).to(tl.int32)
            take = m_a & (v == best) & (r < b_rank)
            b_rank = tl.where(take, r, b_rank)
            b_code = tl.where(take, i, b_code)
            b_ts = tl.where(take, ts, b_ts)
        for j in tl.static_range(NE):
            ts = t - tl.load(ed_ptr + j)
            if EMIT_CAN_END:
                m_a = go & (ts < T_b) & (u >= 1) & (ts >= 0)
            else:
                m_a = go & (t < T_b) & (u >= 1) & (ts >= 0)
            v = (tl.load(p_d + ts * U1 + u - 1, mask=m_a, other=float("-inf"))
                 + tl.load(p_ae + ts * s_ae_t + (u - 1) * s_ae_u + j * s_ae_d, mask=m_a,
                           other=float("-inf")).to(ACC))
            r = tl.load(re_ptr + j).to(tl.int32)
            take = m_a & (v == best) & (r < b_rank)
            b_rank = tl.where(take, r, b_rank)
            b_code = tl.where(take, NB + j, b_code)
            b_ts = tl.where(take, ts, b_ts)
        # The source frame is the winner's own (no further load on the step's chain);
        # with no winner (the start, or no path) nothing moves.
        emit = b_code >= NB
        k_e = tl.where(emit, b_code - NB, 0)
        t = b_ts
        u = tl.where(emit, u - 1, u)
        m = o_2 < tl.where(emit, 1, 0)
        tl.store(frames_ptr + i_b * U + u + o_2, t + o_2 * 0, mask=m)
        tl.store(arcs_ptr + i_b * U + u + o_2, (k_e + o_2 * 0).to(tl.int64), mask=m)


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
    # A zero-size arc axis has no usable strides; nothing is loaded from it.
    ae = arc_emit if arc_emit.numel() else arc_blank
    block_u = max(16, triton.next_power_of_2(U1))
    nb, ne, ce = Db, len(emit_durations), bool(emit_can_end)
    with _device_guard(arc_blank):
        transducer_alpha_beta_kernel[(B, 1)](
            arc_blank, ae, bd, ed, il, tlen, il, il, delta, delta, score, T, U1,
            *arc_blank.stride(), *ae.stride(),
            NB=nb, NE=ne, EMIT_CAN_END=ce, PACKED=False, BLOCK_U=block_u, MAXPLUS=True,
            num_warps=_state_warps(block_u),
        )
        viterbi_backtrack_kernel[(B,)](
            arc_blank, ae, bd, ed, rb, re, il, tlen, delta, score, frames, arcs, T, U1, max(U, 1),
            *arc_blank.stride(), *ae.stride(), NB=nb, NE=ne, EMIT_CAN_END=ce, num_warps=1,
        )
    return score, frames, arcs
