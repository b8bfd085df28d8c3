r"""Transducer lattice and RNN-T loss with Triton: CUDA, or CPU under ``TRITON_INTERPRET=1``.

Implements the kernel interface documented in ``seqloss.reference.transducer``
(``transducer_lattice`` and ``rnnt_loss_forward``, same signatures and semantics).

Launches, in stream order (each phase is its own launch, so no program ever
reads what another program of the same launch writes):

``transducer_lattice``
    1. ``transducer_alpha_beta_kernel``, grid ``(B, 2)``: program ``(b, 0)`` runs the
       forward recursion of sequence ``b`` and program ``(b, 1)`` the backward one,
       concurrently (they share nothing); each walks the anti-diagonals
       ``n = t + u`` with the diagonal's states in the lanes and stores them to its
       own ``(T+1, U+1)`` scratch. Grid ``(B, 1)`` (alpha only) without occupations.
    2. ``transducer_occupation_kernel``: one program per block of states
       ``(b, t, u)``, ``occ = exp(alpha + arc + beta(destination) - log p)``.

``rnnt_loss_forward`` (prologue, core, epilogue)
    1. ``rnnt_normalizer_kernel``: one program per block of rows ``(b, t, u)`` of
       the joint; one read of the logits: online log-sum-exp over blocks of ``V``
       (fused only), the blank and target scores gathered into the arc grids
       (as log-probabilities), and a per-row NaN/``+inf`` flag.
    2. ``transducer_alpha_beta_kernel`` as above, with RNN-T's arcs.
    3. ``rnnt_grad_kernel``: one program per block of rows, one more read of the
       logits and one write of the gradient: the two arc occupations of the row
       (from alpha, beta, the arcs and ``log p``), then
       ``softmax * (o_b + (1+λ) o_e) - o_b [blank] - (1+λ) o_e [target]``, clamp,
       ``grad_scale``, dtype cast; NaN on a poisoned sequence's rows, 0 on padding
       and infeasible sequences. Each element is written by exactly one program
       (no atomics: deterministic), after the same program (the same lane) read
       it, so the gradient may overwrite the logits (the in-place mode).

No logits-sized temporary: the log-softmax is never materialized (the
normalizers are ``(B, T, U+1)``), and the gradient is the only logits-sized
output (none with ``grad_buffer=logits``).

Accumulation: ``transducer_lattice`` in the arcs' dtype; ``rnnt_loss_forward`` runs
its logits-sized passes in float32 (float64 for float64 input) and its lattice in
float64 (see there). Half inputs are cast at load (the interpreter keeps bfloat16
as raw integers and cannot compute on it).
"""
# No ``from __future__ import annotations``: the interpreter of triton < 3.2 takes a
# parameter for ``tl.constexpr`` only when its annotation is the object itself.
import torch
import triton
import triton.language as tl

from ..._core import triton_compat  # noqa: F401  (the interpreter fixes, before any launch)
from ..lattice.triton_cuda import (
    _device_guard,
    _occupation,
    _round_bf16,
    _row_offset,
    transducer_alpha_beta,
)

NAN = float("nan")


# --------------------------------------------------------------------------- RNN-T
@triton.jit
def rnnt_normalizer_kernel(
    x_ptr, tg_ptr, il_ptr, tl_ptr, off_ptr, ab_ptr, ae_ptr, nz_ptr, bad_ptr,
    B, T, U1, V,
    sx_b, sx_t, sx_u, sx_v, s_tg_b, s_tg_u,
    blank,
    PACKED: tl.constexpr, FUSED: tl.constexpr, FP64: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """The RNN-T prologue for a block of ``BLOCK_R`` rows ``r = (b * T + t) * (U+1) + u``.

    One read of the rows that sequence ``b`` reads (``t < T_b``, ``u <= U_b``):
    the normalizer ``log_z = m + log(s)``, ``m = max_v x[v]``, ``s = sum_v exp(x[v] - m)``,
    online over blocks of ``BLOCK_V`` classes (fused only), the arc scores
    ``(x[blank] - m) - log(s)`` and ``(x[y_{u+1}] - m) - log(s)`` (``u < U_b``; not
    fused: ``x[blank]``, ``x[y_{u+1}]``), and whether the row holds a NaN or ``+inf``.
    ``m`` and ``log(s)`` are kept apart, never summed, and the arc scores are formed
    in the lattice's dtype (float64): with logits of ``1e4`` a float32 ``m + log(s)``
    would round away the last digits of every log-probability. A poisoned
    row's values are replaced by ``-inf`` (its sequence's results are NaN anyway),
    so nothing downstream computes on them. A row of ``-inf`` logits (``s = 0``) has
    no arc out of it.

    Updates:
        arc_blank (B, T, U+1): read rows.
        norm (B, T, U+1, 2): ``(m, log s)`` of read rows (``m = 0`` for a row of ``-inf``).
        arc_emit (B, T, U+1): read rows with ``u < U_b``.
        bad (B, T, U+1) int8: every row (0 off the read region).
    """
    ACC = tl.float64 if FP64 else tl.float32
    LAT = ab_ptr.dtype.element_ty  # the lattice's dtype (float64)
    i_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    m_r = i_r < B * T * U1
    i_b = i_r // (T * U1)
    i_t = (i_r // U1) % T
    i_u = i_r % U1
    T_b = tl.load(il_ptr + i_b, mask=m_r, other=0)
    U_b = tl.load(tl_ptr + i_b, mask=m_r, other=0)
    m_row = m_r & (i_t < T_b) & (i_u <= U_b)
    p_x = x_ptr + _row_offset(i_b, i_t, i_u, U_b, off_ptr, m_row, sx_b, sx_t, sx_u, PACKED)

    b_m = tl.full([BLOCK_R], float("-inf"), ACC)
    b_s = tl.zeros([BLOCK_R], ACC)
    b_bad = tl.zeros([BLOCK_R], tl.int32)
    # Blocks with no read row (padding, or the packed grid's holes) skip the loop.
    n_v = tl.where(tl.max(m_row.to(tl.int32), axis=0) > 0, V, 0)
    for v0 in range(0, n_v, BLOCK_V):
        o_v = v0 + tl.arange(0, BLOCK_V)
        m_x = m_row[:, None] & (o_v < V)[None, :]
        b_x = tl.load(p_x[:, None] + o_v[None, :] * sx_v, mask=m_x, other=float("-inf")).to(ACC)
        is_bad = (b_x != b_x) | (b_x == float("inf"))
        b_bad = tl.maximum(b_bad, tl.max(is_bad.to(tl.int32), axis=1))
        if FUSED:
            b_x = tl.where(is_bad, float("-inf"), b_x)
            b_new = tl.maximum(b_m, tl.max(b_x, axis=1))
            shift = tl.where(b_new == float("-inf"), 0.0, b_new)
            b_s = b_s * tl.exp(b_m - shift) + tl.sum(tl.exp(b_x - shift[:, None]), axis=1)
            b_m = b_new
    m_bad = b_bad > 0

    m_e = m_row & (i_u < U_b)
    b_y = tl.load(tg_ptr + i_b * s_tg_b + i_u * s_tg_u, mask=m_e, other=0)
    b_xb = tl.load(p_x + blank * sx_v, mask=m_row, other=float("-inf")).to(LAT)
    b_xe = tl.load(p_x + b_y * sx_v, mask=m_e, other=float("-inf")).to(LAT)
    if FUSED:
        none = b_m == float("-inf")
        b_m = tl.where(none | m_bad, 0.0, b_m)
        b_ls = tl.where(none, float("-inf"), tl.log(tl.where(none, 1.0, b_s)))
        b_ls = tl.where(m_bad, 0.0, b_ls)
        b_ml = b_m.to(LAT)
        b_lsl = tl.where(none, 0.0, b_ls).to(LAT)
        b_xb = tl.where(none, float("-inf"), (b_xb - b_ml) - b_lsl)
        b_xe = tl.where(none, float("-inf"), (b_xe - b_ml) - b_lsl)
        tl.store(nz_ptr + 2 * i_r, b_m, mask=m_row)
        tl.store(nz_ptr + 2 * i_r + 1, b_ls, mask=m_row)
    b_xb = tl.where(m_bad, float("-inf"), b_xb)
    b_xe = tl.where(m_bad, float("-inf"), b_xe)
    tl.store(ab_ptr + i_r, b_xb, mask=m_row)
    tl.store(ae_ptr + i_r, b_xe, mask=m_e)
    tl.store(bad_ptr + i_r, b_bad.to(tl.int8), mask=m_r)


@triton.jit
def rnnt_grad_kernel(
    x_ptr, g_ptr, tg_ptr, il_ptr, tl_ptr, off_ptr, ab_ptr, ae_ptr, nz_ptr,
    alpha_ptr, beta_ptr, ll_ptr, bad_ptr, par_ptr,
    B, T, U1, V,
    sx_b, sx_t, sx_u, sx_v, sg_b, sg_t, sg_u, sg_v, s_tg_b, s_tg_u,
    blank,
    PACKED: tl.constexpr, FUSED: tl.constexpr, HAS_CLAMP: tl.constexpr, FP64: tl.constexpr,
    BF16_OUT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """The RNN-T epilogue for a block of ``BLOCK_R`` rows ``r = (b * T + t) * (U+1) + u``.

    The row's arc occupations (blank ``(t, u) -> (t+1, u)``, emission
    ``(t, u) -> (t, u+1)``)::

        o_b = exp(alpha(t, u) + arc_blank[t, u] + beta(t+1, u) - log p)
        o_e = (1 + λ) exp(alpha(t, u) + arc_emit[t, u] + beta(t, u+1) - log p)   (u < U_b)

    then, over blocks of ``BLOCK_V`` classes, the gradient (fused: with respect to
    the logits; else to the log-probabilities)::

        g[v] = softmax(x)[v] (o_b + o_e) - o_b [v = blank] - o_e [v = y_{u+1}]   (fused)
        g[v] =                          - o_b [v = blank] - o_e [v = y_{u+1}]   (not fused)

    clamped to ``[-clamp, clamp]`` (``HAS_CLAMP``), times ``grad_scale``, rounded once
    to the gradient's dtype. Rows of a sequence with a NaN/``+inf`` logit: NaN; rows
    of an infeasible sequence and padding rows: 0. Each element is loaded and
    stored by the same lane of this program only, so ``g`` may alias ``x``.

    Updates:
        grad: padded: every row of the tensor; packed: every row of the grid's sequences.
    """
    ACC = tl.float64 if FP64 else tl.float32
    # Scalars in the accumulation dtype (a Python float argument would be float32).
    clamp = tl.load(par_ptr)
    emit_scale = tl.load(par_ptr + 1)
    grad_scale = tl.load(par_ptr + 2)
    i_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    m_r = i_r < B * T * U1
    i_b = i_r // (T * U1)
    i_t = (i_r // U1) % T
    i_u = i_r % U1
    T_b = tl.load(il_ptr + i_b, mask=m_r, other=0)
    U_b = tl.load(tl_ptr + i_b, mask=m_r, other=0)
    m_row = m_r & (i_t < T_b) & (i_u <= U_b)
    b_ll = tl.load(ll_ptr + i_b, mask=m_row, other=float("-inf"))
    b_bad = tl.load(bad_ptr + i_b, mask=m_row, other=0)
    m_nan = m_row & (b_bad != 0)
    # ``b_bad == 0``, not ``~(b_bad != 0)``: the interpreter of triton <= 3.3 has
    # no int1 type for ``~`` on a boolean block.
    m_occ = m_row & (b_bad == 0) & (b_ll != float("-inf"))
    m_e = m_occ & (i_u < U_b)

    o_st = i_b * (T + 1) * U1 + i_t * U1 + i_u
    b_a = tl.load(alpha_ptr + o_st, mask=m_occ, other=float("-inf"))
    b_ob = _occupation(b_a, tl.load(ab_ptr + i_r, mask=m_occ, other=float("-inf")),
                       tl.load(beta_ptr + o_st + U1, mask=m_occ, other=float("-inf")), b_ll, m_occ)
    b_oe = _occupation(b_a, tl.load(ae_ptr + i_r, mask=m_e, other=float("-inf")),
                       tl.load(beta_ptr + o_st + 1, mask=m_e, other=float("-inf")), b_ll, m_e)
    # Occupations are formed in the lattice's dtype, then rounded once.
    b_ob = b_ob.to(ACC)
    b_oe = b_oe.to(ACC) * emit_scale
    b_y = tl.load(tg_ptr + i_b * s_tg_b + i_u * s_tg_u, mask=m_e, other=-1)
    if FUSED:
        b_nm = tl.load(nz_ptr + 2 * i_r, mask=m_occ, other=0.0)
        b_ls = tl.load(nz_ptr + 2 * i_r + 1, mask=m_occ, other=0.0)
        m_lz = b_ls != float("-inf")  # a row of -inf logits: softmax 0 (and no arc)
        b_ls = tl.where(m_lz, b_ls, 0.0)
        b_w = b_ob + b_oe
    p_x = x_ptr + _row_offset(i_b, i_t, i_u, U_b, off_ptr, m_occ, sx_b, sx_t, sx_u, PACKED)
    p_g = g_ptr + _row_offset(i_b, i_t, i_u, U_b, off_ptr, m_row, sg_b, sg_t, sg_u, PACKED)
    # Padded: every row of the tensor is written (zeros on padding). Packed: the
    # grid's rows past a sequence's lengths are no rows of the tensor.
    if PACKED:
        m_st = m_row
    else:
        m_st = m_r
    n_v = tl.where(tl.max(m_st.to(tl.int32), axis=0) > 0, V, 0)
    for v0 in range(0, n_v, BLOCK_V):
        o_v = v0 + tl.arange(0, BLOCK_V)
        m_v = (o_v < V)[None, :]
        if FUSED:
            b_x = tl.load(p_x[:, None] + o_v[None, :] * sx_v, mask=m_occ[:, None] & m_v,
                          other=float("-inf")).to(ACC)
            b_p = tl.exp((b_x - b_nm[:, None]) - b_ls[:, None])  # softmax, as the arcs
            b_g = tl.where(m_lz[:, None], b_p, 0.0) * b_w[:, None]
        else:
            b_g = tl.zeros([BLOCK_R, BLOCK_V], ACC)
        b_g = b_g - tl.where(o_v[None, :] == blank, b_ob[:, None], 0.0)
        b_g = b_g - tl.where(o_v[None, :] == b_y[:, None], b_oe[:, None], 0.0)
        if HAS_CLAMP:
            b_g = tl.minimum(tl.maximum(b_g, -clamp), clamp)
        b_g = b_g * grad_scale
        b_g = tl.where(m_nan[:, None], float("nan"), tl.where(m_occ[:, None], b_g, 0.0))
        if BF16_OUT:
            b_g = _round_bf16(b_g)
        tl.store(p_g[:, None] + o_v[None, :] * sg_v, b_g, mask=m_st[:, None] & m_v)


def _row_blocks(V: int) -> tuple[int, int]:
    block_v = min(triton.next_power_of_2(max(V, 1)), 1024)
    return max(1, min(64, 4096 // block_v)), block_v


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
    device = logits.device
    fp64 = logits.dtype == torch.float64
    acc = torch.float64 if fp64 else torch.float32
    packed = logits.dim() == 2
    V = logits.shape[-1]
    il = logit_lengths.to(device=device, dtype=torch.int64).contiguous()
    tlen = target_lengths.to(device=device, dtype=torch.int64).contiguous()
    B = il.shape[0]
    # The lattice runs in float64 whatever the input (as the Numba backend's): a path
    # through arcs of -2e4 (logits of 1e4) has alpha, beta and log p near -2e4, where
    # float32's ulp (0.002) would be the occupations' relative error. The lattice is
    # O(B T U) work, latency-bound (one barrier per diagonal), so float64 costs little
    # there; the logits-sized passes stay in float32.
    lat = torch.float64
    if packed:
        # The packed layout needs its grid's extent on the host (validation synced already).
        T = int(il.max()) if B else 0
        U1 = int(tlen.max()) + 1 if B else 1
        rows = il * (tlen + 1)
        off = (torch.cumsum(rows, 0) - rows).contiguous()
        sx = (logits.stride(0), 0, 0, logits.stride(1))
    else:
        _, T, U1, _ = logits.shape
        off = il  # unused
        sx = logits.stride()
    grad = None
    if compute_grad:
        grad = grad_buffer if grad_buffer is not None else torch.empty_like(logits)
    if B == 0 or T == 0 or U1 == 0:
        # No frame anywhere: every sequence is infeasible and nothing is read.
        loss = torch.full((B,), float("inf"), dtype=acc, device=device)
        if grad is None:
            return loss, logits.new_empty(0)
        return loss, grad.zero_()

    tg = targets.to(device=device, dtype=torch.int64)
    if tg.shape[1] == 0:
        tg = torch.zeros((B, 1), dtype=torch.int64, device=device)  # never read
    block_r, block_v = _row_blocks(V)
    grid = (triton.cdiv(B * T * U1, block_r),)
    with _device_guard(logits):
        arc_blank = torch.empty((B, T, U1), dtype=lat, device=device)
        arc_emit = torch.empty((B, T, U1), dtype=lat, device=device)
        norm = torch.empty((B, T, U1, 2), dtype=acc, device=device) if fused_log_softmax else arc_blank
        row_bad = torch.empty((B, T, U1), dtype=torch.int8, device=device)
        rnnt_normalizer_kernel[grid](
            logits, tg, il, tlen, off, arc_blank, arc_emit, norm, row_bad,
            B, T, U1, V, *sx, *tg.stride(), blank,
            PACKED=packed, FUSED=fused_log_softmax, FP64=fp64, BLOCK_R=block_r, BLOCK_V=block_v,
        )
        ll, alpha, beta = transducer_alpha_beta(arc_blank[..., None], arc_emit[..., None], il, tlen,
                                                (1,), (0,), compute_grad)
        bad = row_bad.view(B, -1).amax(1) > 0
        scale = 1.0 + fastemit_lambda
        loss = torch.where(bad, NAN, -ll * scale).to(acc)
        if grad is None:
            return loss, logits.new_empty(0)

        sg = (grad.stride(0), 0, 0, grad.stride(1)) if packed else grad.stride()
        # Device-side fills (no host-to-device copy, no sync).
        par = torch.full((3,), float(clamp), dtype=acc, device=device)
        par[1] = scale
        par[2] = float(grad_scale)
        rnnt_grad_kernel[grid](
            logits, grad, tg, il, tlen, off, arc_blank, arc_emit, norm, alpha, beta, ll,
            bad.to(torch.int8), par, B, T, U1, V, *sx, *sg, *tg.stride(), blank,
            PACKED=packed, FUSED=fused_log_softmax, HAS_CLAMP=clamp > 0, FP64=fp64,
            BF16_OUT=grad.dtype == torch.bfloat16, BLOCK_R=block_r, BLOCK_V=block_v,
        )
    if grad_buffer is not None:
        # The kernel wrote through a raw pointer: tell autograd that the buffer (maybe
        # the logits themselves) changed, so a node that saved it refuses to backward.
        torch.autograd.graph.increment_version(grad_buffer)
    return loss, grad


def joint_loss_forward(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    table,
    fused_log_softmax: bool,
    compute_grad: bool,
    grad_buffer: torch.Tensor | None = None,
    grad_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """See ``seqloss.transducer.joint.reference.joint_loss_forward``."""
    if not table.is_rnnt or table.sigma:
        raise NotImplementedError("the Triton joint takes RNN-T tables only, for now")
    return rnnt_loss_forward(
        logits, targets, logit_lengths, target_lengths, table.blank_arcs[0].token, table.clamp,
        fused_log_softmax, table.fastemit_lambda, compute_grad, grad_buffer, grad_scale,
    )
