"""Small shared types: reductions and backend names."""

from __future__ import annotations

from typing import Literal

Reduction = Literal["none", "sum", "mean"]
BackendName = Literal["auto", "reference", "numba", "triton"]

BACKENDS: tuple[str, ...] = ("reference", "numba", "triton")
REDUCTIONS: tuple[str, ...] = ("none", "sum", "mean")
