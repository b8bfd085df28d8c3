"""``seqloss.logmmexp``: checks, broadcasting of the leading dimensions, the op."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._core import checks as _validate
from .._core.dispatch import resolve_backend
from .._core.errors import InputError, InputTypeError
from .op import call_logmmexp


def logmmexp(a: Tensor, b: Tensor, *, backend: str = "auto") -> Tensor:
    r"""``log(exp(a) @ exp(b))``, exact and free of overflow and underflow at any scale.

    .. math::

        \mathrm{out}[\dots, i, j] = \log \sum_k \exp(a[\dots, i, k] + b[\dots, k, j])

    computed without ever forming the ``(..., M, K, N)`` broadcast: O(M·N) extra
    memory in the forward and the backward. It is the log-normalizer of an additive
    joint ``am[t] + lm[u]`` (the "simple" RNN-T loss). The usual shortcut
    ``log(exp(a - max a) @ exp(b - max b)) + max a + max b`` (k2, fast_rnnt, with
    ``finfo.tiny`` added before the log) is wrong where the two maxima sit at
    different ``k``: for ``a = [[0, -1000]]``, ``b = [[-1000], [0]]`` the true value
    is ``log 2 - 1000``; here it is exactly that.

    Args:
        a: ``(..., M, K)`` log-values, float16/bfloat16/float32/float64.
        b: ``(..., K, N)`` log-values of the same dtype and device. The leading
            dimensions broadcast against ``a``'s as in ``torch.matmul``.
        backend: ``"auto"``, ``"reference"``, ``"numba"`` or ``"triton"``.

    Returns:
        ``(..., M, N)`` in the inputs' dtype (accumulation in float32, float64 for
        float64 inputs). Values are those of
        ``torch.logsumexp(a[..., :, :, None] + b[..., None, :, :], dim=-2)``: an
        entry whose terms are all ``-inf`` is ``-inf`` (never NaN); ``+inf`` and NaN
        propagate as they would there.

    Gradients: ``d out[i, j] / d a[i, k] = exp(a[i, k] + b[k, j] - out[i, j])`` (a
    softmax over ``k``), so the backward is a pair of softmax-weighted matmuls;
    ``-inf`` entries get exactly zero gradient.

    Backends: reference (any device), numba (CPU), triton (CUDA).
    Properties: autograd (double backward raises), torch.compile (fullgraph).
    """
    _validate.check_float_tensor(a, "a")
    _validate.check_float_tensor(b, "b")
    if a.dim() < 2:
        raise InputError(f"a must have shape (..., M, K) (at least 2-D), got {tuple(a.shape)}")
    if b.dim() < 2:
        raise InputError(f"b must have shape (..., K, N) (at least 2-D), got {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise InputTypeError(f"a and b must have the same dtype, got a {a.dtype} and b {b.dtype}")
    if a.device != b.device:
        raise InputError(f"a is on {a.device}, b on {b.device}: expected one device")
    M, K = a.shape[-2], a.shape[-1]
    if b.shape[-2] != K:
        raise InputError(
            f"b.size(-2) = {b.shape[-2]} must equal a.size(-1) = {K} (a is (..., M, K) "
            f"{tuple(a.shape)}, b is (..., K, N) {tuple(b.shape)})"
        )
    N = b.shape[-1]
    try:
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except RuntimeError:
        raise InputError(
            f"the leading dimensions of a {tuple(a.shape[:-2])} and b {tuple(b.shape[:-2])} "
            "do not broadcast"
        ) from None
    name = resolve_backend(backend, a.device)
    Bf = math.prod(batch)
    a3 = a.expand(*batch, M, K).reshape(Bf, M, K)  # a view unless a is broadcast
    b3 = b.expand(*batch, K, N).reshape(Bf, K, N)
    out = call_logmmexp(a3, b3, name)
    return out.reshape(*batch, M, N).to(a.dtype)
