"""A written-out ``exp`` (and ``log1p(exp(d))``) for Numba kernels whose loops must vectorize.

The installed llvmlite has no vector math library: ``math.exp`` in a loop is a scalar
libm call (~10x slower than torch's vectorized one). ``vexp`` is Cody-Waite reduction, a
Taylor polynomial and the exponent built from the integer bits, branch-free, in the
argument's own precision (float32: 16 lanes under AVX-512): float32 to ~2 ulp, float64
to ~1 ulp (``tests/test_transducer_kernels.py``), exactly 0 below the dtype's normal range and
for ``-inf``, NaN for NaN.

``seqloss.ctc.numba_cpu._exp`` is the float64 polynomial with the 1.5 * 2**52 shift for the
rounding (valid only without "reassoc"; NaN gives 0): kept there as it is, so that CTC's
results and compile cache do not change.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

# float32
_L2E_F = np.float32(1.4426950408889634)
_LN2HI_F = np.float32(0.693359375)  # few mantissa bits: n * _LN2HI_F is exact
_LN2LO_F = np.float32(-2.12194440e-4)
_MIN_F = np.float32(-87.3)  # exp below is subnormal or 0 in float32
# float64
_L2E = 1.4426950408889634
_LN2HI = 0.6931471803691238
_LN2LO = 1.9082149292705877e-10
_MIN = -708.0

@njit(inline="always", cache=True, error_model="numpy")
def _exp_f32(x):
    xx = max(x, _MIN_F)
    # floor, not the 1.5 * 2**23 shift: the shift's rounding does not survive "reassoc".
    n = np.floor(xx * _L2E_F + np.float32(0.5))
    r = xx - n * _LN2HI_F
    r = r - n * _LN2LO_F
    p = np.float32(1.0) + r * (np.float32(1.0) + r * (np.float32(0.5) + r * (
        np.float32(1.0 / 6) + r * (np.float32(1.0 / 24) + r * (np.float32(1.0 / 120) + r * (
            np.float32(1.0 / 720) + r * np.float32(1.0 / 5040)))))))
    scale = np.int32((np.int32(n) + 127) << 23).view(np.float32)
    # NaN stays NaN (a caller can check a sum of them), -inf gives exactly 0.
    return p * scale if x >= _MIN_F else (np.float32(0.0) if x < _MIN_F else x)


@njit(inline="always", cache=True, error_model="numpy")
def _exp_f64(x):
    xx = max(x, _MIN)
    n = np.floor(xx * _L2E + 0.5)
    r = xx - n * _LN2HI
    r = r - n * _LN2LO
    p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r * (
        1.0 / 720 + r * (1.0 / 5040 + r * (1.0 / 40320 + r * (1.0 / 362880 + r * (
            1.0 / 3628800 + r * (1.0 / 39916800 + r * (1.0 / 479001600))))))))))))
    scale = np.int64((np.int64(n) + 1023) << 52).view(np.float64)
    return p * scale if x >= _MIN else (0.0 if x < _MIN else x)


def vexp(x):
    """``exp`` in the argument's own precision (Numba only)."""
    raise NotImplementedError


@overload(vexp)
def _exp_impl(x):
    # Not inline="always": Numba's inliner then warns on the branches (LLVM inlines it).
    if x == types.float32:
        return lambda x: _exp_f32(x)
    return lambda x: _exp_f64(x)


@njit(inline="always", cache=True, error_model="numpy")
def vlog1pexp(d):
    """``log1p(exp(d))`` for float64 ``d <= 0`` (the correction of a logaddexp),
    branch-free so a loop of them vectorizes: ``y = exp(d)`` in ``(0, 1]``, then
    ``log1p(y) = 2 atanh(s)``, ``s = y / (2 + y)`` in ``[0, 1/3]``, by its odd series to
    ``s**33`` (truncation below 2e-17 relative). Within a few ulp of libm's; exactly 0
    for ``d = -inf``, NaN for NaN (Numba only)."""
    y = _exp_f64(d)
    s = y / (2.0 + y)
    z = s * s
    p = 1.0 / 33
    for k in range(15, 0, -1):  # unrolled by LLVM: constant trip count
        p = 1.0 / (2 * k + 1) + z * p
    return 2.0 * (s + s * z * p)
