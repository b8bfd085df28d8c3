"""The rule of ``seqloss._core.logspace`` for a row of ``-inf``, for Numba kernels.

A row without a finite entry is a state with no way out: its log-normalizer is
``-inf`` and its log-probabilities are ``-inf``, not ``-inf - -inf`` = NaN. Kernels
that subtract a row's normalizer do it through ``sub_normalizer``.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(inline="always", cache=True, error_model="numpy")
def sub_normalizer(x, z):
    """``x - z`` for an entry ``x`` of a row of log-normalizer ``z``; ``-inf`` where
    ``z = -inf`` (every entry of the row is ``-inf``). NaN stays NaN."""
    return z if z == -np.inf else x - z
