"""Reused host memory for the large gradients the CPU kernels write.

A loss's gradient is as large as its logits (201 MB for a float32 joint of
B=8, T=150, U+1=41, V=1024) and written once per call. torch's CPU allocator hands
allocations of this size to ``mmap``, so each call's buffer is fresh memory: the first
touch of every 4 KiB page is a fault and a page of zeroes from the kernel, and that
costs more than the loss's own writes (35-60 ms of a 190-260 ms RNN-T or TDT call
there, measured in benchmarks/RESULTS.md). torch's CUDA caching allocator exists for
the same reason; on the host, :func:`empty` keeps the memory of the last large
gradients and gives it out again once nothing uses it.

"Nothing uses it" is decided by the storage, not by guesswork: a buffer is handed out
as ``torch.from_numpy`` of a numpy view made for that one loan, and torch's storage
holds that view alive for as long as any tensor (a view, ``.grad``, ``.numpy()``)
refers to the memory. A weak reference to the view tells when the loan has ended.
So a gradient the caller keeps is never reused under them; one they drop (the usual
``loss.backward()``, after the joint's backward has consumed it) is.

Memory: at most ``_MAX_KEPT`` buffers are tracked; the free ones stay resident
between calls (at most the largest recent gradients). A buffer more than
``_MAX_SLACK`` times the request is released instead of lent. ``SEQLOSS_REUSE_BUFFERS=0``
turns the reuse off (every call allocates, as torch does).
"""

from __future__ import annotations

import os
import threading
import weakref

import numpy as np
import torch

# Below this a fresh allocation is cheap (glibc's heap reuses it without new pages) and
# the bookkeeping (~3 us) would not pay for itself.
MIN_BYTES = 8 << 20
_MAX_KEPT = 2
_MAX_SLACK = 4

_ALIGN = 64  # torch's own CPU alignment: rows start on cache lines as in its tensors


class _Buffer:
    __slots__ = ("loan", "mem", "nbytes")

    def __init__(self, nbytes: int) -> None:
        raw = np.empty(nbytes + _ALIGN, np.uint8)
        off = -raw.ctypes.data % _ALIGN
        self.mem = raw[off : off + nbytes]
        self.nbytes = nbytes
        self.loan: weakref.ref | None = None

    def free(self) -> bool:
        return self.loan is None or self.loan() is None


_KEPT: list[_Buffer] = []
_LOCK = threading.Lock()


def _forget() -> None:
    # A forked child starts without the parent's buffers (their pages are shared
    # copy-on-write until written; the child's own writes would copy them anyway).
    global _LOCK
    _KEPT.clear()
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget)


def enabled() -> bool:
    return os.environ.get("SEQLOSS_REUSE_BUFFERS", "1") != "0"


def empty(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype,
          like: torch.Tensor | None = None) -> torch.Tensor:
    """An uninitialized CPU tensor of ``shape`` and ``dtype``, in reused memory when large.

    ``like``: give the result ``torch.empty_like(like)``'s strides (a dense layout of the
    same shape), else contiguous. Small tensors and unsupported dtypes are plain
    ``torch.empty``.
    """
    shape = tuple(shape)
    n = 1
    for s in shape:
        n *= s
    nbytes = n * dtype.itemsize
    if nbytes < MIN_BYTES or not dtype.is_floating_point or not enabled():
        return torch.empty_like(like, dtype=dtype) if like is not None else torch.empty(
            shape, dtype=dtype)
    with _LOCK:
        buf = None
        for b in _KEPT:
            if b.free() and nbytes <= b.nbytes and (
                    buf is None or b.nbytes < buf.nbytes):
                buf = b
        if buf is not None and buf.nbytes > _MAX_SLACK * nbytes:
            _KEPT.remove(buf)  # far too large for this call: release it
            buf = None
        if buf is None:
            # Free buffers too small for this request go; then the oldest loans stop
            # being tracked (their tensors free the memory as usual when dropped).
            _KEPT[:] = [b for b in _KEPT if not (b.free() and b.nbytes < nbytes)]
            while len(_KEPT) >= _MAX_KEPT:
                _KEPT.pop(0)
            buf = _Buffer(nbytes)
            _KEPT.append(buf)
        view = buf.mem[:nbytes]  # a new array object per loan: its life is the loan's
        buf.loan = weakref.ref(view)
        flat = torch.from_numpy(view).view(dtype)
    if like is not None and not like.is_contiguous():
        stride = torch.empty_like(like, device="meta").stride()
        return flat.as_strided(shape, stride)
    return flat.view(shape)


def kept_bytes() -> int:
    """Bytes of host memory held by the reuse, lent or free (for tests and diagnostics)."""
    with _LOCK:
        return sum(b.nbytes for b in _KEPT)
