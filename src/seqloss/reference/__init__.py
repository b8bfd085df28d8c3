"""Pure-PyTorch reference kernels: readable, float64-capable, any device.

They are the oracle's fast twin and the fallback when neither Numba nor Triton
applies. Each module exposes the same functions as the Numba and Triton kernels
of its family.
"""
