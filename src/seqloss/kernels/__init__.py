"""Compiled backends: Numba on CPU, Triton on CUDA; each imported lazily by ``_dispatch``."""
