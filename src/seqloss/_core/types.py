"""Small shared types: reductions and backend names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

Reduction = Literal["none", "sum", "mean"]
TransducerReduction = Literal["none", "sum", "mean", "mean_volume"]
BackendName = Literal["auto", "reference", "numba", "triton"]

BACKENDS: tuple[str, ...] = ("reference", "numba", "triton")
REDUCTIONS: tuple[str, ...] = ("none", "sum", "mean")
# NeMo's "mean_volume": sum_b loss_b / sum_b U_b (Parakeet models train with it).
TRANSDUCER_REDUCTIONS: tuple[str, ...] = (*REDUCTIONS, "mean_volume")

# Lengths: an int32/int64 tensor, a numpy integer array or a sequence of ints (an
# int for unbatched input).
IntsLike = torch.Tensor | np.ndarray | Sequence[int] | int
