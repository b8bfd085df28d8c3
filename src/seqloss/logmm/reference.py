"""Pure-PyTorch ``logmmexp``: blocked over ``K`` (and ``M`` when needed), exact at any scale.

Every backend module of the family exposes the same two functions on 3-D inputs in
the accumulation dtype (float32, or float64 for float64 inputs):

* ``logmmexp_forward(a (B, M, K), b (B, K, N), compute_grad) -> (out (B, M, N), saved)``, with
  ``out[i, j] = logsumexp_k(a[i, k] + b[k, j])``, the value (and the ``+inf``/NaN
  behaviour) of ``torch.logsumexp(a[..., :, :, None] + b[..., None, :, :], -2)``;
  ``saved`` is a list of tensors the backend's backward reuses (``O(M K + K N)``,
  never ``O(M K N)``; empty unless ``compute_grad``), and ``saved_like(a, b)`` makes
  empty tensors of their shapes (for the fake kernel).
* ``logmmexp_backward(g, a, b, out, saved, need_a, need_b) -> (grad_a, grad_b)``, the
  softmax-weighted matmuls ``grad_a[i, k] = sum_j g[i, j] w[i, k, j]`` and
  ``grad_b[k, j] = sum_i g[i, j] w[i, k, j]`` with ``w = exp(a[i, k] + b[k, j] - out[i, j])``
  (each ``w <= 1``: no overflow). An entry with ``out = -inf`` (every term ``-inf``)
  passes no gradient, so ``-inf`` inputs get exactly zero gradient and no NaN. A
  gradient not needed may be returned empty.

Here the ``(B, M, K, N)`` broadcast is never built whole: each step holds one block of
at most ``_BLOCK`` elements (or one ``(N,)`` row when a row alone is larger), so the
extra memory is ``O(B M N)`` plus a constant, forward and backward.
"""

from __future__ import annotations

import torch
from torch import Tensor

_BLOCK = 1 << 21  # elements of one (Bb, Mb, Kb, N) broadcast block (8 MiB in float32)


def _tiles(B: int, M: int, K: int, N: int):
    """``(batch slice, row slice, K block size)`` covering ``(B, M)`` within ``_BLOCK``."""
    if B * M * N <= _BLOCK:
        yield slice(0, B), slice(0, M), max(1, _BLOCK // max(1, B * M * N))
        return
    Mb = max(1, _BLOCK // max(1, N))
    kb = max(1, _BLOCK // max(1, Mb * N))
    for i in range(B):
        for m0 in range(0, M, Mb):
            yield slice(i, i + 1), slice(m0, min(M, m0 + Mb)), kb


def saved_like(a: Tensor, b: Tensor) -> list[Tensor]:
    return []


def logmmexp_forward(a: Tensor, b: Tensor, compute_grad: bool) -> tuple[Tensor, list[Tensor]]:
    B, M, K = a.shape
    N = b.shape[2]
    out = a.new_full((B, M, N), float("-inf"))
    for bs, ms, kb in _tiles(B, M, K, N):
        acc = out[bs, ms]
        for k0 in range(0, K, kb):
            k1 = min(K, k0 + kb)
            t = a[bs, ms, k0:k1, None] + b[bs, None, k0:k1, :]  # (Bb, Mb, Kb, N)
            # torch's logsumexp and logaddexp are guarded: all -inf gives -inf, +inf
            # and NaN propagate as in one logsumexp over all of K.
            acc = torch.logaddexp(acc, torch.logsumexp(t, dim=2))
            del t
        out[bs, ms] = acc
    return out, []


def logmmexp_backward(
    g: Tensor, a: Tensor, b: Tensor, out: Tensor, saved: list[Tensor], need_a: bool,
    need_b: bool,
) -> tuple[Tensor, Tensor]:
    B, M, K = a.shape
    N = b.shape[2]
    grad_a = torch.zeros_like(a) if need_a else a.new_empty(0)
    grad_b = torch.zeros_like(b) if need_b else b.new_empty(0)
    # out = -inf means every term is -inf: subtracting +inf instead makes each
    # weight exp(-inf) = 0, not exp(-inf + inf) = NaN.
    o_safe = torch.where(out == float("-inf"), float("inf"), out)
    for bs, ms, kb in _tiles(B, M, K, N):
        o = o_safe[bs, ms, None, :]  # (Bb, Mb, 1, N)
        gg = g[bs, ms, None, :]
        for k0 in range(0, K, kb):
            k1 = min(K, k0 + kb)
            w = torch.exp(a[bs, ms, k0:k1, None] + b[bs, None, k0:k1, :] - o)
            w.mul_(gg)
            if need_a:
                grad_a[bs, ms, k0:k1] = w.sum(dim=3)
            if need_b:
                grad_b[bs, k0:k1, :] += w.sum(dim=1)
            del w
    return grad_a, grad_b
