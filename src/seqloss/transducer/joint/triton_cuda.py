r"""The table-driven joint with Triton: CUDA, or CPU under ``TRITON_INTERPRET=1``.

Implements ``joint_loss_forward`` of ``seqloss.transducer.joint.reference`` (same
signature and semantics) for any ``JointTable`` (``table.py``): RNN-T, multi-blank,
TDT, with ``sigma``, ``clamp``, FastEmit and ``emit_can_end``. One normalizer kernel
and one gradient kernel read the table, passed as a small int64 tensor (each blank
arc's token class and duration logit, each emission's duration logit; ``-1``: no
duration term) beside the lattice's duration tensors, with the arc counts ``NB``,
``NE`` and the presence of a duration block as ``tl.constexpr``: RNN-T's table (one
blank arc, one emission arc, no duration block) compiles to the same work as a
dedicated RNN-T kernel.

Launches, in stream order. Each phase is its own launch and no program reads what
another program of the same launch writes, so no race exists by construction (the
interpreter, which runs programs one after another, could not reveal one):

1. ``joint_normalizer_kernel``: one program per block of rows ``(b, t, u)`` of the
   joint (padded: of the ``(B, T, U+1)`` grid; packed: of the ``N`` rows themselves,
   each row's sequence from a device-side map, so that no extent of the batch is
   read on the host: ``validate=False`` does no device-to-host sync). It reads only
   its own rows of the logits and writes only its own rows of
   the arc grids, the normalizers and the NaN flags: the token block's online
   log-sum-exp, kept as the split ``(m, log s)`` (fused only), the duration block's
   log-softmax (float64, small), each arc's score, and a per-row NaN/``+inf`` flag
   over every class.
2. ``transducer_alpha_beta_kernel`` (``..lattice.triton_cuda``), grid ``(B, 2)``, in
   float64 on the arc grids of launch 1 (packed: on the packed rows, with alpha and
   beta in per-sequence blocks); its race-freedom is argued there.
3. ``joint_grad_kernel``: one program per block of rows; it reads alpha, beta,
   ``log p`` and the arc grids (written by launches 1 and 2, never by this one) and
   the logits of its own rows, and writes the gradient of its own rows only. Within a
   program, each gradient element of the token block is a function of that element's
   logit, loaded by the same lane just before the store (the row's normalizer comes
   from launch 1); the duration block, whose softmax reduces along the row, is loaded
   whole, then a barrier, then stored. So no logit is read after its gradient was
   written, and the gradient may overwrite the logits (``grad_buffer=logits``, the
   in-place mode). Nothing is accumulated across programs (no atomics): the result
   is deterministic.

The losses from the joint (``from_joint.py``) take the epilogue alone, per tile of
recomputed logits whose occupations are known: ``joint_tile_grad_kernel``, one program
per block of the tile's rows, each writing only its own rows (barriers between its
loads and its stores, so over the logits too).

No logits-sized temporary: the log-softmax is never materialized (the normalizers
are ``(B, T, U+1)``, packed ``(N,)``), and the gradient is the only logits-sized output (none with
``grad_buffer=logits``).

Accumulation: the logits-sized passes over the token block in float32 (float64 for
float64 input); the arc scores, the lattice and the duration block (``D`` logits a
row) in float64. Half inputs are cast at load (the interpreter keeps bfloat16 as raw
integers and cannot compute on it); a bfloat16 gradient is rounded to nearest even
by hand (``_round_bf16``: the interpreter's cast truncates).
"""

# No ``from __future__ import annotations``: the interpreter of triton < 3.2 takes a
# parameter for ``tl.constexpr`` only when its annotation is the object itself.
import torch
import triton
import triton.language as tl

from ..._core import triton_compat  # noqa: F401 -- the interpreter fixes, before any launch
from ..lattice.triton_cuda import (
    _device_guard,
    _durations,
    _round_bf16,
    transducer_alpha_beta,
    transducer_alpha_beta_packed,
)
from .table import JointTable

NAN = float("nan")


# --------------------------------------------------------------------------- helpers
@triton.jit
def _dur_log_softmax(b_x, FUSED: tl.constexpr):
    """Log-probabilities of a ``[BLOCK_R, BLOCK_D]`` duration block (masked lanes ``-inf``).

    Fused: guarded log-softmax along the row, ``(x - m) - log(s)``; a row of ``-inf``
    gives ``-inf`` (no arc), never NaN. Not fused: the block itself.
    """
    if FUSED:
        b_m = tl.max(b_x, axis=1)
        none = b_m == float("-inf")
        b_sh = tl.where(none, 0.0, b_m)
        b_x = b_x - b_sh[:, None]
        b_s = tl.sum(tl.exp(b_x), axis=1)
        b_ls = tl.log(tl.where(none, 1.0, b_s))
        b_x = tl.where(none[:, None], float("-inf"), b_x - b_ls[:, None])
    return b_x


@triton.jit
def _blank_occupation(ab_ptr, bd_ptr, beta_ptr, i_r, o_st, i_t, T_b, U1, b_a, b_ll, m_occ,
                      i: tl.constexpr, NB: tl.constexpr):
    """Occupation of blank arc ``i`` of each row, ``(t, u) -> (t + d_i, u)`` (float64).

    ``b_ll`` is 0 off ``m_occ`` (no ``-inf - -inf``).
    """
    d = tl.load(bd_ptr + i)
    m_a = m_occ & (i_t + d <= T_b)
    b_arc = tl.load(ab_ptr + i_r * NB + i, mask=m_a, other=float("-inf"))
    b_beta = tl.load(beta_ptr + o_st + d * U1, mask=m_a, other=float("-inf"))
    return tl.where(m_a, tl.exp(tl.where(m_a, b_a + b_arc + b_beta - b_ll, float("-inf"))), 0.0)


@triton.jit
def _packed_rows(i_r, m_r, seq_ptr, off_ptr, il_ptr, tl_ptr, B):
    """Sequence ``b = seq[r]`` and ``(t, u)`` of packed rows ``r = off[b] + t (U_b+1) + u``.

    Also ``T_b``, ``U_b`` and the mask of the rows that belong to a sequence (all of
    ``m_r`` when the lengths add up to ``N``).
    """
    i_b = tl.load(seq_ptr + i_r, mask=m_r, other=0)
    m_b = m_r & (i_b < B)
    T_b = tl.load(il_ptr + i_b, mask=m_b, other=0)
    U_b = tl.load(tl_ptr + i_b, mask=m_b, other=0)
    i_loc = i_r - tl.load(off_ptr + i_b, mask=m_b, other=0)
    i_t = i_loc // (U_b + 1)
    i_u = i_loc % (U_b + 1)
    return i_b, i_t, i_u, T_b, U_b, m_b


@triton.jit
def _row_coords(i_r, m_r, seq_ptr, off_ptr, il_ptr, tl_ptr, B, T, U1, PACKED: tl.constexpr):
    """``(b, t, u, T_b, U_b)`` of rows ``i_r``, the mask of the rows in a sequence and that
    of the rows it reads (``t < T_b``, ``u <= U_b``).

    ``PACKED``: as ``_packed_rows``; else ``r = (b T + t)(U+1) + u`` of the padded grid.
    """
    if PACKED:
        i_b, i_t, i_u, T_b, U_b, m_b = _packed_rows(i_r, m_r, seq_ptr, off_ptr, il_ptr, tl_ptr, B)
        m_row = m_b & (i_t < T_b)
    else:
        i_b = i_r // (tl.cast(T, tl.int64) * U1)  # 64-bit: T (U+1) may wrap in 32
        i_t = (i_r // U1) % T
        i_u = i_r % U1
        T_b = tl.load(il_ptr + i_b, mask=m_r, other=0)
        U_b = tl.load(tl_ptr + i_b, mask=m_r, other=0)
        m_b = m_r
        m_row = m_r & (i_t < T_b) & (i_u <= U_b)
    return i_b, i_t, i_u, T_b, U_b, m_b, m_row


@triton.jit
def _row_ptr(ptr, i_r, i_b, i_t, i_u, s_b, s_t, s_u, PACKED: tl.constexpr):
    """The first element of each row (``PACKED``: row ``r`` at stride ``s_b``)."""
    if PACKED:
        p = ptr + i_r * s_b
    else:
        p = ptr + i_b * s_b + i_t * s_t + i_u * s_u
    return p


@triton.jit
def _token_lse(p_x, sx_v, m_row, V, tab_ptr, FUSED: tl.constexpr, HAT: tl.constexpr,
               ACC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """One pass over the token block: ``(m, s, bad)``, the online max and
    ``sum exp(x - m)`` (fused; HAT: over the labels) and the NaN/``+inf`` flag (int32)."""
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
            if HAT:  # the labels' softmax: the blank's class out
                b_x = tl.where(o_v[None, :] == tl.load(tab_ptr), float("-inf"), b_x)
            b_new = tl.maximum(b_m, tl.max(b_x, axis=1))
            shift = tl.where(b_new == float("-inf"), 0.0, b_new)
            b_s = b_s * tl.exp(b_m - shift) + tl.sum(tl.exp(b_x - shift[:, None]), axis=1)
            b_m = b_new
    return b_m, b_s, b_bad


@triton.jit
def _dur_scores(p_xd, sxd_v, m_row, o_d, D, b_bad, FUSED: tl.constexpr, LAT: tl.constexpr):
    """The duration block's log-probs ``[BLOCK_R, BLOCK_D]`` (``-inf`` for a NaN/``+inf``
    logit) and ``b_bad`` raised where the block holds one."""
    m_xd = m_row[:, None] & (o_d < D)[None, :]
    b_xd = tl.load(p_xd[:, None] + o_d[None, :] * sxd_v, mask=m_xd, other=float("-inf")).to(LAT)
    is_bad_d = (b_xd != b_xd) | (b_xd == float("inf"))
    b_bad = tl.maximum(b_bad, tl.max(is_bad_d.to(tl.int32), axis=1))
    return _dur_log_softmax(tl.where(is_bad_d, float("-inf"), b_xd), FUSED), b_bad


@triton.jit
def _store_arcs(p_x, sx_v, tab_ptr, par_ptr, ab_ptr, ae_ptr, i_r, i_t, T_b, m_row, m_e, m_bad,
                b_xe, b_ml, b_lsl, none, b_lpd, o_d, NB: tl.constexpr, NE: tl.constexpr,
                HAS_DUR: tl.constexpr, FUSED: tl.constexpr, HAT: tl.constexpr,
                LAT: tl.constexpr):
    """Each row's arc scores from its normalized target log-prob ``b_xe``, the split
    normalizer ``(b_ml, b_lsl)`` and the duration log-probs ``b_lpd`` (``-inf`` on a
    flagged row)."""
    # sigma in float64 from the parameter tensor (a Python float argument is float32),
    # on every arc's token log-probability (NeMo's logit under-normalization).
    sigma = tl.load(par_ptr + 3)
    # k2's delay penalty on every emission leaving frame t, in float64 (exact halves).
    dp = tl.load(par_ptr + 4)
    b_pen = dp * ((T_b - 1).to(LAT) * 0.5 - i_t.to(LAT))
    if HAT:
        # logsigmoid(+-z) = min(+-z, 0) - log(1 + exp(-|z|)), in float64
        b_zb = tl.load(p_x + tl.load(tab_ptr) * sx_v, mask=m_row, other=0.0).to(LAT)
        b_zb = tl.where(m_bad, 0.0, b_zb)
        b_l1p = tl.log(1.0 + tl.exp(-tl.abs(b_zb)))
        b_xe = b_xe + (tl.minimum(-b_zb, 0.0) - b_l1p)
    b_xe = tl.where(m_bad, float("-inf"), (b_xe - sigma) + b_pen)
    for i in tl.static_range(NB):
        b_v = tl.load(p_x + tl.load(tab_ptr + i) * sx_v, mask=m_row, other=float("-inf")).to(LAT)
        if HAT:
            b_v = tl.minimum(b_zb, 0.0) - b_l1p
        elif FUSED:
            b_v = tl.where(none, float("-inf"), (b_v - b_ml) - b_lsl)
        b_v = b_v - sigma
        if HAS_DUR:
            # lp_dur[dl] picked out of the row's block (dl = -1 picks nothing: + 0).
            dl = tl.load(tab_ptr + NB + i)
            b_v = b_v + tl.sum(tl.where(o_d[None, :] == dl, b_lpd, 0.0), axis=1)
        b_v = tl.where(m_bad, float("-inf"), b_v)
        tl.store(ab_ptr + i_r * NB + i, b_v, mask=m_row)
    for j in tl.static_range(NE):
        b_v = b_xe
        if HAS_DUR:
            dl = tl.load(tab_ptr + 2 * NB + j)
            b_v = tl.where(m_bad, float("-inf"),
                           b_v + tl.sum(tl.where(o_d[None, :] == dl, b_lpd, 0.0), axis=1))
        tl.store(ae_ptr + i_r * NE + j, b_v, mask=m_e)


@triton.jit
def _row_outcome(ll_ptr, bad_ptr, i_b, i_u, U_b, m_row):
    """``(log p, NaN rows, rows with occupations, those with an emission)`` of read rows;
    ``log p`` is 0 off the occupied rows (no ``-inf - -inf``)."""
    b_ll = tl.load(ll_ptr + i_b, mask=m_row, other=float("-inf"))
    b_bad = tl.load(bad_ptr + i_b, mask=m_row, other=0)
    m_nan = m_row & (b_bad != 0)
    # ``b_bad == 0``, not ``~(b_bad != 0)``: the interpreter of triton <= 3.3 has
    # no int1 type for ``~`` on a boolean block.
    m_occ = m_row & (b_bad == 0) & (b_ll != float("-inf"))
    m_e = m_occ & (i_u < U_b)
    return tl.where(m_occ, b_ll, 0.0), m_nan, m_occ, m_e


@triton.jit
def _arc_occupations(tab_ptr, bd_ptr, ed_ptr, ab_ptr, ae_ptr, alpha_ptr, beta_ptr, i_r, o_st,
                     i_t, T_b, U1_s, b_ll, emit_scale, m_occ, m_e, o_d, NB: tl.constexpr,
                     NE: tl.constexpr, HAS_DUR: tl.constexpr, EMIT_CAN_END: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """Each row's ``(alpha, o_0, sum_j e_j, total, dsub)`` in float64: the first blank
    arc's occupation (RNN-T's only one), the emissions' (FastEmit's ``1 + λ`` applied),
    every arc's, and ``[BLOCK_R, BLOCK_D]`` the occupations landing on each duration logit.
    """
    LAT = ab_ptr.dtype.element_ty  # float64
    b_a = tl.load(alpha_ptr + o_st, mask=m_occ, other=float("-inf"))
    b_dsub = tl.zeros([BLOCK_R, BLOCK_D], LAT)
    b_tot = tl.zeros([BLOCK_R], LAT)
    b_o0 = tl.zeros([BLOCK_R], LAT)
    for i in tl.static_range(NB):
        b_o = _blank_occupation(ab_ptr, bd_ptr, beta_ptr, i_r, o_st, i_t, T_b, U1_s, b_a, b_ll,
                                m_occ, i, NB)
        if i == 0:
            b_o0 = b_o  # kept for the token loop (RNN-T's only blank arc: no recomputation)
        b_tot = b_tot + b_o
        if HAS_DUR:
            dl = tl.load(tab_ptr + NB + i)
            b_dsub = b_dsub + tl.where(o_d[None, :] == dl, b_o[:, None], 0.0)
    b_oe = tl.zeros([BLOCK_R], LAT)
    for j in tl.static_range(NE):
        d = tl.load(ed_ptr + j)
        if EMIT_CAN_END:
            m_a = m_e & (i_t + d <= T_b)
        else:
            m_a = m_e & (i_t + d < T_b)
        b_arc = tl.load(ae_ptr + i_r * NE + j, mask=m_a, other=float("-inf"))
        b_beta = tl.load(beta_ptr + o_st + d * U1_s + 1, mask=m_a, other=float("-inf"))
        b_o = tl.where(m_a, tl.exp(tl.where(m_a, b_a + b_arc + b_beta - b_ll, float("-inf"))), 0.0)
        b_o = b_o * emit_scale  # FastEmit: (1 + λ) on every emission's occupation
        b_oe = b_oe + b_o
        if HAS_DUR:
            dl = tl.load(tab_ptr + 2 * NB + j)
            b_dsub = b_dsub + tl.where(o_d[None, :] == dl, b_o[:, None], 0.0)
    b_tot = b_tot + b_oe
    return b_a, b_o0, b_oe, b_tot, b_dsub


@triton.jit
def _arc_grads(b_g, o_v, b_y, b_oe, b_hb, b_gb, cls_ptr, p_ob, b_o0, ab_ptr, bd_ptr, beta_ptr,
               i_r, o_st, i_t, T_b, U1_s, b_a, b_ll, m_occ, NB: tl.constexpr,
               STORED: tl.constexpr, HAT: tl.constexpr, ACC: tl.constexpr):
    """The token block's epilogue after the softmax's share ``b_g = p w`` (``[BLOCK_R,
    BLOCK_V]``, classes ``o_v``), the one formula of both gradient kernels::

        g[c] = p[c] w - sum_i ob_i [c = cls_i] - oe [c = y]

    (``HAT``: ``g[blank] = gb`` instead of the blank arc's term, ``w = oe``), ``b_y`` each
    row's target, ``b_oe`` its emission's occupation. The blank arcs' occupations
    ``ob_i``: ``STORED`` (the tiles), loaded at ``p_ob + i``; else (the full joint) the
    first ``b_o0`` and the others recomputed from the lattice per block
    (``_blank_occupation``: a kernel cannot keep a table-sized list of blocks)."""
    if HAT:
        b_g = tl.where(o_v[None, :] == b_hb, b_gb[:, None], b_g)
    else:
        for i in tl.static_range(NB):
            if STORED:
                b_o = tl.load(p_ob + i, mask=m_occ, other=0.0)
            elif i == 0:
                b_o = b_o0
            else:
                b_o = _blank_occupation(ab_ptr, bd_ptr, beta_ptr, i_r, o_st, i_t, T_b, U1_s,
                                        b_a, b_ll, m_occ, i, NB)
            b_g = b_g - tl.where(o_v[None, :] == tl.load(cls_ptr + i), b_o.to(ACC)[:, None],
                                 0.0)
    return b_g - tl.where(o_v[None, :] == b_y[:, None], b_oe[:, None], 0.0)


@triton.jit
def _store_token_grad(p_x, sx_v, p_g, sg_v, p_y, tab_ptr, bd_ptr, par_ptr, ab_ptr, nz_ptr,
                      beta_ptr, i_r, o_st, i_t, T_b, U1_s, V, b_a, b_ll, b_o0, b_oe, b_tot,
                      clamp_l, scale_l, m_r, m_occ, m_e, m_nan, NB: tl.constexpr,
                      FUSED: tl.constexpr,
                      HAS_CLAMP: tl.constexpr, FP64: tl.constexpr, HAT: tl.constexpr,
                      BF16_OUT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """The token block's gradient of every row, over blocks of ``BLOCK_V`` classes in the
    accumulation dtype (``p_y``: each row's target label).

    A kernel cannot keep a table-sized list of blocks, so the occupations of blank arcs
    after the first are recomputed in each block (a few loads and one exp a row,
    against ``BLOCK_V`` exps); the first arc's (RNN-T's only one) is kept, so RNN-T
    does exactly the work of a dedicated kernel.
    """
    ACC = tl.float64 if FP64 else tl.float32
    clamp = clamp_l.to(ACC)
    grad_scale = scale_l.to(ACC)
    b_oe_acc = b_oe.to(ACC)
    b_y = tl.load(p_y, mask=m_e, other=-1)
    b_hb = -1  # HAT's blank class and its gradient (else unread)
    b_gb = b_oe_acc
    if FUSED:
        b_nm = tl.load(nz_ptr + 2 * i_r, mask=m_occ, other=0.0)
        b_ls = tl.load(nz_ptr + 2 * i_r + 1, mask=m_occ, other=0.0)
        m_lz = b_ls != float("-inf")  # a row of -inf logits: softmax 0 (and no arc)
        b_ls = tl.where(m_lz, b_ls, 0.0)
        b_w = b_tot.to(ACC)
        if HAT:  # the labels' softmax weighs the emission; the blank's sigmoid, every arc
            b_w = b_oe_acc
            b_hb = tl.load(tab_ptr)
            b_sig = tl.exp(tl.load(ab_ptr + i_r * NB, mask=m_occ, other=float("-inf"))
                           + tl.load(par_ptr + 3))
            b_gb = (b_sig * b_tot - b_o0).to(ACC)
    # Every row of the tensor is written (zeros on padding, and on packed rows that no
    # sequence's lengths reach).
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
        b_g = _arc_grads(b_g, o_v, b_y, b_oe_acc, b_hb, b_gb, tab_ptr, tab_ptr, b_o0, ab_ptr,
                         bd_ptr, beta_ptr, i_r, o_st, i_t, T_b, U1_s, b_a, b_ll, m_occ, NB,
                         False, HAT, ACC)
        if HAS_CLAMP:
            b_g = tl.minimum(tl.maximum(b_g, -clamp), clamp)
        b_g = b_g * grad_scale
        b_g = tl.where(m_nan[:, None], float("nan"), tl.where(m_occ[:, None], b_g, 0.0))
        if BF16_OUT:
            b_g = _round_bf16(b_g)
        tl.store(p_g[:, None] + o_v[None, :] * sg_v, b_g, mask=m_st[:, None] & m_v)


@triton.jit
def _store_dur_grad(p_xd, sxd_v, p_gd, sgd_v, D, o_d, b_tot, b_dsub, clamp_l, scale_l, m_r,
                    m_occ, m_nan, FUSED: tl.constexpr, HAS_CLAMP: tl.constexpr, FP64: tl.constexpr,
                    BF16_OUT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """The duration block's gradient of every row: one ``[BLOCK_R, BLOCK_D]`` block in
    float64 (``b_dsub``: the occupations landing on each duration logit)."""
    ACC = tl.float64 if FP64 else tl.float32
    LAT = b_tot.dtype
    m_st = m_r
    m_d = (o_d < D)[None, :]
    if FUSED:
        b_xd = tl.load(p_xd[:, None] + o_d[None, :] * sxd_v, mask=m_occ[:, None] & m_d,
                       other=float("-inf")).to(LAT)
        # The same function of the same logits as in the normalizer: the same bits.
        b_gd = tl.exp(_dur_log_softmax(b_xd, FUSED)) * b_tot[:, None]
        # In place, every thread's load of this block comes before any thread's store
        # of it, whatever the layout (a small block may be replicated across warps).
        tl.debug_barrier()
    else:
        b_gd = tl.zeros([BLOCK_R, BLOCK_D], LAT)
    b_gd = b_gd - b_dsub
    if HAS_CLAMP:
        b_gd = tl.minimum(tl.maximum(b_gd, -clamp_l), clamp_l)
    b_gd = b_gd * scale_l
    b_gd = tl.where(m_nan[:, None], float("nan"), tl.where(m_occ[:, None], b_gd, 0.0))
    # float64 -> ACC once; bfloat16 then rounds that float32 (as its token block).
    b_gd = b_gd.to(ACC)
    if BF16_OUT:
        b_gd = _round_bf16(b_gd)
    tl.store(p_gd[:, None] + o_d[None, :] * sgd_v, b_gd, mask=m_st[:, None] & m_d)


# --------------------------------------------------------------------------- kernels
@triton.jit
def joint_normalizer_kernel(
    x_ptr, xd_ptr, tg_ptr, il_ptr, tl_ptr, off_ptr, seq_ptr, tab_ptr, par_ptr, ab_ptr, ae_ptr,
    nz_ptr, bad_ptr, B, T, U1, NR, V, D,
    sx_b, sx_t, sx_u, sx_v, sxd_b, sxd_t, sxd_u, sxd_v, s_tg_b, s_tg_u,
    NB: tl.constexpr, NE: tl.constexpr, HAS_DUR: tl.constexpr,
    PACKED: tl.constexpr, FUSED: tl.constexpr, FP64: tl.constexpr, HAT: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
):
    r"""The prologue for a block of ``BLOCK_R`` rows ``r = (b * T + t) * (U+1) + u``.

    ``PACKED``: ``r`` is the row of the ``(N, V + D)`` logits, ``b = seq[r]`` and
    ``r = off[b] + t (U_b+1) + u``; the arc grids, normalizers and flags are per row.

    One read of the rows that sequence ``b`` reads (``t < T_b``, ``u <= U_b``). Token
    block (classes ``[0, V)``): ``log_z = m + log(s)``, ``m = max_v x[v]``,
    ``s = sum_v exp(x[v] - m)``, online over blocks of ``BLOCK_V`` classes (fused
    only), so that ``lp_tok[c] = (x[c] - m) - log(s)`` (not fused: ``x[c]``). Duration
    block (``HAS_DUR``: the ``D`` classes at ``xd``, a view of the classes ``[V, V + D)``
    of the same joint or a tensor of its own): ``lp_dur``, its log-softmax (fused)
    or itself. Then the arc scores (``table.py``)::

        arc_blank[r, i] = lp_tok[tok_i] - sigma + lp_dur[dl_i]           (every read row)
        arc_emit[r, j]  = lp_tok[y_{u+1}] - sigma + lp_dur[dl'_j]
                          + delay_penalty ((T_b - 1) / 2 - t)               (u < U_b)

    (no ``lp_dur`` term where the index is ``-1``). ``m`` and ``log(s)`` are kept
    apart, never summed, and the scores are formed in the lattice's dtype (float64):
    with logits of ``1e4`` a float32 ``m + log(s)`` would round away the last digits
    of every log-probability. A row holding a NaN or ``+inf`` (any class) is flagged
    and its scores are ``-inf`` (its sequence's results are NaN anyway), so nothing
    downstream computes on them. A row of ``-inf`` token logits (``s = 0``) has no arc
    out of it.

    ``HAT`` (the ``"hat"`` normalizer, one blank arc, fused): ``m``, ``s`` over the
    labels (the blank's class masked out of the online sum), and
    ``arc_blank = logsigmoid(z_blank) - sigma``, ``arc_emit = logsigmoid(-z_blank) +
    lp_tok[y_{u+1}] - sigma (+ delay)``.

    Updates:
        arc_blank (B, T, U+1, NB) (packed: (N, NB)): read rows.
        norm (B, T, U+1, 2) (packed: (N, 2)): ``(m, log s)`` of read rows (``m = 0``
            for a row of ``-inf``).
        arc_emit (B, T, U+1, NE) (packed: (N, NE)): read rows with ``u < U_b``.
        bad (B, T, U+1) (packed: (N,)) int8: every row (0 off the read region).
    """
    ACC = tl.float64 if FP64 else tl.float32
    LAT = ab_ptr.dtype.element_ty  # the lattice's dtype (float64)
    i_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    m_r = i_r < NR
    i_b, i_t, i_u, T_b, U_b, _, m_row = _row_coords(i_r, m_r, seq_ptr, off_ptr, il_ptr, tl_ptr,
                                                    B, T, U1, PACKED)
    p_x = _row_ptr(x_ptr, i_r, i_b, i_t, i_u, sx_b, sx_t, sx_u, PACKED)
    p_xd = _row_ptr(xd_ptr, i_r, i_b, i_t, i_u, sxd_b, sxd_t, sxd_u, PACKED)
    b_m, b_s, b_bad = _token_lse(p_x, sx_v, m_row, V, tab_ptr, FUSED, HAT, ACC, BLOCK_R, BLOCK_V)
    o_d = tl.arange(0, BLOCK_D)
    b_lpd = tl.zeros([BLOCK_R, BLOCK_D], LAT)
    if HAS_DUR:
        b_lpd, b_bad = _dur_scores(p_xd, sxd_v, m_row, o_d, D, b_bad, FUSED, LAT)
    m_bad = b_bad > 0

    m_e = m_row & (i_u < U_b)
    b_y = tl.load(tg_ptr + i_b * s_tg_b + i_u * s_tg_u, mask=m_e, other=0)
    b_xe = tl.load(p_x + b_y * sx_v, mask=m_e, other=float("-inf")).to(LAT)
    none = b_m == float("-inf")  # fused: a row of -inf logits, no arc out of it
    b_ml = tl.zeros([BLOCK_R], LAT)  # the split normalizer (m, log s); fused only
    b_lsl = b_ml
    if FUSED:
        b_m = tl.where(none | m_bad, 0.0, b_m)
        b_ls = tl.where(none, float("-inf"), tl.log(tl.where(none, 1.0, b_s)))
        b_ls = tl.where(m_bad, 0.0, b_ls)
        b_ml = b_m.to(LAT)
        b_lsl = tl.where(none, 0.0, b_ls).to(LAT)
        b_xe = tl.where(none, float("-inf"), (b_xe - b_ml) - b_lsl)
        tl.store(nz_ptr + 2 * i_r, b_m, mask=m_row)
        tl.store(nz_ptr + 2 * i_r + 1, b_ls, mask=m_row)
    _store_arcs(p_x, sx_v, tab_ptr, par_ptr, ab_ptr, ae_ptr, i_r, i_t, T_b, m_row, m_e, m_bad,
                b_xe, b_ml, b_lsl, none, b_lpd, o_d, NB, NE, HAS_DUR, FUSED, HAT, LAT)
    tl.store(bad_ptr + i_r, b_bad.to(tl.int8), mask=m_r)


@triton.jit
def joint_grad_kernel(
    x_ptr, g_ptr, xd_ptr, gd_ptr, tg_ptr, il_ptr, tl_ptr, off_ptr, seq_ptr, soff_ptr, tab_ptr,
    bd_ptr, ed_ptr, par_ptr, ab_ptr, ae_ptr, nz_ptr, alpha_ptr, beta_ptr, ll_ptr, bad_ptr,
    B, T, U1, NR, V, D,
    sx_b, sx_t, sx_u, sx_v, sg_b, sg_t, sg_u, sg_v,
    sxd_b, sxd_t, sxd_u, sxd_v, sgd_b, sgd_t, sgd_u, sgd_v, s_tg_b, s_tg_u,
    NB: tl.constexpr, NE: tl.constexpr, HAS_DUR: tl.constexpr, EMIT_CAN_END: tl.constexpr,
    PACKED: tl.constexpr, FUSED: tl.constexpr, HAS_CLAMP: tl.constexpr, FP64: tl.constexpr,
    HAT: tl.constexpr, BF16_OUT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    r"""The epilogue for a block of ``BLOCK_R`` rows ``r = (b * T + t) * (U+1) + u``.

    (``PACKED``: rows of the ``(N, V + D)`` logits, as in the normalizer; alpha and
    beta of ``(t, u)`` at ``soff[b] + t (U_b+1) + u``.)

    The row's arc occupations (float64, from alpha, beta, the arcs and ``log p``)::

        o_i = exp(alpha(t, u) + arc_blank[t, u, i] + beta(t + d_i, u) - log p)
                                                            (t + d_i <= T_b)
        e_j = (1 + λ) exp(alpha(t, u) + arc_emit[t, u, j] + beta(t + d'_j, u + 1) - log p)
                                  (u < U_b; t + d'_j < T_b, or <= T_b with EMIT_CAN_END)

    and ``total = sum_i o_i + sum_j e_j`` (every arc leaving the row), then per block
    (fused: the gradient with respect to the logits; else to the log-probabilities)::

        g[v]     = softmax_tok[v] total - sum_i o_i [v = tok_i] - sum_j e_j [v = y_{u+1}]   (v < V)
        g[V + k] = softmax_dur[k] total - sum_i o_i [k = dl_i]  - sum_j e_j [k = dl'_j]     (k < D)

    (no softmax term when not fused; ``HAT``: ``g[v] = softmax_labels[v] e - e [v = y]``
    on the labels and ``g[blank] = sigmoid(z_blank) total - o``, the sigmoid from the
    row's blank arc, ``exp(arc_blank + sigma)``, so no logit is read for it), clamped
    to ``[-clamp, clamp]`` (``HAS_CLAMP``),
    times ``grad_scale``, rounded once to the gradient's dtype. Rows of a sequence with
    a NaN/``+inf`` logit: NaN; rows of an infeasible sequence and padding rows: 0.

    The token block: ``_store_token_grad``; the duration block: ``_store_dur_grad``.
    Only this program touches its rows; a token element is loaded and stored by the
    same lane, the duration block is loaded whole before a barrier and stored after
    it, so ``g`` may alias ``x``.

    Updates:
        grad: every row of the tensor.
    """
    # Scalars from a float64 tensor (a Python float argument would be float32).
    clamp_l = tl.load(par_ptr)
    emit_scale = tl.load(par_ptr + 1)
    scale_l = tl.load(par_ptr + 2)
    i_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    m_r = i_r < NR
    i_b, i_t, i_u, T_b, U_b, m_b, m_row = _row_coords(i_r, m_r, seq_ptr, off_ptr, il_ptr, tl_ptr,
                                                      B, T, U1, PACKED)
    if PACKED:
        U1_s = U_b + 1  # the sequence's lattice row length
        o_st = tl.load(soff_ptr + i_b, mask=m_b, other=0) + i_t * U1_s + i_u
    else:
        U1_s = U1
        o_st = i_b * (T + 1) * U1 + i_t * U1 + i_u
    p_x = _row_ptr(x_ptr, i_r, i_b, i_t, i_u, sx_b, sx_t, sx_u, PACKED)
    p_g = _row_ptr(g_ptr, i_r, i_b, i_t, i_u, sg_b, sg_t, sg_u, PACKED)
    p_xd = _row_ptr(xd_ptr, i_r, i_b, i_t, i_u, sxd_b, sxd_t, sxd_u, PACKED)
    p_gd = _row_ptr(gd_ptr, i_r, i_b, i_t, i_u, sgd_b, sgd_t, sgd_u, PACKED)
    b_ll, m_nan, m_occ, m_e = _row_outcome(ll_ptr, bad_ptr, i_b, i_u, U_b, m_row)
    o_d = tl.arange(0, BLOCK_D)
    b_a, b_o0, b_oe, b_tot, b_dsub = _arc_occupations(
        tab_ptr, bd_ptr, ed_ptr, ab_ptr, ae_ptr, alpha_ptr, beta_ptr, i_r, o_st, i_t, T_b, U1_s,
        b_ll, emit_scale, m_occ, m_e, o_d, NB, NE, HAS_DUR, EMIT_CAN_END, BLOCK_R, BLOCK_D)
    _store_token_grad(p_x, sx_v, p_g, sg_v, tg_ptr + i_b * s_tg_b + i_u * s_tg_u, tab_ptr,
                      bd_ptr, par_ptr, ab_ptr, nz_ptr, beta_ptr, i_r, o_st, i_t, T_b, U1_s, V,
                      b_a, b_ll, b_o0, b_oe, b_tot, clamp_l, scale_l, m_r, m_occ, m_e, m_nan, NB,
                      FUSED, HAS_CLAMP, FP64, HAT, BF16_OUT, BLOCK_R, BLOCK_V)
    if HAS_DUR:
        _store_dur_grad(p_xd, sxd_v, p_gd, sgd_v, D, o_d, b_tot, b_dsub, clamp_l, scale_l, m_r,
                        m_occ, m_nan, FUSED, HAS_CLAMP, FP64, BF16_OUT, BLOCK_R, BLOCK_D)


@triton.jit
def _tile_probs(b_x, b_lz, ACC: tl.constexpr):
    """``exp(x - lz)`` of a block, ``lz`` (float64, per row) split into its rounding to
    ``ACC`` and the rest, subtracted in turn (exact where ``x`` is near ``lz``, where
    ``exp`` is large); ``lz = -inf`` (no finite logit) gives 0."""
    b_z = tl.where(b_lz == float("-inf"), float("inf"), b_lz)
    b_hi = b_z.to(ACC)
    b_lo = tl.where(tl.abs(b_hi) < float("inf"), b_z - b_hi.to(b_z.dtype), 0.0).to(ACC)
    return tl.exp((b_x - b_hi[:, None]) - b_lo[:, None])


@triton.jit
def _clamp_part(b_g, cl):
    """``b_g`` clamped to ``[-cl, cl]``; ``cl <= 0``: as it is (a part without a clamp)."""
    return tl.where(cl > 0, tl.minimum(tl.maximum(b_g, -cl), cl), b_g)


@triton.jit
def _tile_token_part(b_p, p_k, o_v, cls_ptr, b_y, b_sig, m_r, NC: tl.constexpr,
                     HAT: tl.constexpr, ACC: tl.constexpr):
    """One part's token gradient of a ``[BLOCK_R, BLOCK_V]`` block before its clamp, from
    the probabilities ``b_p`` and the part's row weights at ``p_k`` (float64): the full
    joint's ``_arc_grads`` with the occupations stored."""
    b_w = tl.load(p_k, mask=m_r, other=0.0)
    b_oe = tl.load(p_k + 2, mask=m_r, other=0.0).to(ACC)
    b_hb = -1
    b_gb = b_oe
    if HAT:  # the labels' softmax weighs the emission; the blank's sigmoid, every arc
        b_hb = tl.load(cls_ptr)
        b_gb = (b_sig * b_w - tl.load(p_k + 3, mask=m_r, other=0.0)).to(ACC)
        b_g = b_p * b_oe[:, None]
    else:
        b_g = b_p * b_w.to(ACC)[:, None]
    return _arc_grads(b_g, o_v, b_y, b_oe, b_hb, b_gb, cls_ptr, p_k + 3, b_w, p_k, p_k, p_k,
                      m_r, 0, 0, 0, 0, b_w, b_w, m_r, NC, True, HAT, ACC)


@triton.jit
def _tile_dur_grad(p_x, p_g, p_o, lzd_ptr, par_ptr, i_r, i_b, m_r, NR, NBS, V, D, C,
                   K: tl.constexpr, NC: tl.constexpr, HAS_CLAMP: tl.constexpr,
                   ACC: tl.constexpr, TINY: tl.constexpr, BLOCK_R: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    """The duration block of ``joint_tile_grad_kernel``'s rows, in float64: loaded whole,
    a barrier, stored."""
    o_d = tl.arange(0, BLOCK_D)
    m_d = m_r[:, None] & (o_d < D)[None, :]
    b_xd = tl.load(p_x[:, None] + V + o_d[None, :], mask=m_d, other=float("-inf"))
    tl.debug_barrier()
    b_pd = _tile_probs(b_xd.to(tl.float64), tl.load(lzd_ptr + i_r, mask=m_r, other=0.0),
                       tl.float64)
    b_gd = tl.zeros([BLOCK_R, BLOCK_D], tl.float64)
    for k in tl.static_range(K):
        p_k = p_o + k * (tl.cast(NR, tl.int64) * C)
        b_wd = tl.load(p_k + 1, mask=m_r, other=0.0)
        b_od = tl.load(p_k[:, None] + 3 + NC + o_d[None, :], mask=m_d, other=0.0)
        b_gk = b_pd * b_wd[:, None] - b_od
        if HAS_CLAMP:
            b_gk = _clamp_part(b_gk, tl.load(par_ptr + k))
        b_gd = b_gd + b_gk * tl.load(par_ptr + K + k * NBS + i_b, mask=m_r, other=0.0)[:, None]
    b_gd = b_gd.to(ACC)
    b_gd = tl.where(tl.abs(b_gd) < TINY, 0.0, b_gd)
    tl.store(p_g[:, None] + V + o_d[None, :], b_gd, mask=m_d)


@triton.jit
def joint_tile_grad_kernel(
    x_ptr, g_ptr, lz_ptr, lzd_ptr, occ_ptr, cls_ptr, tg_ptr, par_ptr, NR, NT, NU, NBS, V, D, C,
    sx_b, sx_t, sx_u, sg_b, sg_t, sg_u, s_tg_b,
    K: tl.constexpr, NC: tl.constexpr, HAS_DUR: tl.constexpr, HAT: tl.constexpr,
    HAS_CLAMP: tl.constexpr, FP64: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    r"""``joint_tile_grad`` (``reference.py``) on a block of ``BLOCK_R`` rows of a tile,
    ``r = (b NT + t) NU + u``, the arcs' occupations given.

    Per part ``k < K`` (clamped branches; one without a clamp) and row, from
    ``occ[k, r] = (w, wd, oe, ob_0 .. ob_{NC-1}, od_0 .. od_{D-1})`` (float64)::

        g[c]     = exp(x[c] - lz) w - sum_i ob_i [c = cls_i] - oe [c = y]      (c < V)
        g[V + j] = exp(x[V + j] - lzd) wd - od_j                               (j < D)

    (``HAT``: ``g[c] = exp(x[c] - lz) oe - oe [c = y]`` on the labels, ``g[blank] =
    sigmoid(x[blank]) w - ob_0``), clamped to ``par[k]`` (``HAS_CLAMP``), times the
    sequence's ``par[K + k NBS + b]``, summed over parts; magnitudes below the smallest
    normal number flushed to 0.

    Only this program touches its rows, and within a block every load comes before a
    barrier and every store after it (a small block may be replicated across warps), so
    ``g`` may alias ``x``. No atomics: deterministic.

    Updates:
        g: the tile's rows.
    """
    ACC = tl.float64 if FP64 else tl.float32
    TINY = 2.2250738585072014e-308 if FP64 else 1.1754943508222875e-38
    i_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    m_r = i_r < NR
    i_b = i_r // (tl.cast(NT, tl.int64) * NU)
    i_t = (i_r // NU) % NT
    i_u = i_r % NU
    p_x = _row_ptr(x_ptr, i_r, i_b, i_t, i_u, sx_b, sx_t, sx_u, False)
    p_g = _row_ptr(g_ptr, i_r, i_b, i_t, i_u, sg_b, sg_t, sg_u, False)
    p_o = occ_ptr + i_r * C  # part k's at + k NR C
    b_lz = tl.load(lz_ptr + i_r, mask=m_r, other=0.0)
    b_y = tl.load(tg_ptr + i_b * s_tg_b + i_u, mask=m_r, other=-1)
    b_sig = tl.zeros([BLOCK_R], tl.float64)
    if HAT:
        b_zb = tl.load(p_x + tl.load(cls_ptr), mask=m_r, other=0.0).to(tl.float64)
        b_sig = 1.0 / (1.0 + tl.exp(-b_zb))
    for v0 in range(0, V, BLOCK_V):
        o_v = v0 + tl.arange(0, BLOCK_V)
        m_x = m_r[:, None] & (o_v < V)[None, :]
        b_x = tl.load(p_x[:, None] + o_v[None, :], mask=m_x, other=float("-inf")).to(ACC)
        tl.debug_barrier()
        b_p = _tile_probs(b_x, b_lz, ACC)
        b_g = tl.zeros([BLOCK_R, BLOCK_V], ACC)
        for k in tl.static_range(K):
            p_k = p_o + k * (tl.cast(NR, tl.int64) * C)
            b_gk = _tile_token_part(b_p, p_k, o_v, cls_ptr, b_y, b_sig, m_r, NC, HAT, ACC)
            if HAS_CLAMP:
                b_gk = _clamp_part(b_gk, tl.load(par_ptr + k).to(ACC))
            b_sc = tl.load(par_ptr + K + k * NBS + i_b, mask=m_r, other=0.0)
            b_g = b_g + b_gk * b_sc.to(ACC)[:, None]
        b_g = tl.where(tl.abs(b_g) < TINY, 0.0, b_g)
        tl.store(p_g[:, None] + o_v[None, :], b_g, mask=m_x)
    if HAS_DUR:
        _tile_dur_grad(p_x, p_g, p_o, lzd_ptr, par_ptr, i_r, i_b, m_r, NR, NBS, V, D, C, K, NC,
                       HAS_CLAMP, ACC, TINY, BLOCK_R, BLOCK_D)


# --------------------------------------------------------------------------- launcher
_TABLES: dict[tuple, torch.Tensor] = {}


def _table_tensor(table: JointTable, device: torch.device) -> torch.Tensor:
    """``[tok_0..tok_{NB-1}, dl_0..dl_{NB-1}, dl'_0..dl'_{NE-1}]`` int64 on ``device``, cached.

    ``-1``: no duration term. Cached per (arcs, device): no host-to-device copy per call.
    """
    dl = lambda a: -1 if a.duration_logit is None else int(a.duration_logit)
    vals = (tuple(int(a.token) for a in table.blank_arcs)
            + tuple(dl(a) for a in table.blank_arcs) + tuple(dl(a) for a in table.emit_arcs))
    key = (vals, device)
    t = _TABLES.get(key)
    if t is None:
        t = torch.tensor(vals, dtype=torch.int64, device=device)
        _TABLES[key] = t
    return t


def _row_blocks(V: int) -> tuple[int, int]:
    block_v = min(triton.next_power_of_2(max(V, 1)), 1024)
    return max(1, min(64, 4096 // block_v)), block_v


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
    if logits.shape[-1] != V + D:
        raise ValueError(f"logits.size(-1) = {logits.shape[-1]} must equal the table's "
                         f"V + D = {V} + {D}")
    grad = None
    if compute_grad:
        grad = grad_buffer if grad_buffer is not None else torch.empty_like(logits)
    loss = _forward(logits[..., :V], logits[..., V:] if D else None, targets, logit_lengths,
                    target_lengths, table, fused_log_softmax,
                    None if grad is None else grad[..., :V],
                    None if grad is None or not D else grad[..., V:], grad_scale)
    if grad is None:
        return loss, logits.new_empty(0)
    if grad_buffer is not None:
        # The kernel wrote through a raw pointer: tell autograd that the buffer (maybe
        # the logits themselves) changed, so a node that saved it refuses to backward.
        torch.autograd.graph.increment_version(grad_buffer)
    return loss, grad


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
    V, D = table.num_tokens, table.num_durations
    if token_logits.shape[-1] != V or duration_logits.shape[-1] != D:
        raise ValueError(f"the pair's widths ({token_logits.shape[-1]}, "
                         f"{duration_logits.shape[-1]}) must equal the table's (V, D) = ({V}, {D})")
    gt = torch.empty_like(token_logits) if compute_grad else None
    gd = torch.empty_like(duration_logits) if compute_grad else None
    loss = _forward(token_logits, duration_logits, targets, logit_lengths, target_lengths, table,
                    fused_log_softmax, gt, gd, grad_scale)
    if not compute_grad:
        return loss, token_logits.new_empty(0), duration_logits.new_empty(0)
    return loss, gt, gd


def _strides(x: torch.Tensor, packed: bool) -> tuple[int, int, int, int]:
    return (x.stride(0), 0, 0, x.stride(1)) if packed else tuple(x.stride())


def _packed_maps(il: torch.Tensor, tlen: torch.Tensor, N: int, S: int) -> tuple:
    """The packed layout's device-side maps, from shapes only (no sync):
    ``(ends, off, seq, soff, num_states, max_u1)``, ``off[b]``/``ends[b]`` sequence ``b``'s
    rows, ``seq[r]`` row ``r``'s sequence, ``soff[b]`` its lattice's first state."""
    rows = il * (tlen + 1)
    ends = torch.cumsum(rows, 0)
    off = ends - rows  # sequence b's first row
    # seq[r] = b with off[b] <= r < ends[b] (B for rows past every sequence).
    seq = torch.searchsorted(ends, torch.arange(N, dtype=torch.int64, device=il.device),
                             right=True)
    # Sequence b's lattice: (T_b + 1)(U_b + 1) = rows_b + U_b + 1 states, packed.
    # N + B (S + 1) bounds them all (U_b <= S), from shapes only.
    states = tlen + 1
    soff = off + torch.cumsum(states, 0) - states
    num_states = N + il.shape[0] * (S + 1)
    # U_b + 1 <= S + 1, and <= rows_b <= N where T_b >= 1 (the only lanes read).
    max_u1 = min(S + 1, N)
    return ends, off, seq, soff, num_states, max_u1


def _params(table: JointTable, grad_scale: float, device: torch.device) -> torch.Tensor:
    """``(clamp, 1 + λ, grad_scale, sigma, delay_penalty)`` float64 on ``device``, by
    device-side fills (no host-to-device copy, no sync)."""
    par = torch.full((5,), float(table.clamp), dtype=torch.float64, device=device)
    par[1] = 1.0 + table.fastemit_lambda
    par[2] = float(grad_scale)
    par[3] = float(table.sigma)
    par[4] = float(table.delay_penalty)
    return par


def _no_frames(B: int, acc: torch.dtype, device: torch.device, grad: torch.Tensor | None,
               grad_dur: torch.Tensor | None) -> torch.Tensor:
    """No frame anywhere: every sequence is infeasible (``+inf``, zero gradient) and
    nothing is read."""
    loss = torch.full((B,), float("inf"), dtype=acc, device=device)
    if grad is not None:
        grad.zero_()
        if grad_dur is not None:
            grad_dur.zero_()
    return loss


def _normalizer_outputs(row_shape: tuple, NB: int, NE: int, fused: bool, acc: torch.dtype,
                        device: torch.device) -> tuple[torch.Tensor, ...]:
    """``(arc_blank, arc_emit, norm, row_bad)`` per row, for the normalizer to fill.

    The arcs (and the lattice) are float64 whatever the input (as the Numba backend's):
    a path through arcs of -2e4 (logits of 1e4) has alpha, beta and log p near -2e4,
    where float32's ulp (0.002) would be the occupations' relative error. The lattice
    is O(B T U) work, latency-bound (one barrier per diagonal), so float64 costs little
    there; the logits-sized passes stay in float32. ``norm`` (fused only: else unused)
    holds each row's ``(m, log s)``.
    """
    arc_blank = torch.empty((*row_shape, NB), dtype=torch.float64, device=device)
    arc_emit = torch.empty((*row_shape, NE), dtype=torch.float64, device=device)
    norm = arc_blank  # unused when not fused
    if fused:
        norm = torch.empty((*row_shape, 2), dtype=acc, device=device)
    row_bad = torch.empty(row_shape, dtype=torch.int8, device=device)
    return arc_blank, arc_emit, norm, row_bad


def _lattice(arc_blank: torch.Tensor, arc_emit: torch.Tensor, row_bad: torch.Tensor,
             il: torch.Tensor, tlen: torch.Tensor, table: JointTable, compute_grad: bool,
             maps: tuple | None) -> tuple[torch.Tensor, ...]:
    """``(log p, alpha, beta, bad (B,))``: the lattice on the normalizer's arc grids, and
    each sequence's NaN flag from its rows' (``maps``: the packed layout's, else None)."""
    if maps is None:
        ll, alpha, beta = transducer_alpha_beta(arc_blank, arc_emit, il, tlen,
                                                table.blank_durations, table.emit_durations,
                                                compute_grad, table.emit_can_end)
        return ll, alpha, beta, row_bad.view(il.shape[0], -1).amax(1) > 0
    ends, off, _, soff, num_states, max_u1 = maps
    N = row_bad.shape[0]
    ll, alpha, beta = transducer_alpha_beta_packed(
        arc_blank, arc_emit, il, tlen, off, soff, num_states, max_u1,
        table.blank_durations, table.emit_durations, compute_grad, table.emit_can_end)
    # Flagged rows per sequence: differences of an exact integer prefix sum
    # (deterministic; the clamp only guards lengths that overrun N).
    n_bad = torch.cumsum(row_bad, 0, dtype=torch.int64)
    n_bad = torch.cat([n_bad.new_zeros(1), n_bad])
    return ll, alpha, beta, (n_bad[ends.clamp(max=N)] - n_bad[off.clamp(max=N)]) > 0


def _launch_config(table: JointTable, NR: int, packed: bool, fused: bool,
                   fp64: bool) -> tuple[tuple[int], dict]:
    """The grid over ``NR`` rows and the ``tl.constexpr`` both kernels share."""
    block_r, block_v = _row_blocks(table.num_tokens)
    block_d = max(2, triton.next_power_of_2(max(table.num_durations, 1)))
    consts = dict(NB=len(table.blank_arcs), NE=len(table.emit_arcs),
                  HAS_DUR=table.num_durations > 0, PACKED=packed, FUSED=fused, FP64=fp64,
                  HAT=table.hat, BLOCK_R=block_r, BLOCK_V=block_v, BLOCK_D=block_d)
    return (triton.cdiv(NR, block_r),), consts


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
    """The loss; the gradient written into ``grad`` (token block ``(..., V)``) and
    ``grad_dur`` (duration block ``(..., D)``), when ``grad`` is given.

    ``logits``/``dur_logits``: the token and duration blocks, views of one joint or two
    tensors (``dur_logits`` ``None`` when ``D = 0``); same for the gradients.
    """
    device = logits.device
    fp64 = logits.dtype == torch.float64
    acc = torch.float64 if fp64 else torch.float32
    packed = logits.dim() == 2
    V, D = table.num_tokens, table.num_durations
    NB, NE = len(table.blank_arcs), len(table.emit_arcs)
    il = logit_lengths.to(device=device, dtype=torch.int64).contiguous()
    tlen = target_lengths.to(device=device, dtype=torch.int64).contiguous()
    B = il.shape[0]
    # Packed coordinates: the grids run over the N rows, each row's sequence and (t, u)
    # from device-side maps; no extent of the batch is read on the host.
    N = logits.shape[0] if packed else 0
    T, U1 = (0, 0) if packed else tuple(logits.shape[1:3])  # packed: unused
    NR = N if packed else B * T * U1
    sx = _strides(logits, packed)
    # Without a duration block, the (never read) duration pointers are the logits'.
    xd = dur_logits if dur_logits is not None else logits
    sxd = _strides(xd, packed)
    if B == 0 or NR == 0:
        return _no_frames(B, acc, device, grad, grad_dur)

    tg = targets.to(device=device, dtype=torch.int64)
    S = tg.shape[1]
    maps = _packed_maps(il, tlen, N, S) if packed else None
    off, seq, soff = maps[1:4] if packed else (il, il, il)  # padded: unused
    if S == 0:
        tg = torch.zeros((B, 1), dtype=torch.int64, device=device)  # never read
    tab = _table_tensor(table, device)
    bd = _durations(table.blank_durations, device)
    ed = _durations(table.emit_durations, device)
    par = _params(table, grad_scale, device)
    if table.hat and not fused_log_softmax:
        raise ValueError("a 'hat' table takes raw logits (fused_log_softmax=True)")
    grid, consts = _launch_config(table, NR, packed, fused_log_softmax, fp64)
    # Per row: padded (B, T, U+1, .), packed (N, .).
    row_shape = (N,) if packed else (B, T, U1)
    with _device_guard(logits):
        arc_blank, arc_emit, norm, row_bad = _normalizer_outputs(row_shape, NB, NE,
                                                                 fused_log_softmax, acc, device)
        joint_normalizer_kernel[grid](
            logits, xd, tg, il, tlen, off, seq, tab, par, arc_blank, arc_emit, norm, row_bad,
            B, T, U1, NR, V, D, *sx, *sxd, *tg.stride(), **consts,
        )
        ll, alpha, beta, bad = _lattice(arc_blank, arc_emit, row_bad, il, tlen, table,
                                        grad is not None, maps)
        loss = torch.where(bad, NAN, -ll * (1.0 + table.fastemit_lambda)).to(acc)
        if grad is None:
            return loss

        sg = _strides(grad, packed)
        gd = grad_dur if grad_dur is not None else grad
        sgd = _strides(gd, packed)
        joint_grad_kernel[grid](
            logits, grad, xd, gd, tg, il, tlen, off, seq, soff, tab, bd, ed, par, arc_blank,
            arc_emit, norm, alpha, beta, ll, bad.to(torch.int8), B, T, U1, NR, V, D, *sx, *sg,
            *sxd, *sgd, *tg.stride(),
            EMIT_CAN_END=bool(table.emit_can_end), HAS_CLAMP=table.clamp > 0,
            BF16_OUT=grad.dtype == torch.bfloat16, **consts,
        )
    return loss


def joint_tile_grad(
    x: torch.Tensor,
    lz: torch.Tensor,
    lzd: torch.Tensor | None,
    occ: torch.Tensor,
    cls: tuple[int, ...],
    targets: torch.Tensor,
    hat_blank: int,
    clamp: tuple[float, ...],
    gscale: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """See ``seqloss.transducer.joint.reference.joint_tile_grad``: one launch of
    ``joint_tile_grad_kernel`` over the tile's rows (``out`` may be ``x``)."""
    nb, NT, NU, W = x.shape
    K = occ.shape[0]
    NC = len(cls)
    D = occ.shape[-1] - 3 - NC
    V = W - D
    NR = nb * NT * NU
    if NR == 0:
        return out
    device = x.device
    f64 = torch.float64
    if hat_blank >= 0:
        cls = (hat_blank,)
    key = (tuple(cls), device)
    ct = _TABLES.get(key)
    if ct is None:
        ct = _TABLES[key] = torch.tensor(cls, dtype=torch.int64, device=device)
    # (clamp_0 .. clamp_{K-1}, gscale (K, nb)), float64 on the device: fills, no copy
    par = torch.empty(K * (1 + nb), dtype=f64, device=device)
    for k, c in enumerate(clamp):
        par[k] = float(c)
    par[K:] = gscale.to(f64).reshape(-1)
    lz = lz.to(f64).contiguous()
    lzd = lz if lzd is None else lzd.to(f64).contiguous()
    occ = occ.to(f64).contiguous()
    tg = targets.to(torch.int64).contiguous()
    if tg.shape[1] == 0:
        tg = torch.zeros((nb, 1), dtype=torch.int64, device=device)  # never read (NU = 0)
    block_r, block_v = _row_blocks(V)
    block_d = max(2, triton.next_power_of_2(max(D, 1)))
    with _device_guard(x):
        joint_tile_grad_kernel[(triton.cdiv(NR, block_r),)](
            x, out, lz, lzd, occ, ct, tg, par, NR, NT, NU, nb, V, D, occ.shape[-1],
            *x.stride()[:3], *out.stride()[:3], tg.stride(0),
            K=K, NC=NC, HAS_DUR=D > 0, HAT=hat_blank >= 0,
            HAS_CLAMP=any(c > 0 for c in clamp), FP64=x.dtype == torch.float64,
            BLOCK_R=block_r, BLOCK_V=block_v, BLOCK_D=block_d,
        )
    if out.data_ptr() == x.data_ptr():
        torch.autograd.graph.increment_version(out)
    return out
