"""Numba CPU kernels (parallel over the batch); each module mirrors ``seqloss.reference.<family>``."""
