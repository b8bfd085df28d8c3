"""CTC loss and gradient with Triton, same interface and semantics as ``seqloss.ctc.reference``.

Launches, in stream order (each phase is its own launch, so no phase ever reads
what another program of the same launch writes):

1. ``ctc_normalizer_kernel`` (fused only): ``lse[t, b] = logsumexp_c x[t, b, c]``,
   one online pass over the logits, one program per block of ``(t, b)`` rows.
2. ``ctc_alpha_kernel``: one program per sequence, forward recursion over its
   frames, states vectorized; writes ``log_alpha (T, B, K)`` (two rows per
   sequence when no gradient is wanted) and the loss.
3. ``ctc_softmax_grad_kernel`` (fused only; else ``torch.zeros``): the dense part
   of the gradient, ``softmax(x)`` on the frames a feasible sequence reads and 0
   everywhere else; one program per block of rows, one pass over the logits.
4. ``ctc_beta_kernel``: one program per sequence, backward recursion; at each
   frame it forms the state occupation, sums it per class (blank, then each
   distinct label) and overwrites the gradient at those classes with
   ``base - occupation`` (``base`` = softmax when fused, else 0), computed in the
   accumulation dtype and rounded once. A class is written by exactly one lane
   of one program: the race-free, deterministic scatter.

Accumulation in float32 (float64 for float64 input); half inputs are cast at
load (the interpreter keeps bfloat16 as raw integers and cannot compute on it).
Float32 accuracy does not degrade with length: ``alpha`` is rescaled to a
maximum of 0 at every frame (shifts summed in float64 for the loss), and the
occupation of a frame is the softmax over states of ``alpha + beta'``, so the
rescalings and ``log p`` cancel. Results are bit-deterministic: no atomics, and
every reduction has a fixed order.

Race-freedom on a GPU (the recursions): the shifted states ``s-1``, ``s-2`` (beta:
``s+1``, ``s+2``) live in other lanes (other threads), so they are read back from the
row stored for the previous frame. Those rows belong to one program (one program per
sequence, no other program of the launch touches them), and every store of a frame is
followed by ``tl.debug_barrier()`` (``bar.sync``, which also orders the CTA's
global-memory accesses) before the loads of the next.
"""

# No ``from __future__ import annotations``: the interpreter of triton < 3.2 takes a
# parameter for ``tl.constexpr`` only when its annotation is the object itself.
import contextlib

import torch
import triton
import triton.language as tl

from .._core.triton_compat import state_warps  # also applies the interpreter fixes

__all__ = ["ctc_loss_forward"]


# ``tl.max(x, 0)`` and ``tl.sum(x, 0)`` of float32/float64 compile to these reductions.
# Spelled out, because the interpreter re-patches ``triton.language`` on every
# device-function call (``tl.max`` is one), which costs milliseconds per frame.
_MAX = tl.standard._elementwise_max
_ADD = tl.standard._sum_combine


@triton.jit
def ctc_normalizer_kernel(
    x_ptr, il_ptr, lse_ptr,
    T, B, C,
    stride_xt, stride_xb, stride_xc,
    FP64: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """``lse[t, b] = logsumexp(x[t, b, :])`` for a block of ``BLOCK_R`` rows ``r = t * B + b``.

    Online over chunks of ``BLOCK_C`` classes (one read of the logits). Rows with
    ``t >= input_lengths[b]`` are neither read nor written.

    Updates:
        lse (T, B): accumulation dtype.
    """
    ACC = tl.float64 if FP64 else tl.float32
    i_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    m_r = i_r < tl.cast(T, tl.int64) * B  # 64-bit: T B may pass 2**31
    i_t = i_r // B
    i_b = i_r % B
    b_len = tl.load(il_ptr + i_b, mask=m_r, other=0)
    m_row = m_r & (i_t < b_len)
    p_row = x_ptr + i_t * stride_xt + i_b * stride_xb
    b_m = tl.full([BLOCK_R], float("-inf"), ACC)
    b_s = tl.zeros([BLOCK_R], ACC)
    for c0 in range(0, C, BLOCK_C):
        o_c = c0 + tl.arange(0, BLOCK_C)
        m_x = m_row[:, None] & (o_c < C)[None, :]
        b_x = tl.load(p_row[:, None] + o_c[None, :] * stride_xc, mask=m_x,
                      other=float("-inf")).to(ACC)
        b_new = tl.maximum(b_m, tl.reduce(b_x, 1, _MAX))
        shift = tl.where(b_new == float("-inf"), 0.0, b_new)
        b_s = b_s * tl.exp(b_m - shift) + tl.reduce(tl.exp(b_x - shift[:, None]), 1, _ADD)
        b_m = b_new
    none = b_m == float("-inf")
    # An all -inf row gives -inf here, and -inf log-probs downstream (x - lse taken as
    # -inf where lse = -inf: no path leaves the frame), the rule of _core/logspace.py.
    b_lse = tl.where(none, float("-inf"), tl.log(tl.where(none, 1.0, b_s)) + b_m)
    tl.store(lse_ptr + i_r, b_lse, mask=m_row)


@triton.jit
def _alpha_lanes(x_ptr, lse_ptr, tgt_ptr, alpha_ptr, i_b, b_L, B, K, stride_xb, stride_xc,
                 stride_tb, stride_ts, blank, BLOCK_K: tl.constexpr):
    """``ctc_alpha_kernel``'s lanes ``s`` of sequence ``i_b``: ``(o_s, K_b, m_s, m_s1,
    m_lab, m_skip, p_x, p_lse, p_a, BK)``: ``s``, ``2 L_b + 1``, the masks (state, ``s-1``
    exists, label, ``s-2`` arc), the addresses at frame 0 of ``l'_s``'s logit, of the
    sequence's ``lse`` and of its alpha row, the row stride ``B K``."""
    K_b = 2 * b_L + 1
    # int64 lanes: all offset arithmetic in 64 bits (no int32 overflow checks needed).
    o_s = tl.arange(0, BLOCK_K).to(tl.int64)
    m_s = o_s < K_b
    m_lab = m_s & ((o_s % 2) == 1)
    m_s1 = m_s & (o_s >= 1)
    p_tgt = tgt_ptr + i_b * stride_tb + (o_s // 2) * stride_ts
    b_ext = tl.load(p_tgt, mask=m_lab, other=blank)
    b_prev = tl.load(p_tgt - stride_ts, mask=m_lab & (o_s >= 3), other=blank)
    m_skip = m_lab & (o_s >= 3) & (b_ext != blank) & (b_ext != b_prev)
    p_x = x_ptr + i_b * stride_xb + b_ext.to(tl.int64) * stride_xc
    p_lse = lse_ptr + i_b
    # 64-bit: T B K (the alpha rows) may pass 2**31 elements.
    BK = tl.cast(B, tl.int64) * K
    p_a = alpha_ptr + i_b * K + o_s
    return o_s, K_b, m_s, m_s1, m_lab, m_skip, p_x, p_lse, p_a, BK


@triton.jit
def _alpha_first_frame(p_x, p_lse, p_a, o_s, K_b, m_lab, b_T, b_dp, b_half,
                       FUSED: tl.constexpr, FP64: tl.constexpr, DELAY: tl.constexpr):
    """Frame 0 of ``ctc_alpha_kernel``: stores its rescaled ``alpha`` row at ``p_a``;
    returns it and its shift (float64)."""
    ACC = tl.float64 if FP64 else tl.float32
    NEG_INF = float("-inf")
    has = b_T > 0
    # Scalar conditions enter masks as vector comparisons: the interpreter turns
    # ``vector_bool & scalar_bool`` into int32, which it then rejects as a mask.
    m_0 = o_s < tl.where(has, K_b, 0)
    b_e = tl.load(p_x, mask=m_0, other=NEG_INF).to(ACC)
    if FUSED:  # a frame of -inf (lse = -inf): -inf, not NaN (see ctc_normalizer_kernel)
        b_lse = tl.load(p_lse, mask=has, other=0.0)
        b_e = tl.where(b_lse == NEG_INF, NEG_INF, b_e - b_lse)
    if DELAY:
        b_e = b_e + tl.where(m_lab, (b_dp * b_half).to(ACC), 0.0)
    b_a = tl.where(o_s < 2, b_e, NEG_INF)
    b_max = tl.reduce(b_a, 0, _MAX)
    shift = tl.where(b_max == NEG_INF, 0.0, b_max)
    b_a = b_a - shift
    tl.store(p_a, b_a, mask=m_0)
    return b_a, shift.to(tl.float64)


@triton.jit
def _ctc_log_likelihood(b_a, b_off, o_s, m_s, K_b, b_T, b_L, FP64: tl.constexpr):
    """``log p`` (accumulation dtype) from the last frame's rescaled ``alpha`` row ``b_a``
    and the summed shifts ``b_off``."""
    ACC = tl.float64 if FP64 else tl.float32
    NEG_INF = float("-inf")
    # log p = logaddexp(alpha[T_b-1, K_b-1], alpha[T_b-1, K_b-2]); lane K_b-2 is
    # the last label (absent when L_b = 0, K_b - 2 = -1 matches no lane).
    m_fin = m_s & ((o_s == K_b - 1) | (o_s == K_b - 2))
    b_v = tl.where(m_fin, b_a, NEG_INF)
    b_max = tl.reduce(b_v, 0, _MAX)
    none = b_max == NEG_INF
    shift = tl.where(none, 0.0, b_max)
    b_tot = tl.reduce(tl.where(m_fin, tl.exp(b_v - shift), 0.0), 0, _ADD)
    b_ll = tl.where(none, NEG_INF, tl.log(tl.where(none, 1.0, b_tot)) + shift)
    b_ll = (b_ll.to(tl.float64) + b_off).to(ACC)
    # Zero frames: only the empty target is feasible (probability 1).
    return tl.where(b_T > 0, b_ll, tl.where(b_L == 0, 0.0, NEG_INF))


@triton.jit
def ctc_alpha_kernel(
    x_ptr, lse_ptr, tgt_ptr, il_ptr, tl_ptr, alpha_ptr, loss_ptr, dp_ptr,
    B, K,
    stride_xt, stride_xb, stride_xc, stride_tb, stride_ts,
    blank,
    FUSED: tl.constexpr, STORE_ALL: tl.constexpr, FP64: tl.constexpr, BLOCK_K: tl.constexpr,
    DELAY: tl.constexpr,
):
    """Forward recursion of sequence ``b = program_id(0)`` over its ``input_lengths[b]`` frames.

    Lane ``s`` holds ``log_alpha[t, s]`` of the extended label ``l'_s`` (blank at even
    ``s``, ``targets[b, (s - 1) / 2]`` at odd ``s``), ``s < 2 L_b + 1``::

        alpha[t, s] = e[t, s] + logaddexp(alpha[t-1, s], alpha[t-1, s-1],
                                          alpha[t-1, s-2] if l'_s != blank, l'_s != l'_{s-2})

    rescaled at every frame so that its maximum is 0; the shifts are summed in
    float64 into ``log p``. ``DELAY``: the label lanes' emissions at frame ``t`` gain
    ``dp * ((T_b - 1) / 2 - t)`` (``dp = dp_ptr[0]``, float64; the penalty is formed in
    float64 as in the other backends, then rounded once). Unscaled, ``alpha`` reaches
    ``-T |log p_t|`` and its float32 ulp grows with it; rescaled, the stored values stay
    ``O(|log p_t|)``.

    Race-freedom on a GPU: the module docstring; the row ``(t, b)`` of ``alpha`` is that
    of frame ``t``. With ``STORE_ALL=False`` the rows alternate between two slots; the
    slot written at frame ``t+1`` was last read at frame ``t``, before that frame's barrier.

    The frame loop (guarded logaddexp, emission gather) is written inline, helpers serve
    the setup and the end only: the interpreter re-patches ``triton.language`` on every
    device-function call (about as long as a whole frame's work).

    Updates:
        alpha (T or 2, B, K): rescaled ``log_alpha`` at row ``t`` (``t % 2``), lanes
            ``s < 2 L_b + 1``.
        loss (B,): ``-log p``; ``+inf`` if impossible; zero frames: 0 for an empty target.
    """
    ACC = tl.float64 if FP64 else tl.float32
    NEG_INF = float("-inf")
    i_b = tl.program_id(0).to(tl.int64)
    b_T = tl.load(il_ptr + i_b)
    b_L = tl.load(tl_ptr + i_b)
    o_s, K_b, m_s, m_s1, m_lab, m_skip, p_x, p_lse, p_a, BK = _alpha_lanes(
        x_ptr, lse_ptr, tgt_ptr, alpha_ptr, i_b, b_L, B, K, stride_xb, stride_xc, stride_tb,
        stride_ts, blank, BLOCK_K)
    p_a1 = p_a - 1
    p_a2 = p_a - 2
    b_dp = tl.load(dp_ptr) if DELAY else 0.0
    b_half = (b_T - 1).to(tl.float64) * 0.5 if DELAY else 0.0
    b_a, b_off = _alpha_first_frame(p_x, p_lse, p_a, o_s, K_b, m_lab, b_T, b_dp, b_half,
                                    FUSED, FP64, DELAY)
    tl.debug_barrier()
    for t in range(1, b_T):
        if STORE_ALL:
            off = t * BK
            off_prev = off - BK
        else:
            off = (t % 2) * BK
            off_prev = BK - off
        b_a1 = tl.load(p_a1 + off_prev, mask=m_s1, other=NEG_INF)
        b_a2 = tl.load(p_a2 + off_prev, mask=m_skip, other=NEG_INF)
        b_e = tl.load(p_x + t * stride_xt, mask=m_s, other=NEG_INF).to(ACC)
        if FUSED:  # a frame of -inf: -inf, not NaN (see ctc_normalizer_kernel)
            b_lse = tl.load(p_lse + t * B)
            b_e = tl.where(b_lse == NEG_INF, NEG_INF, b_e - b_lse)
        if DELAY:
            b_e = b_e + tl.where(m_lab, (b_dp * (b_half - t)).to(ACC), 0.0)
        # Guarded logaddexp: a lane whose three terms are all -inf stays -inf,
        # with no -inf - -inf and no log(0).
        b_m = tl.maximum(tl.maximum(b_a, b_a1), b_a2)
        none = b_m == NEG_INF
        b_sh = tl.where(none, 0.0, b_m)
        b_tot = tl.exp(b_a - b_sh) + tl.exp(b_a1 - b_sh) + tl.exp(b_a2 - b_sh)
        b_a = b_e + tl.where(none, NEG_INF, tl.log(tl.where(none, 1.0, b_tot)) + b_sh)
        b_max = tl.reduce(b_a, 0, _MAX)
        shift = tl.where(b_max == NEG_INF, 0.0, b_max)
        b_a = b_a - shift
        b_off += shift.to(tl.float64)
        tl.store(p_a + off, b_a, mask=m_s)
        tl.debug_barrier()
    tl.store(loss_ptr + i_b, -_ctc_log_likelihood(b_a, b_off, o_s, m_s, K_b, b_T, b_L, FP64))


@triton.jit
def ctc_softmax_grad_kernel(
    x_ptr, lse_ptr, il_ptr, loss_ptr, grad_ptr,
    T, B, C,
    stride_xt, stride_xb, stride_xc, stride_gt, stride_gb, stride_gc,
    FP64: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Dense part of the fused gradient for a block of ``BLOCK_R`` rows ``r = t * B + b``.

    ``grad[t, b, :] = exp(x[t, b, :] - lse[t, b])`` where ``t < input_lengths[b]`` and
    the sequence is feasible, else 0 (those rows are not read). The label and blank
    classes are overwritten afterwards by ``ctc_beta_kernel``.

    Updates:
        grad (T, B, C): every element.
    """
    ACC = tl.float64 if FP64 else tl.float32
    i_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    m_r = i_r < tl.cast(T, tl.int64) * B  # 64-bit: T B may pass 2**31
    i_t = i_r // B
    i_b = i_r % B
    b_len = tl.load(il_ptr + i_b, mask=m_r, other=0)
    b_loss = tl.load(loss_ptr + i_b, mask=m_r, other=float("inf"))
    m_row = m_r & (i_t < b_len) & (b_loss != float("inf"))
    b_lse = tl.load(lse_ptr + i_r, mask=m_row, other=0.0)
    p_x = x_ptr + i_t * stride_xt + i_b * stride_xb
    p_g = grad_ptr + i_t * stride_gt + i_b * stride_gb
    for c0 in range(0, C, BLOCK_C):
        o_c = c0 + tl.arange(0, BLOCK_C)
        m_c = (o_c < C)[None, :]
        b_x = tl.load(p_x[:, None] + o_c[None, :] * stride_xc, mask=m_row[:, None] & m_c,
                      other=float("-inf")).to(ACC)
        b_g = tl.where(m_row[:, None], tl.exp(b_x - b_lse[:, None]), 0.0)
        tl.store(p_g[:, None] + o_c[None, :] * stride_gc, b_g, mask=m_r[:, None] & m_c)


@triton.jit
def ctc_beta_kernel(
    x_ptr, lse_ptr, tgt_ptr, il_ptr, tl_ptr, alpha_ptr, loss_ptr, scratch_ptr, grad_ptr,
    perm_ptr, pos_ptr, count_ptr, mult_ptr, dp_ptr,
    B, S, K,
    stride_xt, stride_xb, stride_xc, stride_tb, stride_ts, stride_gt, stride_gb, stride_gc,
    blank,
    FUSED: tl.constexpr, FP64: tl.constexpr, BLOCK_K: tl.constexpr, DELAY: tl.constexpr,
):
    """Backward recursion and occupation of sequence ``b = program_id(0)``.

    ``beta'[t, s]`` excludes the emission at ``t`` (0 on the two final states at
    ``t = T_b - 1``); ``bn = beta' + e`` is the recursion's carried row::

        beta'[t, s] = logaddexp(bn[t+1, s], bn[t+1, s+1],
                                bn[t+1, s+2] if l'_{s+2} != blank, l'_{s+2} != l'_s)
        gamma[t, s] = softmax_s(alpha[t, s] + beta'[t, s])

    Every path crosses frame ``t`` in exactly one state, so ``sum_s alpha beta' = p``
    at every frame and the occupation is a softmax over the frame's states: the
    rescalings of ``alpha`` and ``beta'`` (and ``log p``) cancel, and so do the
    rounding errors they carry. ``beta'`` is rescaled by the same frame shift.
    ``DELAY``: the emissions carry the delay penalty as in ``ctc_alpha_kernel``; the
    softmax of a fused gradient does not.

    The occupation of a class is the sum of ``gamma`` over its states: blank over
    the lanes holding blank; a label over its occurrences in the target, summed
    by the lane of its first occurrence (``count > 0``) in increasing position
    order (``perm``/``pos``: the target's positions sorted by label). That lane
    alone writes ``grad[t, b, class] = base - occupation`` (``base``: softmax when
    fused, else 0), computed in the accumulation dtype and rounded once.

    Race-freedom on a GPU: as in ``ctc_alpha_kernel``, the scratch rows (``bn``
    for the shifted states, ``gamma`` for the per-class sums) belong to this
    program only and alternate between two slots; each frame stores both, then
    ``tl.debug_barrier()``, then reads. A slot is rewritten two frames later,
    after the intervening frame's barrier, hence after every read of it.
    ``alpha`` was written by an earlier launch; ``grad`` rows ``(., b)`` are
    written by this program only, each class by one lane, after the dense pass
    (an earlier launch) wrote them.

    Updates:
        grad (T, B, C): blank and label classes of frames ``t < T_b`` (feasible only).
        scratch (B, 2, 2, K): working rows.
    """
    ACC = tl.float64 if FP64 else tl.float32
    NEG_INF = float("-inf")
    i_b = tl.program_id(0).to(tl.int64)
    b_T = tl.load(il_ptr + i_b)
    b_L = tl.load(tl_ptr + i_b)
    K_b = 2 * b_L + 1
    # int64 lanes: all offset arithmetic in 64 bits (no int32 overflow checks needed).
    o_s = tl.arange(0, BLOCK_K).to(tl.int64)
    m_s = o_s < K_b
    m_lab = m_s & ((o_s % 2) == 1)
    p_tgt = tgt_ptr + i_b * stride_tb + (o_s // 2) * stride_ts
    b_ext = tl.load(p_tgt, mask=m_lab, other=blank)
    m_n = m_lab & (o_s + 2 < K_b)
    b_next = tl.load(p_tgt + stride_ts, mask=m_n, other=blank)
    m_skip_next = m_n & (b_next != blank) & (b_next != b_ext)
    m_blank = m_s & (b_ext == blank)
    m_lane0 = o_s == 0
    p_x = x_ptr + i_b * stride_xb + b_ext.to(tl.int64) * stride_xc
    p_lse = lse_ptr + i_b
    p_g = grad_ptr + i_b * stride_gb + b_ext.to(tl.int64) * stride_gc
    BK = tl.cast(B, tl.int64) * K  # 64-bit, as in ctc_alpha_kernel
    p_al = alpha_ptr + i_b * K + o_s

    # Class groups: count > 0 marks the first occurrence of a label (the group's size).
    o_l = i_b * S + o_s // 2
    b_count = tl.load(count_ptr + o_l, mask=m_lab, other=0)
    p_perm = perm_ptr + i_b * S + tl.load(pos_ptr + o_l, mask=m_lab, other=0)
    b_mult = tl.load(mult_ptr + i_b)
    m_write = m_s & (m_lane0 | (b_count > 0))
    # gamma of label position i: lane 2 i + 1 of the frame's gamma row.
    p_scr_lab = scratch_ptr + i_b * 4 * K + K + 1

    b_ll = -tl.load(loss_ptr + i_b)
    # Impossible alignment: the gradient stays as the dense pass left it (zero).
    n_t = tl.where(b_ll == NEG_INF, 0, b_T)
    p_scr = scratch_ptr + i_b * 4 * K + o_s
    p_scr1 = p_scr + 1
    p_scr2 = p_scr + 2
    m_s1 = o_s + 1 < K_b
    K2 = 2 * tl.cast(K, tl.int64)
    # A virtual frame T_b whose only finite state is the last one (bn = 0) makes
    # the recursion itself give beta'[T_b - 1] = 0 on the two final states and
    # -inf elsewhere (the blank before the last label cannot reach it).
    slot = (n_t % 2) * K2
    b_bn = tl.where(o_s == K_b - 1, 0.0, NEG_INF).to(ACC)
    tl.store(p_scr + slot, b_bn, mask=m_s)
    tl.debug_barrier()
    # Frame pointers step back one frame per iteration.
    p_al_t = p_al + n_t * BK
    p_x_t = p_x + n_t * stride_xt
    p_lse_t = p_lse + n_t * B
    p_g_t = p_g + n_t * stride_gt
    if DELAY:
        b_dp = tl.load(dp_ptr)
        b_half = (b_T - 1).to(tl.float64) * 0.5
    t = n_t
    for _ in range(0, n_t):
        t -= 1
        prev = slot
        slot = K2 - slot
        p_al_t -= BK
        p_x_t -= stride_xt
        p_lse_t -= B
        p_g_t -= stride_gt
        b_b1 = tl.load(p_scr1 + prev, mask=m_s1, other=NEG_INF)
        b_b2 = tl.load(p_scr2 + prev, mask=m_skip_next, other=NEG_INF)
        # Guarded logaddexp (see ctc_alpha_kernel).
        b_m = tl.maximum(tl.maximum(b_bn, b_b1), b_b2)
        none = b_m == NEG_INF
        b_sh = tl.where(none, 0.0, b_m)
        b_tot = tl.exp(b_bn - b_sh) + tl.exp(b_b1 - b_sh) + tl.exp(b_b2 - b_sh)
        b_beta = tl.where(none, NEG_INF, tl.log(tl.where(none, 1.0, b_tot)) + b_sh)

        b_alpha = tl.load(p_al_t, mask=m_s, other=NEG_INF)
        b_v = b_alpha + b_beta
        b_max = tl.reduce(b_v, 0, _MAX)
        # A feasible sequence has a finite state at every frame: b_max is finite.
        shift = tl.where(b_max == NEG_INF, 0.0, b_max)
        b_p = tl.exp(b_v - shift)
        b_gamma = b_p / tl.reduce(b_p, 0, _ADD)
        b_e = tl.load(p_x_t, mask=m_s, other=NEG_INF).to(ACC)
        if FUSED:  # a frame of -inf: -inf, not NaN (see ctc_normalizer_kernel)
            b_lse = tl.load(p_lse_t)
            b_e = tl.where(b_lse == NEG_INF, NEG_INF, b_e - b_lse)
        if DELAY:
            # rounded as in ctc_alpha_kernel (e + penalty, then the sum); the fused
            # gradient's softmax below takes b_e without it
            b_bn = (b_beta - shift) + (b_e + tl.where(m_lab, (b_dp * (b_half - t)).to(ACC), 0.0))
        else:
            b_bn = (b_beta - shift) + b_e
        tl.store(p_scr + slot, b_bn, mask=m_s)
        if b_mult > 1:
            tl.store(p_scr + (slot + K), b_gamma, mask=m_s)
        tl.debug_barrier()

        b_occ = b_gamma
        for j in range(1, b_mult):
            m_j = j < b_count
            i_other = tl.load(p_perm + j, mask=m_j, other=0)
            b_occ += tl.load(p_scr_lab + (slot + 2 * i_other.to(tl.int64)), mask=m_j, other=0.0)
        b_occ = tl.where(m_lane0, tl.reduce(tl.where(m_blank, b_gamma, 0.0), 0, _ADD), b_occ)
        if FUSED:
            b_g = tl.exp(b_e) - b_occ
        else:
            b_g = -b_occ
        tl.store(p_g_t, b_g, mask=m_write)


def _label_groups(targets: torch.Tensor, target_lengths: torch.Tensor, blank: int):
    """Per sequence, the target positions grouped by label, without a host sync.

    Returns ``perm (B, S)``: positions sorted by (label, position); ``pos (B, S)``:
    each position's index in ``perm``; ``count (B, S)``: the group's size at a
    label's first occurrence, else 0; ``mult (B,)``: the largest group. Padding and
    (unvalidated) blank ids belong to no group: blank is summed separately.
    """
    B, S = targets.shape
    device = targets.device
    ar = torch.arange(S, device=device)
    valid = (ar[None, :] < target_lengths[:, None]) & (targets != blank)
    key = torch.where(valid, targets + 1, 0) * S + ar[None, :]
    sorted_key, perm = torch.sort(key, dim=1)  # keys are distinct: any sort is stable
    lab = torch.div(sorted_key, S, rounding_mode="floor")
    head = torch.ones_like(valid)
    head[:, 1:] = lab[:, 1:] != lab[:, :-1]
    seg = torch.cumsum(head.long(), dim=1) - 1
    size = torch.zeros_like(seg).scatter_add_(1, seg, torch.ones_like(seg))
    first = torch.where(head & (lab > 0), size.gather(1, seg), 0)
    count = torch.zeros_like(seg).scatter_(1, perm, first)
    pos = torch.zeros_like(seg).scatter_(1, perm, ar[None, :].expand(B, S).contiguous())
    mult = count.amax(dim=1)
    i32 = torch.int32
    return (perm.to(i32).contiguous(), pos.to(i32).contiguous(), count.to(i32).contiguous(),
            mult.to(i32))


def ctc_loss_forward(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    fused_log_softmax: bool,
    compute_grad: bool,
    *,
    delay_penalty: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence CTC loss ``(B,)`` and gradient ``(T, B, C)``; see ``seqloss.ctc.reference``."""
    T, B, C = log_probs.shape
    device = log_probs.device
    fp64 = log_probs.dtype == torch.float64
    acc = torch.float64 if fp64 else torch.float32
    targets = targets.to(device=device, dtype=torch.int64)
    S = targets.shape[1]
    K = 2 * S + 1
    il = input_lengths.to(device=device, dtype=torch.int64).contiguous()
    tlen = target_lengths.to(device=device, dtype=torch.int64).contiguous()
    empty_grad = log_probs.new_empty(0)
    if B == 0 or T == 0:
        # Zero frames: loss 0 for an empty target (as -log 1), else impossible.
        loss = torch.where(tlen == 0, -0.0, float("inf")).to(acc)
        grad = log_probs.new_zeros((T, B, C)) if compute_grad else empty_grad
        return loss, grad

    guard = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with guard:
        block_k = max(16, triton.next_power_of_2(K))
        block_c = min(triton.next_power_of_2(C), 1024)
        block_r = max(1, min(64, 4096 // block_c))
        rows = triton.cdiv(T * B, block_r)
        sx = log_probs.stride()
        st = targets.stride()
        loss = torch.empty(B, dtype=acc, device=device)
        delay = delay_penalty != 0.0
        # float64 on the device whatever the accumulation dtype (a Python float argument
        # would be float32); a fill, no host-to-device copy.
        dpv = torch.full((1,), delay_penalty, dtype=torch.float64, device=device) if delay else loss
        lse = torch.empty((T, B), dtype=acc, device=device) if fused_log_softmax else loss
        if fused_log_softmax:
            ctc_normalizer_kernel[(rows,)](
                log_probs, il, lse, T, B, C, *sx,
                FP64=fp64, BLOCK_R=block_r, BLOCK_C=block_c,
            )
        alpha = torch.empty((T if compute_grad else 2, B, K), dtype=acc, device=device)
        warps = state_warps(block_k)
        ctc_alpha_kernel[(B,)](
            log_probs, lse, targets, il, tlen, alpha, loss, dpv, B, K, *sx, *st, blank,
            FUSED=fused_log_softmax, STORE_ALL=compute_grad, FP64=fp64, BLOCK_K=block_k,
            DELAY=delay, num_warps=warps,
        )
        if not compute_grad:
            return loss, empty_grad

        if fused_log_softmax:
            grad = torch.empty((T, B, C), dtype=log_probs.dtype, device=device)
            ctc_softmax_grad_kernel[(rows,)](
                log_probs, lse, il, loss, grad, T, B, C, *sx, *grad.stride(),
                FP64=fp64, BLOCK_R=block_r, BLOCK_C=block_c,
            )
        else:
            grad = torch.zeros((T, B, C), dtype=log_probs.dtype, device=device)
        if S > 0:
            perm, pos, count, mult = _label_groups(targets, tlen, blank)
        else:
            perm = pos = count = torch.zeros((B, 1), dtype=torch.int32, device=device)
            mult = torch.zeros(B, dtype=torch.int32, device=device)
        scratch = torch.empty((B, 2, 2, K), dtype=acc, device=device)
        ctc_beta_kernel[(B,)](
            log_probs, lse, targets, il, tlen, alpha, loss, scratch, grad,
            perm, pos, count, mult, dpv, B, S, K, *sx, *st, *grad.stride(), blank,
            FUSED=fused_log_softmax, FP64=fp64, BLOCK_K=block_k, DELAY=delay, num_warps=warps,
        )
    return loss, grad
