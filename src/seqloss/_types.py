"""Small shared types: reductions and backend names."""

from __future__ import annotations

from typing import Literal

Reduction = Literal["none", "sum", "mean"]
TransducerReduction = Literal["none", "sum", "mean", "mean_volume"]
BackendName = Literal["auto", "reference", "numba", "triton"]

BACKENDS: tuple[str, ...] = ("reference", "numba", "triton")
REDUCTIONS: tuple[str, ...] = ("none", "sum", "mean")
# NeMo's "mean_volume": sum_b loss_b / sum_b U_b (Parakeet models train with it).
TRANSDUCER_REDUCTIONS: tuple[str, ...] = (*REDUCTIONS, "mean_volume")
