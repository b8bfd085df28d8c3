"""``logmmexp`` with Triton: CUDA, or CPU under TRITON_INTERPRET=1.

Same functions and contract as ``reference.py``. Tiled like a matmul, exact like
flash-attention's softmax: a program owns one ``(BLOCK_M, BLOCK_N)`` tile of the
output and walks ``K`` in blocks of ``BLOCK_K``; each step forms the
``(BLOCK_M, BLOCK_K, BLOCK_N)`` block of sums ``a[i, k] + b[k, j]`` in registers,
takes its maximum over ``k`` and folds it into a running maximum and a running sum
of exponentials rescaled to it (an online log-sum-exp per entry). So every term is
exponentiated relative to its own entry's maximum: nothing underflows that matters
and nothing overflows, at any input scale, in ``O(M N)`` memory.

The backward is two launches of the same shape, the softmax-weighted matmuls
``grad_a[i, k] = sum_j g[i, j] exp(a[i, k] + b[k, j] - out[i, j])`` (a program per
``(i, k)`` tile, walking ``N``) and ``grad_b[k, j] = sum_i ...`` (a program per
``(k, j)`` tile, walking ``M``); every weight is ``<= 1``.

Race-free by construction: each program writes only its own output tile, once,
and reads nothing any program writes (no atomics, no scratch), so the results do
not depend on the schedule (bit-deterministic).
"""

# No ``from __future__ import annotations``: the interpreter of triton < 3.2 takes a
# parameter for ``tl.constexpr`` only when its annotation is the object itself.
import contextlib

import torch
import triton
import triton.language as tl

from .._core import triton_compat  # noqa: F401 -- the interpreter fixes, before any launch


@triton.jit
def _batch_and_tile(n_tiles):
    """``(batch index, tile index)`` of this program, in 64 bits.

    One grid axis for both: CUDA's ``y`` axis stops at 65,535 and a leading batch of
    ``logmmexp`` may be larger (``x`` takes ``2**31 - 1``). 64-bit, so that every offset
    formed from them is too (a ``(B, M, K)`` operand may pass ``2**31`` elements).
    """
    pid = tl.program_id(0).to(tl.int64)
    return pid // n_tiles, pid % n_tiles


@triton.jit
def _finite_or_zero(x):
    return tl.where((x > float("-inf")) & (x < float("inf")), x, 0.0)


@triton.jit
def logmm_forward_kernel(
    a_ptr, b_ptr, out_ptr,
    M, K, N,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    n_tiles_n, n_tiles,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program ``i_b * n_tiles + tile``: ``out[i_b]`` on one ``(BLOCK_M, BLOCK_N)`` tile.

    Updates:
        out (B, M, N), contiguous: ``logsumexp_k(a[i_b, i, k] + b[i_b, k, j])``.
    """
    i_b, i_t = _batch_and_tile(n_tiles)
    i_m = i_t // n_tiles_n
    i_n = i_t % n_tiles_n
    acc = out_ptr.dtype.element_ty
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K).to(tl.int64)  # k0 + o_k: 64-bit offsets
    m_m = o_m < M
    m_n = o_n < N
    p_a = a_ptr + i_b * stride_ab + o_m[:, None] * stride_am
    p_b = b_ptr + i_b * stride_bb + o_n[None, :] * stride_bn
    # Running maximum (may be -inf: no term yet) and the sum of exp(x - shift), with
    # shift = the maximum where finite, else 0 (so -inf - -inf never appears; a +inf
    # or NaN term makes the sum +inf or NaN, as torch.logsumexp's result).
    b_max = tl.full((BLOCK_M, BLOCK_N), float("-inf"), acc)
    b_shift = tl.zeros((BLOCK_M, BLOCK_N), acc)
    b_sum = tl.zeros((BLOCK_M, BLOCK_N), acc)
    for k0 in range(0, K, BLOCK_K):
        m_k = (k0 + o_k) < K
        # Masked lanes load -inf: a -inf term adds exp(-inf) = 0.
        b_a = tl.load(p_a + (k0 + o_k)[None, :] * stride_ak, mask=m_m[:, None] & m_k[None, :],
                      other=float("-inf")).to(acc)
        b_bk = tl.load(p_b + (k0 + o_k)[:, None] * stride_bk, mask=m_k[:, None] & m_n[None, :],
                       other=float("-inf")).to(acc)
        b_x = b_a[:, :, None] + b_bk[None, :, :]  # (BLOCK_M, BLOCK_K, BLOCK_N)
        b_new = tl.maximum(b_max, tl.max(b_x, axis=1))
        b_new_shift = _finite_or_zero(b_new)
        # Rescale the old sum; it is 0 while the old maximum is -inf (no exp(+big)).
        b_alpha = tl.where(b_max > float("-inf"), tl.exp(b_shift - b_new_shift), 0.0)
        b_sum = b_sum * b_alpha + tl.sum(tl.exp(b_x - b_new_shift[:, None, :]), axis=1)
        b_max = b_new
        b_shift = b_new_shift
    b_out = tl.log(b_sum) + b_shift  # log(0) = -inf where every term is -inf
    p_out = out_ptr + (i_b * M + o_m[:, None]) * N + o_n[None, :]
    tl.store(p_out, b_out, mask=m_m[:, None] & m_n[None, :])


@triton.jit
def logmm_backward_a_kernel(
    g_ptr, a_ptr, b_ptr, out_ptr, ga_ptr,
    M, K, N,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    n_tiles_k, n_tiles,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program ``i_b * n_tiles + tile``: ``grad_a[i_b]`` on one ``(BLOCK_M, BLOCK_K)`` tile.

    Updates:
        ga (B, M, K), contiguous: ``sum_j g[i, j] exp(a[i, k] + b[k, j] - out[i, j])``.
    """
    i_b, i_t = _batch_and_tile(n_tiles)
    i_m = i_t // n_tiles_k
    i_k = i_t % n_tiles_k
    acc = ga_ptr.dtype.element_ty
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_k = i_k * BLOCK_K + tl.arange(0, BLOCK_K)
    o_n = tl.arange(0, BLOCK_N).to(tl.int64)  # n0 + o_n: 64-bit offsets
    m_m = o_m < M
    m_k = o_k < K
    b_a = tl.load(a_ptr + i_b * stride_ab + o_m[:, None] * stride_am + o_k[None, :] * stride_ak,
                  mask=m_m[:, None] & m_k[None, :], other=float("-inf")).to(acc)
    b_ga = tl.zeros((BLOCK_M, BLOCK_K), acc)
    for n0 in range(0, N, BLOCK_N):
        m_n = (n0 + o_n) < N
        m_mn = m_m[:, None] & m_n[None, :]
        b_bk = tl.load(b_ptr + i_b * stride_bb + o_k[:, None] * stride_bk
                       + (n0 + o_n)[None, :] * stride_bn,
                       mask=m_k[:, None] & m_n[None, :], other=float("-inf")).to(acc)
        p_mn = (i_b * M + o_m[:, None]) * N + n0 + o_n[None, :]
        # out = -inf (every term -inf, or a masked lane): subtract +inf instead, so the
        # weight is exp(-inf) = 0, not NaN.
        b_o = tl.load(out_ptr + p_mn, mask=m_mn, other=float("-inf")).to(acc)
        b_o = tl.where(b_o == float("-inf"), float("inf"), b_o)
        b_g = tl.load(g_ptr + p_mn, mask=m_mn, other=0.0).to(acc)
        b_w = tl.exp(b_a[:, :, None] + b_bk[None, :, :] - b_o[:, None, :])
        b_ga += tl.sum(b_w * b_g[:, None, :], axis=2)
    tl.store(ga_ptr + (i_b * M + o_m[:, None]) * K + o_k[None, :], b_ga,
             mask=m_m[:, None] & m_k[None, :])


@triton.jit
def logmm_backward_b_kernel(
    g_ptr, a_ptr, b_ptr, out_ptr, gb_ptr,
    M, K, N,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    n_tiles_n, n_tiles,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program ``i_b * n_tiles + tile``: ``grad_b[i_b]`` on one ``(BLOCK_K, BLOCK_N)`` tile.

    Updates:
        gb (B, K, N), contiguous: ``sum_i g[i, j] exp(a[i, k] + b[k, j] - out[i, j])``.
    """
    i_b, i_t = _batch_and_tile(n_tiles)
    i_k = i_t // n_tiles_n
    i_n = i_t % n_tiles_n
    acc = gb_ptr.dtype.element_ty
    o_k = i_k * BLOCK_K + tl.arange(0, BLOCK_K)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_m = tl.arange(0, BLOCK_M).to(tl.int64)  # m0 + o_m: 64-bit offsets
    m_k = o_k < K
    m_n = o_n < N
    b_bk = tl.load(b_ptr + i_b * stride_bb + o_k[:, None] * stride_bk + o_n[None, :] * stride_bn,
                   mask=m_k[:, None] & m_n[None, :], other=float("-inf")).to(acc)
    b_gb = tl.zeros((BLOCK_K, BLOCK_N), acc)
    for m0 in range(0, M, BLOCK_M):
        m_m = (m0 + o_m) < M
        m_mn = m_m[:, None] & m_n[None, :]
        b_a = tl.load(a_ptr + i_b * stride_ab + (m0 + o_m)[:, None] * stride_am
                      + o_k[None, :] * stride_ak,
                      mask=m_m[:, None] & m_k[None, :], other=float("-inf")).to(acc)
        p_mn = (i_b * M + m0 + o_m[:, None]) * N + o_n[None, :]
        b_o = tl.load(out_ptr + p_mn, mask=m_mn, other=float("-inf")).to(acc)
        b_o = tl.where(b_o == float("-inf"), float("inf"), b_o)
        b_g = tl.load(g_ptr + p_mn, mask=m_mn, other=0.0).to(acc)
        b_w = tl.exp(b_a[:, :, None] + b_bk[None, :, :] - b_o[:, None, :])
        b_gb += tl.sum(b_w * b_g[:, None, :], axis=0)
    tl.store(gb_ptr + (i_b * K + o_k[:, None]) * N + o_n[None, :], b_gb,
             mask=m_k[:, None] & m_n[None, :])


def _device_guard(x: torch.Tensor):
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _blocks(dtype: torch.dtype) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_K, BLOCK_N, num_warps)``: a 3-D register block of 4096 (float64: 2048)."""
    if dtype == torch.float64:
        return 16, 8, 16, 4
    return 32, 4, 32, 4


def saved_like(a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
    return []


def logmmexp_forward(a: torch.Tensor, b: torch.Tensor,
                     compute_grad: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    B, M, K = a.shape
    N = b.shape[2]
    out = torch.empty((B, M, N), dtype=a.dtype, device=a.device)
    if out.numel() == 0:
        return out, []
    BM, BK, BN, warps = _blocks(a.dtype)
    tiles_n = triton.cdiv(N, BN)
    with _device_guard(a):
        tiles = triton.cdiv(M, BM) * tiles_n
        logmm_forward_kernel[(tiles * B,)](
            a, b, out, M, K, N, *a.stride(), *b.stride(), tiles_n, tiles,
            BLOCK_M=BM, BLOCK_K=BK, BLOCK_N=BN, num_warps=warps,
        )
    return out, []


def logmmexp_backward(
    g: torch.Tensor, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
    saved: list[torch.Tensor], need_a: bool, need_b: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    B, M, K = a.shape
    N = b.shape[2]
    ga = torch.empty((B, M, K), dtype=a.dtype, device=a.device) if need_a else a.new_empty(0)
    gb = torch.empty((B, K, N), dtype=b.dtype, device=b.device) if need_b else b.new_empty(0)
    if B * M * K * N == 0:
        return (ga.zero_() if need_a else ga), (gb.zero_() if need_b else gb)
    g = g.contiguous()
    out = out.contiguous()
    BM, BK, BN, warps = _blocks(a.dtype)
    with _device_guard(a):
        if need_a:
            tiles_k = triton.cdiv(K, BK)
            tiles = triton.cdiv(M, BM) * tiles_k
            logmm_backward_a_kernel[(tiles * B,)](
                g, a, b, out, ga, M, K, N, *a.stride(), *b.stride(), tiles_k, tiles,
                BLOCK_M=BM, BLOCK_K=BK, BLOCK_N=BN, num_warps=warps,
            )
        if need_b:
            tiles_n = triton.cdiv(N, BN)
            tiles = triton.cdiv(K, BK) * tiles_n
            logmm_backward_b_kernel[(tiles * B,)](
                g, a, b, out, gb, M, K, N, *a.stride(), *b.stride(), tiles_n, tiles,
                BLOCK_M=BM, BLOCK_K=BK, BLOCK_N=BN, num_warps=warps,
            )
    return ga, gb
