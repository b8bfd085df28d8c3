"""Guarded log-space primitives (no epsilon: ``-inf`` is an exact zero)."""

from __future__ import annotations

import torch


def logaddexp(*xs: torch.Tensor) -> torch.Tensor:
    """``log(sum(exp(x)))`` elementwise over the arguments; all ``-inf`` gives ``-inf``.

    The shift is replaced by 0 where the maximum is ``-inf`` so that no
    ``-inf - -inf`` NaN appears; NaN and ``+inf`` propagate.
    """
    m = xs[0]
    for x in xs[1:]:
        m = torch.maximum(m, x)
    shift = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    total = torch.exp(xs[0] - shift)
    for x in xs[1:]:
        total = total + torch.exp(x - shift)
    return torch.log(total) + shift
