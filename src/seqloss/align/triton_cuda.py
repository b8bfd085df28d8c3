"""CTC Viterbi forced alignment with Triton: CUDA, or CPU under TRITON_INTERPRET=1.

Two launches, one program per sequence: the forward max
recursion, which stores int8 backpointers, then the backtrack, a scalar loop
of ``O(T + U)`` steps. The arithmetic (one addition per arc, exact
comparisons, float32 or float64) is the reference backend's, so the results
agree bit for bit.

Synchronisation inside a program: the lanes of a program hold one state each;
a state's predecessors live in other lanes, so the previous step's values go
through a global scratch row. The row is double-buffered by step parity and
one ``tl.debug_barrier()`` sits between its store and the shifted loads: the
next step stores to the other buffer, and the step after that stores to this
one only after passing the next barrier, by which time every lane has loaded.
Programs share nothing but read-only inputs.
"""

# No ``from __future__ import annotations``: the interpreter of triton < 3.2 takes a
# parameter for ``tl.constexpr`` only when its annotation is the object itself.
import contextlib

import torch
import triton
import triton.language as tl

from .._core import triton_compat  # noqa: F401 -- the interpreter fixes, before any launch


@triton.jit
def ctc_align_forward_kernel(
    lp_ptr, tg_ptr, il_ptr, tl_ptr, scratch_ptr, bp_ptr, final_ptr,
    stride_lt, stride_lb, stride_lc, stride_tb,
    B, K, blank,
    BLOCK_K: tl.constexpr,
):
    """Program ``i_b``: the CTC max recursion of sequence ``i_b``.

    Updates:
        bp (T, B, K) int8: backpointer offsets (0, 1, 2) for frames ``1 <= t < T_b``.
        final (B, BLOCK_K): ``delta[T_b - 1, s]``.
    """
    i_b = tl.program_id(0).to(tl.int64)
    T_b = tl.load(il_ptr + i_b)
    L = tl.load(tl_ptr + i_b)
    acc = scratch_ptr.dtype.element_ty
    o_s = tl.arange(0, BLOCK_K)
    m_s = o_s < 2 * L + 1
    odd = (o_s % 2) == 1
    m_lab = m_s & odd
    b_lab = tl.load(tg_ptr + i_b * stride_tb + o_s // 2, mask=m_lab, other=0)
    b_lab = tl.where(odd, b_lab, blank)
    b_prev = tl.load(tg_ptr + i_b * stride_tb + o_s // 2 - 1, mask=m_lab & (o_s >= 3), other=-1)
    # The skip s-2 -> s exists into a label that differs from the previous label.
    m_skip = m_lab & (o_s >= 3) & (b_lab != b_prev)
    p_lp = lp_ptr + i_b * stride_lb + b_lab.to(tl.int64) * stride_lc
    n_init = tl.where(T_b > 0, 2, 0)  # frame 0 holds states 0 and 1
    b_delta = tl.load(p_lp, mask=m_s & (o_s < n_init), other=float("-inf")).to(acc)
    for t in range(1, T_b):
        p_row = scratch_ptr + (((t - 1) % 2) * B + i_b) * BLOCK_K
        tl.store(p_row + o_s, b_delta)
        tl.debug_barrier()
        b_x1 = tl.load(p_row + o_s - 1, mask=o_s >= 1, other=float("-inf"))
        b_x2 = tl.load(p_row + o_s - 2, mask=m_skip, other=float("-inf"))
        # torchaudio's order: s-2 only if strictly greater than both, else s-1 if
        # strictly greater than s, else s.
        take2 = (b_x2 > b_x1) & (b_x2 > b_delta)
        # ``take2 == 0``, not ``~take2``: the interpreter of triton <= 3.3 has no
        # int1 type for ``~`` on a boolean block.
        take1 = (take2 == 0) & (b_x1 > b_delta)
        b_best = tl.where(take2, b_x2, tl.where(take1, b_x1, b_delta))
        b_bp = tl.where(take2, 2, tl.where(take1, 1, 0)).to(tl.int8)
        tl.store(bp_ptr + (t * B + i_b) * K + o_s, b_bp, mask=m_s)
        b_e = tl.load(p_lp + t * stride_lt, mask=m_s, other=float("-inf")).to(acc)
        b_delta = b_best + b_e
    tl.store(final_ptr + i_b * BLOCK_K + o_s, b_delta)


@triton.jit
def ctc_align_backtrack_kernel(
    lp_ptr, tg_ptr, il_ptr, tl_ptr, bp_ptr, final_ptr, labels_ptr, scores_ptr,
    stride_lt, stride_lb, stride_lc, stride_tb,
    B, T, K, blank,
    BLOCK_K: tl.constexpr,
):
    """Program ``i_b``: follow sequence ``i_b``'s backpointers from its final state.

    Updates:
        labels (B, T), scores (B, T): frames ``t < T_b`` (the rest keep their fill).
    """
    i_b = tl.program_id(0).to(tl.int64)
    T_b = tl.load(il_ptr + i_b)
    L = tl.load(tl_ptr + i_b)
    acc = scores_ptr.dtype.element_ty
    p_fin = final_ptr + i_b * BLOCK_K
    d_blank = tl.load(p_fin + 2 * L)
    d_label = tl.load(p_fin + 2 * L - 1, mask=L > 0, other=float("-inf"))
    # End on the last label unless the final blank is strictly greater.
    end_blank = (L == 0) | (d_blank > d_label)
    s = tl.where(end_blank, 2 * L, 2 * L - 1)
    found = tl.where(end_blank, d_blank, d_label) > float("-inf")
    for i in range(0, T_b):
        t = T_b - 1 - i
        is_lab = (s % 2) == 1
        lab = tl.load(tg_ptr + i_b * stride_tb + s // 2, mask=is_lab, other=0)
        lab = tl.where(is_lab, lab, blank)
        score = tl.load(lp_ptr + t * stride_lt + i_b * stride_lb + lab * stride_lc).to(acc)
        tl.store(labels_ptr + i_b * T + t, tl.where(found, lab, blank))
        tl.store(scores_ptr + i_b * T + t, tl.where(found, score, float("-inf")))
        step = tl.load(bp_ptr + (t * B + i_b) * K + s, mask=t > 0, other=0)
        s = s - step.to(tl.int64)


def _device_guard(x: torch.Tensor):
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _warps(block: int) -> int:
    return max(1, min(8, block // 128))


def ctc_align_forward(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`seqloss.align.reference.ctc_align_forward`."""
    T, B, C = log_probs.shape
    device = log_probs.device
    acc = torch.float64 if log_probs.dtype == torch.float64 else torch.float32
    labels = torch.full((B, T), blank, dtype=torch.int64, device=device)
    scores = torch.zeros((B, T), dtype=acc, device=device)
    if T == 0 or B == 0:
        return labels, scores
    S = targets.shape[1]
    K = 2 * S + 1
    BLOCK_K = triton.next_power_of_2(K)
    tg = targets.contiguous()
    il = input_lengths.to(device=device, dtype=torch.int64).contiguous()
    tlen = target_lengths.to(device=device, dtype=torch.int64).contiguous()
    scratch = torch.empty((2, B, BLOCK_K), dtype=acc, device=device)
    final = torch.empty((B, BLOCK_K), dtype=acc, device=device)
    bp = torch.empty((T, B, K), dtype=torch.int8, device=device)
    st, sb, sc = log_probs.stride()
    with _device_guard(log_probs):
        ctc_align_forward_kernel[(B,)](
            log_probs, tg, il, tlen, scratch, bp, final,
            st, sb, sc, tg.stride(0), B, K, blank,
            BLOCK_K=BLOCK_K, num_warps=_warps(BLOCK_K),
        )
        ctc_align_backtrack_kernel[(B,)](
            log_probs, tg, il, tlen, bp, final, labels, scores,
            st, sb, sc, tg.stride(0), B, T, K, blank,
            BLOCK_K=BLOCK_K, num_warps=1,
        )
    return labels, scores
