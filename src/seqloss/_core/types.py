"""Small shared types: reductions and backend names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

Reduction = Literal["none", "sum", "mean", "mean_batch", "mean_volume", "mean_target"]
TransducerReduction = Reduction
BackendName = Literal["auto", "reference", "numba", "triton"]

BACKENDS: tuple[str, ...] = ("reference", "numba", "triton")
# Every loss takes them all; "mean" is an alias whose meaning is the replaced library's
# (each loss names it: ``checks.check_reduction``). Formulas: ``reduce.weights``.
REDUCTIONS: tuple[str, ...] = ("none", "sum", "mean", "mean_batch", "mean_volume",
                               "mean_target")

# Lengths: an int32/int64 tensor, a numpy integer array or a sequence of ints (an
# int for unbatched input).
IntsLike = torch.Tensor | np.ndarray | Sequence[int] | int
